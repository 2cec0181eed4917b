#include "worker/model/cuda_forward.hpp"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/bias_add.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dequantize.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/kv_write.cuh"
#include "kernels/cuda/paged_attention.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "worker/model/llama_model.hpp"

namespace sy {
namespace {

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// A device allocation owned by one object (freed on destruction).
template <class T>
struct dbuf {
  T* p = nullptr;
  size_t n = 0;
  dbuf() = default;
  explicit dbuf(size_t count) { alloc(count); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  dbuf(dbuf&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr, o.n = 0; }
  dbuf& operator=(dbuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~dbuf() {
    if (p) cudaFree(p);
  }
  void alloc(size_t count) {
    if (p) cudaFree(p);
    p = nullptr;
    n = count;
    if (count == 0) return;
    const cudaError_t e = cudaMalloc(&p, count * sizeof(T));
    if (e != cudaSuccess) {
      p = nullptr;
      n = 0;
      size_t free_b = 0, total_b = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_b, &total_b);
      throw std::runtime_error("cuda_forward: out of device memory: cannot allocate " + mib(count * sizeof(T)) + " (" +
                               mib(free_b) + " free of " + mib(total_b) + "): " + cudaGetErrorString(e));
    }
  }
  size_t bytes() const { return n * sizeof(T); }
};

// Pinned host memory owned by one object (the staging side of every per-step copy).
template <class T>
struct hbuf {
  T* p = nullptr;
  size_t n = 0;
  hbuf() = default;
  hbuf(const hbuf&) = delete;
  hbuf& operator=(const hbuf&) = delete;
  ~hbuf() {
    if (p) cudaFreeHost(p);
  }
  void alloc(size_t count) {
    if (p) cudaFreeHost(p);
    p = nullptr;
    n = 0;
    if (count == 0) return;
    const cudaError_t e = cudaMallocHost(&p, count * sizeof(T));
    if (e != cudaSuccess) {
      p = nullptr;
      cudaGetLastError();
      throw std::runtime_error("cuda_forward: cannot allocate " + mib(count * sizeof(T)) +
                               " of pinned host memory: " + cudaGetErrorString(e));
    }
    n = count;
  }
};

// A linear layer: y[N][rows] = x[N][cols] W^T with W row-major [rows][cols] in fp16.
struct dlinear {
  dbuf<__half> w;
  int64_t rows = 0, cols = 0;
};

// The decode path's batch-size buckets: powers of two up to this.
constexpr int32_t k_max_bucket = 256;
// cuBLAS workspace, set explicitly so that captured GEMMs and eager ones use the same buffer (and
// the same kernels) and a capture never allocates.
constexpr size_t k_blas_workspace_bytes = size_t{32} << 20;

// A row not sampled here gets a greedy placeholder: it goes back to the host anyway.
cuda::device_sampling to_device(const row_sampling& r) { return r.on_backend ? r.draw : cuda::device_sampling{}; }

}  // namespace

struct cuda_forward::impl {
  const llama_model& model;
  cuda_forward_config cfg;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  size_t weight_bytes = 0;

  // token_embd.weight as stored in the file (any weight type): the gather dequantizes the step's
  // rows to fp32 exactly as llama_model::embed does. A tied output head has its own fp16 copy.
  dbuf<uint8_t> embd;
  cpu::weight_type embd_type = cpu::weight_type::f32;
  struct layer {
    dbuf<float> attn_norm, ffn_norm;
    dbuf<float> bq, bk, bv;  // Q/K/V biases (qkv_bias), else empty
    dlinear wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  std::vector<layer> layers;
  dbuf<float> output_norm;
  dlinear output;
  dbuf<float> rope_factors;  // rope_freqs.weight (n_rot / 2 divisors), or empty
  cuda::rope_params rope;    // the model's RoPE, freq_factors pointing into rope_factors

  int32_t n_blocks = 0;
  std::vector<dbuf<__half>> k_cache, v_cache;  // per layer: [n_blocks * block_size][kv_dim]

  // Activations for up to n_tok_max tokens; logits and sampling for up to n_rows_max rows.
  int64_t n_tok_max = 0, n_rows_max = 0;
  dbuf<float> x, q, k, v, tmp, gate, up, logits;
  dbuf<__half> xn, attn, h, xo;
  dbuf<cuda::device_sampling> d_params;  // [n_rows_max]
  dbuf<int32_t> d_out_ids;               // [n_rows_max]
  dbuf<uint8_t> sample_ws;               // sample_tokens_workspace(n_rows_max, n_vocab)
  hbuf<cuda::device_sampling> h_params;
  hbuf<int32_t> h_out_ids;
  dbuf<uint8_t> blas_ws;

  // Ragged path metadata, uploaded from pinned host memory: ids | pos | seq | slots | tables.
  dbuf<int32_t> d_ids, d_pos, d_seq, d_slots, d_tables;
  hbuf<int32_t> h_meta;

  // Decode path: fixed buffers every bucket's launch sequence (and graph) reads.
  // dec_meta: ids | pos | seq | slots, bucket_max each, then block tables [bucket_max][table_width].
  std::vector<int32_t> buckets;  // 1, 2, 4, ..., bucket_max
  int64_t bucket_max = 0, table_width = 0;
  dbuf<int32_t> dec_meta;
  hbuf<int32_t> h_dec_meta;
  std::vector<cudaGraphExec_t> graphs;  // one per bucket while graphs are active; else empty
  std::string graph_note;               // why graphs are off, when they were asked for

  cuda_forward_counters counters;

  impl(const llama_model& m, cuda_forward_config c) : model(m), cfg(c) {}
  ~impl() {
    cudaSetDevice(cfg.device);
    for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
    if (stream) cudaStreamSynchronize(stream);
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
    // The buffers free themselves (members, destroyed after this body).
  }

  int32_t* dec_ids() const { return dec_meta.p; }
  int32_t* dec_pos() const { return dec_meta.p + bucket_max; }
  int32_t* dec_seq() const { return dec_meta.p + 2 * bucket_max; }
  int32_t* dec_slots() const { return dec_meta.p + 3 * bucket_max; }
  int32_t* dec_tables() const { return dec_meta.p + 4 * bucket_max; }

  // Raw GGUF bytes -> device (the tensor as stored).
  void upload_raw(dbuf<uint8_t>& d, const gguf::tensor_info& t) {
    d.alloc(t.n_bytes);
    SY_CUDA_CHECK(cudaMemcpyAsync(d.p, t.data, t.n_bytes, cudaMemcpyHostToDevice, stream));
    SY_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  // Raw GGUF bytes already on the device (`raw`, tensor t) -> fp16 [rows][cols].
  void dequantize_linear(dlinear& L, const gguf::tensor_info& t, const uint8_t* raw, int64_t rows, int64_t cols) {
    L.rows = rows;
    L.cols = cols;
    L.w.alloc(static_cast<size_t>(rows * cols));
    try {
      cuda::dequantize_to_f16(raw, to_weight_type(t), rows, cols, L.w.p, stream);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error("cuda_forward: tensor '" + t.name + "': " + e.what());
    }
    SY_CUDA_CHECK(cudaStreamSynchronize(stream));
    weight_bytes += L.w.bytes();
  }
  void upload_linear(dlinear& L, const gguf::tensor_info& t, int64_t rows, int64_t cols) {
    dbuf<uint8_t> raw;
    upload_raw(raw, t);
    dequantize_linear(L, t, raw.p, rows, cols);  // synchronizes: `raw` is freed next
  }
  void upload_vector(dbuf<float>& d, const std::vector<float>& h) {
    d.alloc(h.size());
    // On `stream`, not the legacy stream: the non-blocking stream that reads these does not wait for
    // it, and a pageable cudaMemcpy may return before its DMA has landed.
    SY_CUDA_CHECK(cudaMemcpyAsync(d.p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    SY_CUDA_CHECK(cudaStreamSynchronize(stream));
    weight_bytes += d.bytes();
  }

  void gemm(const dlinear& L, const __half* x_in, int64_t n_tok, float* y) {
    const float alpha = 1.f, beta = 0.f;
    // Column-major view: Y^T[rows][N] = W[rows][cols] (stored as cols x rows) ^T * X^T[cols][N].
    SY_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(L.rows), static_cast<int>(n_tok),
                                 static_cast<int>(L.cols), &alpha, L.w.p, CUDA_R_16F, static_cast<int>(L.cols), x_in,
                                 CUDA_R_16F, static_cast<int>(L.cols), &beta, y, CUDA_R_32F, static_cast<int>(L.rows),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void load(const llama_model& m);
  void allocate_buffers();
  void allocate_kv();
  cudaGraphExec_t capture_decode(int64_t B, std::string& why);
  void capture_graphs();

  void enqueue_layers(int64_t N, const int32_t* ids, const int32_t* pos, const int32_t* seq, const int32_t* slots,
                      const int32_t* tables, int64_t width);
  void enqueue_decode(int64_t B);
  void stage_decode_row(int64_t r, const batch_seq* b, const row_sampling* s);
  void upload_decode(int64_t B);
  void run_decode(std::span<const batch_seq> batch, std::span<const row_sampling> sampling, step_output& out);
  void run_ragged(std::span<const batch_seq> batch, std::span<const row_sampling> sampling, step_output& out);
  void fetch(int64_t n_rows, std::span<const row_sampling> sampling, bool sampled, step_output& out);
};

void cuda_forward::impl::load(const llama_model& m) {
  const llama_hparams& hp = m.hparams();
  const gguf::file& f = m.file();
  const int64_t E = hp.n_embd, KV = hp.kv_dim(), F = hp.n_ff;
  auto tensor = [&](const std::string& name) -> const gguf::tensor_info& {
    const gguf::tensor_info* t = f.find_tensor(name);
    if (!t) throw std::runtime_error("cuda_forward: missing tensor " + name);
    return *t;
  };
  const gguf::tensor_info& te = tensor("token_embd.weight");
  embd_type = to_weight_type(te);
  if (E % cpu::block_elements(embd_type) != 0)
    throw std::runtime_error("cuda_forward: token_embd.weight is " + std::string(cpu::weight_type_name(embd_type)) +
                             " with rows of " + std::to_string(E) + " elements, not a multiple of its block (" +
                             std::to_string(cpu::block_elements(embd_type)) + ")");
  upload_raw(embd, te);
  weight_bytes += embd.bytes();
  layers.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    layer& L = layers[static_cast<size_t>(i)];
    const llama_layer& cpu_l = m.layers()[static_cast<size_t>(i)];
    upload_vector(L.attn_norm, cpu_l.attn_norm);
    upload_vector(L.ffn_norm, cpu_l.ffn_norm);
    if (hp.qkv_bias) {
      if (cpu_l.bq.size() != static_cast<size_t>(E) || cpu_l.bk.size() != static_cast<size_t>(KV) ||
          cpu_l.bv.size() != static_cast<size_t>(KV))
        throw std::runtime_error("cuda_forward: layer " + std::to_string(i) + " lacks its Q/K/V biases");
      upload_vector(L.bq, cpu_l.bq);
      upload_vector(L.bk, cpu_l.bk);
      upload_vector(L.bv, cpu_l.bv);
    }
    upload_linear(L.wq, tensor(p + "attn_q.weight"), E, E);
    upload_linear(L.wk, tensor(p + "attn_k.weight"), KV, E);
    upload_linear(L.wv, tensor(p + "attn_v.weight"), KV, E);
    upload_linear(L.wo, tensor(p + "attn_output.weight"), E, E);
    upload_linear(L.w_gate, tensor(p + "ffn_gate.weight"), F, E);
    upload_linear(L.w_up, tensor(p + "ffn_up.weight"), F, E);
    upload_linear(L.w_down, tensor(p + "ffn_down.weight"), E, F);
  }
  upload_vector(output_norm, m.output_norm());
  // Tied embeddings: the output head is token_embd.weight, dequantized from the copy already here.
  if (f.find_tensor("output.weight"))
    upload_linear(output, tensor("output.weight"), hp.n_vocab, E);
  else
    dequantize_linear(output, te, embd.p, hp.n_vocab, E);

  rope.n_rot = hp.n_rot;
  rope.base = hp.rope_base;
  rope.freq_scale = hp.rope_freq_scale;
  rope.neox = hp.rope_neox;
  if (!hp.rope_freq_factors.empty()) {
    if (hp.rope_freq_factors.size() != static_cast<size_t>(hp.n_rot / 2))
      throw std::runtime_error("cuda_forward: rope_freqs.weight has " + std::to_string(hp.rope_freq_factors.size()) +
                               " values, RoPE rotates " + std::to_string(hp.n_rot / 2) + " pairs");
    upload_vector(rope_factors, hp.rope_freq_factors);
    rope.freq_factors = rope_factors.p;
  }
}

void cuda_forward::impl::allocate_buffers() {
  const llama_hparams& hp = model.hparams();
  const int64_t E = hp.n_embd, KV = hp.kv_dim(), F = hp.n_ff, V = hp.n_vocab;
  // Buckets: powers of two up to the first one that holds max_seqs_per_step (at most k_max_bucket).
  const int64_t want = std::clamp<int64_t>(cfg.max_seqs_per_step, 1, k_max_bucket);
  for (int32_t b = 1;; b *= 2) {
    buckets.push_back(b);
    if (b >= want) break;
  }
  bucket_max = buckets.back();
  table_width = cfg.max_blocks_per_seq > 0 ? cfg.max_blocks_per_seq
                                           : (hp.n_ctx_train + cfg.block_size - 1) / std::max(cfg.block_size, 1);
  n_tok_max = std::max<int64_t>(cfg.max_tokens_per_step, bucket_max);
  n_rows_max = std::max<int64_t>(cfg.max_seqs_per_step, bucket_max);

  const int64_t T = n_tok_max;
  x.alloc(T * E);
  q.alloc(T * E);
  tmp.alloc(T * E);
  k.alloc(T * KV);
  v.alloc(T * KV);
  gate.alloc(T * F);
  up.alloc(T * F);
  xn.alloc(T * E);
  attn.alloc(T * E);
  h.alloc(T * F);
  xo.alloc(static_cast<size_t>(n_rows_max * E));
  logits.alloc(static_cast<size_t>(n_rows_max * V));
  d_params.alloc(static_cast<size_t>(n_rows_max));
  d_out_ids.alloc(static_cast<size_t>(n_rows_max));
  sample_ws.alloc(cuda::sample_tokens_workspace(n_rows_max, V));
  h_params.alloc(static_cast<size_t>(n_rows_max));
  h_out_ids.alloc(static_cast<size_t>(n_rows_max));
  d_ids.alloc(static_cast<size_t>(T));
  d_pos.alloc(static_cast<size_t>(T));
  d_seq.alloc(static_cast<size_t>(T));
  d_slots.alloc(static_cast<size_t>(T));
  dec_meta.alloc(static_cast<size_t>(4 * bucket_max + bucket_max * table_width));
  h_dec_meta.alloc(dec_meta.n);
  blas_ws.alloc(k_blas_workspace_bytes);
  // After cublasSetStream, which resets the workspace to cuBLAS's own pool.
  SY_CUBLAS_CHECK(cublasSetWorkspace(blas, blas_ws.p, blas_ws.bytes()));
}

void cuda_forward::impl::allocate_kv() {
  const llama_hparams& hp = model.hparams();
  const size_t block_bytes = static_cast<size_t>(2 * hp.n_layer * cfg.block_size * hp.kv_dim()) * sizeof(__half);
  size_t free_b = 0, total_b = 0;
  SY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double asked = cfg.n_kv_blocks > 0
                           ? static_cast<double>(cfg.n_kv_blocks)
                           : cfg.kv_memory_fraction * static_cast<double>(free_b) / static_cast<double>(block_bytes);
  // Slots (block * block_size + offset) are int32 on the device.
  const double slot_limit = static_cast<double>(INT32_MAX / cfg.block_size);
  n_blocks = static_cast<int32_t>(std::min(asked, slot_limit));
  if (n_blocks < 1 || static_cast<size_t>(n_blocks) * block_bytes > free_b)
    throw std::runtime_error("cuda_forward: out of device memory: a KV arena of " + std::to_string(n_blocks) +
                             " blocks needs " + mib(static_cast<size_t>(std::max(n_blocks, 1)) * block_bytes) + "; " +
                             mib(free_b) + " of " + mib(total_b) + " are free after " + mib(weight_bytes) +
                             " of weights and the step buffers");
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    k_cache.emplace_back(static_cast<size_t>(n_blocks) * cfg.block_size * hp.kv_dim());
    v_cache.emplace_back(static_cast<size_t>(n_blocks) * cfg.block_size * hp.kv_dim());
  }
}

void cuda_forward::impl::enqueue_layers(int64_t N, const int32_t* ids, const int32_t* pos, const int32_t* seq,
                                        const int32_t* slots, const int32_t* tables, int64_t width) {
  const llama_hparams& hp = model.hparams();
  const int64_t E = hp.n_embd, KV = hp.kv_dim(), F = hp.n_ff, HD = hp.head_dim, V = hp.n_vocab;
  const int64_t bs = cfg.block_size;
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  cudaStream_t st = stream;
  cuda::embed_rows(embd.p, embd_type, ids, N, E, V, x.p, st);
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const layer& L = layers[static_cast<size_t>(l)];
    if (l == 0) cuda::rms_norm(x.p, L.attn_norm.p, xn.p, N, E, hp.rms_eps, st);
    gemm(L.wq, xn.p, N, q.p);
    gemm(L.wk, xn.p, N, k.p);
    gemm(L.wv, xn.p, N, v.p);
    if (hp.qkv_bias) {  // as cpu_forward: the biases join before RoPE (and before V is cached)
      cuda::add_bias(q.p, L.bq.p, N, E, st);
      cuda::add_bias(k.p, L.bk.p, N, KV, st);
      cuda::add_bias(v.p, L.bv.p, N, KV, st);
    }
    cuda::rope(q.p, pos, N, hp.n_head, HD, rope, st);
    cuda::rope(k.p, pos, N, hp.n_head_kv, HD, rope, st);
    cuda::kv_write(k.p, v.p, slots, N, KV, k_cache[l].p, v_cache[l].p, st);
    cuda::paged_attention(q.p, k_cache[l].p, v_cache[l].p, tables, width, seq, pos, N, hp.n_head, hp.n_head_kv, HD, bs,
                          scale, attn.p, st);
    gemm(L.wo, attn.p, N, tmp.p);
    cuda::add_rms_norm(x.p, tmp.p, L.ffn_norm.p, xn.p, N, E, hp.rms_eps, st);  // x += attn; xn = norm(x)
    gemm(L.w_gate, xn.p, N, gate.p);
    gemm(L.w_up, xn.p, N, up.p);
    cuda::silu_mul(gate.p, up.p, h.p, N * F, st);
    gemm(L.w_down, h.p, N, tmp.p);
    // x += ffn; then the next layer's attention norm (or the output norm after the last layer).
    const float* next_norm = l + 1 < hp.n_layer ? layers[static_cast<size_t>(l + 1)].attn_norm.p : output_norm.p;
    cuda::add_rms_norm(x.p, tmp.p, next_norm, xn.p, N, E, hp.rms_eps, st);
  }
}

void cuda_forward::impl::enqueue_decode(int64_t B) {
  enqueue_layers(B, dec_ids(), dec_pos(), dec_seq(), dec_slots(), dec_tables(), table_width);
  gemm(output, xn.p, B, logits.p);  // every row of a decode step wants its logits
  cuda::sample_tokens(logits.p, B, model.hparams().n_vocab, d_params.p, d_out_ids.p, sample_ws.p, sample_ws.bytes(),
                      stream);
}

// Row r of the decode metadata: the sequence's one token, or a dummy row when b is null.
void cuda_forward::impl::stage_decode_row(int64_t r, const batch_seq* b, const row_sampling* s) {
  int32_t* hm = h_dec_meta.p;
  int32_t* table = hm + 4 * bucket_max + r * table_width;
  if (!b) {
    hm[r] = -1;                   // token: a zero embedding row
    hm[bucket_max + r] = -1;      // position: attention writes zeros and reads nothing
    hm[2 * bucket_max + r] = -1;  // sequence
    hm[3 * bucket_max + r] = -1;  // KV slot: nothing written
    std::fill(table, table + table_width, 0);
    h_params.p[r] = cuda::device_sampling{};
    return;
  }
  const int64_t p = b->pos0, bs = cfg.block_size;
  hm[r] = b->tokens[0];
  hm[bucket_max + r] = static_cast<int32_t>(p);
  hm[2 * bucket_max + r] = static_cast<int32_t>(r);
  hm[3 * bucket_max + r] = static_cast<int32_t>(b->block_ids[static_cast<size_t>(p / bs)] * bs + p % bs);
  const size_t n = b->block_ids.size();  // <= table_width (checked by the caller)
  std::copy(b->block_ids.begin(), b->block_ids.end(), table);
  std::fill(table + n, table + table_width, 0);
  h_params.p[r] = s ? to_device(*s) : cuda::device_sampling{};
}

void cuda_forward::impl::upload_decode(int64_t B) {
  SY_CUDA_CHECK(cudaMemcpyAsync(dec_meta.p, h_dec_meta.p, static_cast<size_t>(4 * bucket_max) * sizeof(int32_t),
                                cudaMemcpyHostToDevice, stream));
  SY_CUDA_CHECK(cudaMemcpyAsync(dec_tables(), h_dec_meta.p + 4 * bucket_max,
                                static_cast<size_t>(B * table_width) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                stream));
  SY_CUDA_CHECK(cudaMemcpyAsync(d_params.p, h_params.p, static_cast<size_t>(B) * sizeof(cuda::device_sampling),
                                cudaMemcpyHostToDevice, stream));
}

// The decode launch sequence of bucket B as an executable graph, or null with the reason.
cudaGraphExec_t cuda_forward::impl::capture_decode(int64_t B, std::string& why) {
  cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    cudaGetLastError();
    why = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
    return nullptr;
  }
  try {
    enqueue_decode(B);
  } catch (const std::exception& ex) {
    why = ex.what();
  }
  cudaGraph_t g = nullptr;
  e = cudaStreamEndCapture(stream, &g);  // always: leaves the stream out of capture mode
  if (why.empty() && e != cudaSuccess) why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e);
  cudaGraphExec_t exec = nullptr;
  if (why.empty()) {
    e = cudaGraphInstantiate(&exec, g, 0);
    if (e != cudaSuccess) {
      why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e);
      exec = nullptr;
    }
  }
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();  // a failed capture leaves a (non-sticky) error behind
  return exec;
}

void cuda_forward::impl::capture_graphs() {
  std::vector<cudaGraphExec_t> made;
  for (const int32_t B : buckets) {
    // Warm-up, eager, all rows dummy (errors here are real and propagate): loads the kernels and
    // lets cuBLAS settle on its kernels for B before the capture records them.
    for (int64_t r = 0; r < B; ++r) stage_decode_row(r, nullptr, nullptr);
    upload_decode(B);
    enqueue_decode(B);
    SY_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::string why;
    cudaGraphExec_t exec = capture_decode(B, why);
    if (!exec) {
      for (cudaGraphExec_t g : made) cudaGraphExecDestroy(g);
      graph_note = "capture of batch " + std::to_string(B) + " failed (" + why + "), decode steps run eagerly";
      SY_CUDA_CHECK(cudaStreamSynchronize(stream));  // a broken context is fatal, not a fallback
      return;
    }
    made.push_back(exec);
  }
  graphs = std::move(made);
}

void cuda_forward::impl::run_decode(std::span<const batch_seq> batch, std::span<const row_sampling> sampling,
                                    step_output& out) {
  const int64_t S = static_cast<int64_t>(batch.size());
  const size_t bi = static_cast<size_t>(std::lower_bound(buckets.begin(), buckets.end(), S) - buckets.begin());
  const int64_t B = buckets[bi];
  for (int64_t r = 0; r < B; ++r)
    if (r < S)
      stage_decode_row(r, &batch[static_cast<size_t>(r)],
                       sampling.empty() ? nullptr : &sampling[static_cast<size_t>(r)]);
    else
      stage_decode_row(r, nullptr, nullptr);
  upload_decode(B);
  if (!graphs.empty()) {
    SY_CUDA_CHECK(cudaGraphLaunch(graphs[bi], stream));
    ++counters.graph_replays;
  } else {
    enqueue_decode(B);
  }
  ++counters.decode_steps;
  counters.padding_rows += static_cast<uint64_t>(B - S);
  fetch(S, sampling, true, out);
}

void cuda_forward::impl::run_ragged(std::span<const batch_seq> batch, std::span<const row_sampling> sampling,
                                    step_output& out) {
  const llama_hparams& hp = model.hparams();
  const int64_t E = hp.n_embd;
  const int64_t bs = cfg.block_size;
  int64_t N = 0, max_blocks = 1;
  for (const batch_seq& b : batch) {
    N += static_cast<int64_t>(b.tokens.size());
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(b.block_ids.size()));
  }
  const int64_t S = static_cast<int64_t>(batch.size());
  if (N > n_tok_max)
    throw std::invalid_argument("cuda_forward: a step of " + std::to_string(N) +
                                " tokens exceeds max_tokens_per_step (" + std::to_string(n_tok_max) + ")");
  const size_t need = static_cast<size_t>(4 * N + S * max_blocks);
  if (need > h_meta.n) h_meta.alloc(std::max(need, 2 * h_meta.n));
  if (d_tables.n < static_cast<size_t>(S * max_blocks)) d_tables.alloc(static_cast<size_t>(S * max_blocks));
  int32_t* ids = h_meta.p;
  int32_t* pos = ids + N;
  int32_t* seq = pos + N;
  int32_t* slots = seq + N;
  int32_t* tables = slots + N;
  std::vector<int64_t> out_rows;
  int64_t row = 0;
  for (int64_t s = 0; s < S; ++s) {
    const batch_seq& b = batch[static_cast<size_t>(s)];
    const int64_t n = static_cast<int64_t>(b.tokens.size());
    for (int64_t j = 0; j < n; ++j, ++row) {
      const int64_t p = b.pos0 + j;
      ids[row] = b.tokens[j];
      pos[row] = static_cast<int32_t>(p);
      seq[row] = static_cast<int32_t>(s);
      slots[row] = static_cast<int32_t>(b.block_ids[p / bs] * bs + p % bs);
      if (b.all_logits || (b.logits && j + 1 == n)) out_rows.push_back(row);
    }
    for (int64_t i = 0; i < max_blocks; ++i)
      tables[s * max_blocks + i] = i < static_cast<int64_t>(b.block_ids.size()) ? b.block_ids[i] : 0;
  }
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  if (n_out > n_rows_max)
    throw std::invalid_argument("cuda_forward: " + std::to_string(n_out) + " logits rows exceed max_seqs_per_step (" +
                                std::to_string(n_rows_max) + ")");
  cudaStream_t st = stream;
  SY_CUDA_CHECK(cudaMemcpyAsync(d_ids.p, ids, N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  SY_CUDA_CHECK(cudaMemcpyAsync(d_pos.p, pos, N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  SY_CUDA_CHECK(cudaMemcpyAsync(d_seq.p, seq, N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  SY_CUDA_CHECK(cudaMemcpyAsync(d_slots.p, slots, N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  SY_CUDA_CHECK(cudaMemcpyAsync(d_tables.p, tables, S * max_blocks * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  enqueue_layers(N, d_ids.p, d_pos.p, d_seq.p, d_slots.p, d_tables.p, max_blocks);

  // Logits only for the rows that want them: gather their normalized rows, one GEMM.
  for (int64_t i = 0; i < n_out; ++i)
    SY_CUDA_CHECK(
        cudaMemcpyAsync(xo.p + i * E, xn.p + out_rows[i] * E, E * sizeof(__half), cudaMemcpyDeviceToDevice, st));
  if (n_out > 0) gemm(output, xo.p, n_out, logits.p);
  bool sample = false;
  for (const row_sampling& r : sampling) sample |= r.on_backend;
  if (sample && n_out > 0) {
    for (int64_t r = 0; r < n_out; ++r) h_params.p[r] = to_device(sampling[static_cast<size_t>(r)]);
    SY_CUDA_CHECK(
        cudaMemcpyAsync(d_params.p, h_params.p, n_out * sizeof(cuda::device_sampling), cudaMemcpyHostToDevice, st));
    cuda::sample_tokens(logits.p, n_out, hp.n_vocab, d_params.p, d_out_ids.p, sample_ws.p, sample_ws.bytes(), st);
  }
  ++counters.ragged_steps;
  fetch(n_out, sampling, sample, out);
}

// Copies back the sampled ids (rows sampled on the device) and the other rows' logits, waits for
// the step, and fills `out`. Logits row r is logits[r]; `sampled`: sample_tokens ran over them.
void cuda_forward::impl::fetch(int64_t n_rows, std::span<const row_sampling> sampling, bool sampled, step_output& out) {
  const int64_t V = model.hparams().n_vocab;
  auto on_device = [&](int64_t r) {
    return sampled && !sampling.empty() && sampling[static_cast<size_t>(r)].on_backend;
  };
  int64_t n_host = 0;
  for (int64_t r = 0; r < n_rows; ++r) n_host += !on_device(r);
  if (n_host < n_rows)
    SY_CUDA_CHECK(cudaMemcpyAsync(h_out_ids.p, d_out_ids.p, static_cast<size_t>(n_rows) * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream));
  out.logits.resize(static_cast<size_t>(n_host * V));
  if (n_host == n_rows) {
    if (n_rows > 0)
      SY_CUDA_CHECK(cudaMemcpyAsync(out.logits.data(), logits.p, out.logits.size() * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
  } else {
    int64_t k = 0;
    for (int64_t r = 0; r < n_rows; ++r)
      if (!on_device(r))
        SY_CUDA_CHECK(cudaMemcpyAsync(out.logits.data() + (k++) * V, logits.p + r * V, V * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream));
  }
  SY_CUDA_CHECK(cudaStreamSynchronize(stream));
  out.tokens.resize(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    if (!on_device(r)) {
      out.tokens[r] = step_output::k_not_sampled;
      continue;
    }
    const int32_t id = h_out_ids.p[r];
    if (id < 0 || id >= V)
      throw std::runtime_error("cuda_forward: the device sampler returned token " + std::to_string(id) +
                               " outside the vocabulary");
    out.tokens[r] = id;
    ++counters.device_sampled;
  }
}

cuda_forward::cuda_forward(const llama_model& model, cuda_forward_config cfg)
    : impl_(std::make_unique<impl>(model, cfg)) {
  impl& m = *impl_;
  const std::string dev = "cuda:" + std::to_string(cfg.device);
  int n_dev = 0;
  const cudaError_t e = cudaGetDeviceCount(&n_dev);
  if (e != cudaSuccess || n_dev == 0) {
    cudaGetLastError();
    throw std::runtime_error(dev + ": no CUDA device (" +
                             (e != cudaSuccess ? std::string(cudaGetErrorString(e)) : std::string("none found")) + ")");
  }
  if (cfg.device < 0 || cfg.device >= n_dev)
    throw std::runtime_error(dev + ": no such device (" + std::to_string(n_dev) + " found: cuda:0" +
                             (n_dev > 1 ? "..cuda:" + std::to_string(n_dev - 1) : std::string()) + ")");
  SY_CUDA_CHECK(cudaSetDevice(cfg.device));
  SY_CUDA_CHECK(cudaGetDeviceProperties(&m.prop, cfg.device));
  if (m.prop.major < 8)
    throw std::runtime_error(dev + " (" + m.prop.name + ") is sm_" + std::to_string(m.prop.major) +
                             std::to_string(m.prop.minor) + "; the CUDA kernels need sm_80 or newer");
  const llama_hparams& hp = model.hparams();
  // What this backend implements of llama_model: the "llama" and "qwen2" architectures (RoPE in
  // normal or neox mode with linear scaling and per-frequency divisors, Q/K/V biases) over every
  // weight type the loader accepts. An architecture the CPU side learns later is refused here by
  // name rather than run with the wrong graph.
  if (hp.arch != "llama" && hp.arch != "qwen2")
    throw std::runtime_error("cuda_forward: architecture '" + hp.arch +
                             "' is not implemented by the CUDA backend (llama, qwen2); use --device cpu");
  if (hp.q_dim() != hp.n_embd)
    throw std::runtime_error("cuda_forward: heads wider than n_embd / n_head (attention.key_length " +
                             std::to_string(hp.head_dim) +
                             ") are not implemented by the CUDA backend; use --device cpu");
  if (hp.head_dim != 64 && hp.head_dim != 128)
    throw std::runtime_error("cuda_forward: the attention kernel supports head sizes 64 and 128, the model has " +
                             std::to_string(hp.head_dim));
  if (hp.n_vocab > cuda::k_sampling_max_vocab)
    throw std::runtime_error("cuda_forward: the device sampler supports vocabularies up to 2^24 tokens");
  if (cfg.block_size < 1 || cfg.max_tokens_per_step < 1 || cfg.max_seqs_per_step < 1 || cfg.max_blocks_per_seq < 0 ||
      !(cfg.kv_memory_fraction > 0 && cfg.kv_memory_fraction <= 0.95))
    throw std::invalid_argument(
        "cuda_forward: block_size, max_tokens_per_step and max_seqs_per_step must be "
        "positive, kv_memory_fraction in (0, 0.95]");
  SY_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  SY_CUBLAS_CHECK(cublasCreate(&m.blas));
  SY_CUBLAS_CHECK(cublasSetStream(m.blas, m.stream));
  // Default math: fp16 x fp16 -> fp32 GemmEx with CUBLAS_COMPUTE_32F already runs on tensor cores
  // (only the pedantic modes turn them off). CUBLAS_TENSOR_OP_MATH is deprecated in cuBLAS 13
  // ("same effect as CUBLAS_COMPUTE_32F_FAST_16F, will be removed") and adds nothing here.
  SY_CUBLAS_CHECK(cublasSetMathMode(m.blas, CUBLAS_DEFAULT_MATH));
  m.load(model);
  m.allocate_buffers();
  m.allocate_kv();  // what is left, after the buffers
  if (cfg.cuda_graphs) m.capture_graphs();
}

cuda_forward::~cuda_forward() = default;

void cuda_forward::run(std::span<const batch_seq> batch, std::span<const row_sampling> sampling, step_output& out) {
  impl& m = *impl_;
  SY_CUDA_CHECK(cudaSetDevice(m.cfg.device));  // the engine may run on another thread than the loader
  const int64_t V = m.model.hparams().n_vocab, bs = m.cfg.block_size;
  int64_t N = 0, n_out = 0;
  bool decode = static_cast<int64_t>(batch.size()) <= m.bucket_max;
  for (const batch_seq& b : batch) {
    const int64_t n = static_cast<int64_t>(b.tokens.size());
    // Cheap checks that keep a caller's bug from writing outside the KV arena.
    if (static_cast<int64_t>(b.block_ids.size()) * bs < b.pos0 + n || b.pos0 < 0)
      throw std::invalid_argument("cuda_forward: block table too short for the sequence");
    for (int32_t id : b.block_ids)
      if (id < 0 || id >= m.n_blocks) throw std::invalid_argument("cuda_forward: block id out of range");
    for (token_id t : b.tokens)
      if (t < 0 || t >= V) throw std::invalid_argument("cuda_forward: token id outside the vocabulary");
    N += n;
    n_out += b.all_logits ? n : (b.logits && n > 0 ? 1 : 0);
    decode =
        decode && n == 1 && (b.logits || b.all_logits) && static_cast<int64_t>(b.block_ids.size()) <= m.table_width;
  }
  if (!sampling.empty() && static_cast<int64_t>(sampling.size()) != n_out)
    throw std::invalid_argument("cuda_forward: " + std::to_string(sampling.size()) + " sampling entries for " +
                                std::to_string(n_out) + " logits rows");
  if (N == 0) {
    out.tokens.clear();
    out.logits.clear();
    return;
  }
  if (decode)
    m.run_decode(batch, sampling, out);
  else
    m.run_ragged(batch, sampling, out);
}

void cuda_forward::run(std::span<const batch_seq> batch, std::vector<float>& logits) {
  step_output out;
  run(batch, {}, out);
  logits = std::move(out.logits);
}

int32_t cuda_forward::n_kv_blocks() const { return impl_->n_blocks; }
int32_t cuda_forward::block_size() const { return impl_->cfg.block_size; }
size_t cuda_forward::weight_bytes() const { return impl_->weight_bytes; }
size_t cuda_forward::weight_read_bytes() const { return impl_->weight_bytes - impl_->embd.bytes(); }
size_t cuda_forward::kv_bytes() const {
  size_t b = 0;
  for (const auto& k : impl_->k_cache) b += 2 * k.bytes();
  return b;
}
size_t cuda_forward::kv_bytes_per_token() const {
  const llama_hparams& hp = impl_->model.hparams();
  return static_cast<size_t>(2 * hp.n_layer * hp.kv_dim()) * sizeof(__half);
}
bool cuda_forward::graphs_active() const { return !impl_->graphs.empty(); }
cuda_forward_counters cuda_forward::counters() const { return impl_->counters; }

std::string cuda_forward::describe() const {
  const impl& m = *impl_;
  std::string s = "cuda:" + std::to_string(m.cfg.device) + " (" + m.prop.name + ", sm_" + std::to_string(m.prop.major) +
                  std::to_string(m.prop.minor) + "; decode ";
  if (!m.graphs.empty())
    s += "graphs for batches 1.." + std::to_string(m.bucket_max);
  else if (!m.graph_note.empty())
    s += "graphs off: " + m.graph_note;
  else
    s += "graphs off (eager)";
  return s + ")";
}

}  // namespace sy
