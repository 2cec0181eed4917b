#include "worker/cuda_forward.hpp"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dequantize.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/kv_write.cuh"
#include "kernels/cuda/paged_attention.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "worker/llama_model.hpp"

namespace sy {
namespace {

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
      size_t free_b = 0, total_b = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_b, &total_b);
      throw std::runtime_error("cuda_forward: cannot allocate " + std::to_string(count * sizeof(T) >> 20) +
                               " MiB on the device (" + std::to_string(free_b >> 20) + " MiB free of " +
                               std::to_string(total_b >> 20) + " MiB): " + cudaGetErrorString(e));
    }
  }
  size_t bytes() const { return n * sizeof(T); }
};

// A linear layer: y[N][rows] = x[N][cols] W^T with W row-major [rows][cols] in fp16.
struct dlinear {
  dbuf<__half> w;
  int64_t rows = 0, cols = 0;
};

}  // namespace

struct cuda_forward::impl {
  const llama_model& model;
  cuda_forward_config cfg;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  size_t weight_bytes = 0;

  dbuf<__half> embd;  // [n_vocab][n_embd]
  struct layer {
    dbuf<float> attn_norm, ffn_norm;
    dlinear wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  std::vector<layer> layers;
  dbuf<float> output_norm;
  dlinear output;

  int32_t n_blocks = 0;
  std::vector<dbuf<__half>> k_cache, v_cache;  // per layer: [n_blocks * block_size][kv_dim]

  // Activations for up to cfg.max_tokens_per_step tokens.
  dbuf<float> x, q, k, v, tmp, gate, up, logits;
  dbuf<__half> xn, attn, h, xo;
  // Per-step metadata, uploaded from pinned host memory.
  dbuf<int32_t> d_ids, d_pos, d_seq, d_slots, d_tables;
  int32_t* h_meta = nullptr;  // pinned: ids | pos | seq | slots | tables
  size_t h_meta_count = 0;

  impl(const llama_model& m, cuda_forward_config c) : model(m), cfg(c) {}
  ~impl() {
    if (h_meta) cudaFreeHost(h_meta);
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  // Raw GGUF bytes → device → fp16 [rows][cols].
  void upload_linear(dlinear& L, const gguf::tensor_info& t, int64_t rows, int64_t cols) {
    L.rows = rows;
    L.cols = cols;
    L.w.alloc(static_cast<size_t>(rows * cols));
    dbuf<uint8_t> raw(t.n_bytes);
    SY_CUDA_CHECK(cudaMemcpyAsync(raw.p, t.data, t.n_bytes, cudaMemcpyHostToDevice, stream));
    cuda::dequantize_to_f16(raw.p, to_weight_type(t), rows, cols, L.w.p, stream);
    SY_CUDA_CHECK(cudaStreamSynchronize(stream));  // `raw` is freed next
    weight_bytes += L.w.bytes();
  }
  void upload_vector(dbuf<float>& d, const std::vector<float>& h) {
    d.alloc(h.size());
    SY_CUDA_CHECK(cudaMemcpy(d.p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
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
};

cuda_forward::cuda_forward(const llama_model& model, cuda_forward_config cfg)
    : impl_(std::make_unique<impl>(model, cfg)) {
  impl& m = *impl_;
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev <= cfg.device || cfg.device < 0) {
    cudaGetLastError();
    throw std::runtime_error("cuda_forward: no CUDA device " + std::to_string(cfg.device) + " (" +
                             std::to_string(n_dev) + " found)");
  }
  SY_CUDA_CHECK(cudaSetDevice(cfg.device));
  SY_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  SY_CUBLAS_CHECK(cublasCreate(&m.blas));
  SY_CUBLAS_CHECK(cublasSetStream(m.blas, m.stream));
  SY_CUBLAS_CHECK(cublasSetMathMode(m.blas, CUBLAS_TENSOR_OP_MATH));

  const llama_hparams& hp = model.hparams();
  const gguf::file& f = model.file();
  const int64_t E = hp.n_embd, KV = hp.kv_dim(), F = hp.n_ff;
  auto tensor = [&](const std::string& name) -> const gguf::tensor_info& {
    const gguf::tensor_info* t = f.find_tensor(name);
    if (!t) throw std::runtime_error("cuda_forward: missing tensor " + name);
    return *t;
  };
  {
    dlinear e;
    m.upload_linear(e, tensor("token_embd.weight"), hp.n_vocab, E);
    m.embd = std::move(e.w);
  }
  m.layers.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    impl::layer& L = m.layers[static_cast<size_t>(i)];
    const llama_layer& cpu_l = model.layers()[static_cast<size_t>(i)];
    m.upload_vector(L.attn_norm, cpu_l.attn_norm);
    m.upload_vector(L.ffn_norm, cpu_l.ffn_norm);
    m.upload_linear(L.wq, tensor(p + "attn_q.weight"), E, E);
    m.upload_linear(L.wk, tensor(p + "attn_k.weight"), KV, E);
    m.upload_linear(L.wv, tensor(p + "attn_v.weight"), KV, E);
    m.upload_linear(L.wo, tensor(p + "attn_output.weight"), E, E);
    m.upload_linear(L.w_gate, tensor(p + "ffn_gate.weight"), F, E);
    m.upload_linear(L.w_up, tensor(p + "ffn_up.weight"), F, E);
    m.upload_linear(L.w_down, tensor(p + "ffn_down.weight"), E, F);
  }
  m.upload_vector(m.output_norm, model.output_norm());
  m.upload_linear(m.output, tensor(f.find_tensor("output.weight") ? "output.weight" : "token_embd.weight"), hp.n_vocab,
                  E);

  const int64_t T = cfg.max_tokens_per_step;
  m.x.alloc(T * E);
  m.q.alloc(T * E);
  m.tmp.alloc(T * E);
  m.k.alloc(T * KV);
  m.v.alloc(T * KV);
  m.gate.alloc(T * F);
  m.up.alloc(T * F);
  m.xn.alloc(T * E);
  m.attn.alloc(T * E);
  m.h.alloc(T * F);
  m.xo.alloc(static_cast<size_t>(cfg.max_seqs_per_step) * E);
  m.logits.alloc(static_cast<size_t>(cfg.max_seqs_per_step) * hp.n_vocab);

  // KV arena: what was asked, or a fraction of what is free now.
  const size_t block_bytes = static_cast<size_t>(2 * hp.n_layer * cfg.block_size * KV) * sizeof(__half);
  size_t free_b = 0, total_b = 0;
  SY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  m.n_blocks =
      cfg.n_kv_blocks > 0
          ? cfg.n_kv_blocks
          : static_cast<int32_t>(std::min<double>(
                cfg.kv_memory_fraction * static_cast<double>(free_b) / static_cast<double>(block_bytes), 1 << 30));
  if (m.n_blocks < 1 || static_cast<size_t>(m.n_blocks) * block_bytes > free_b)
    throw std::runtime_error("cuda_forward: a KV arena of " + std::to_string(m.n_blocks) + " blocks needs " +
                             std::to_string((static_cast<size_t>(std::max(m.n_blocks, 1)) * block_bytes) >> 20) +
                             " MiB; " + std::to_string(free_b >> 20) + " MiB of " + std::to_string(total_b >> 20) +
                             " MiB are free after " + std::to_string(m.weight_bytes >> 20) + " MiB of weights");
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    m.k_cache.emplace_back(static_cast<size_t>(m.n_blocks) * cfg.block_size * KV);
    m.v_cache.emplace_back(static_cast<size_t>(m.n_blocks) * cfg.block_size * KV);
  }
}

cuda_forward::~cuda_forward() = default;

int32_t cuda_forward::n_kv_blocks() const { return impl_->n_blocks; }
int32_t cuda_forward::block_size() const { return impl_->cfg.block_size; }
size_t cuda_forward::weight_bytes() const { return impl_->weight_bytes; }
size_t cuda_forward::kv_bytes() const {
  size_t b = 0;
  for (const auto& k : impl_->k_cache) b += 2 * k.bytes();
  return b;
}

void cuda_forward::run(std::span<const batch_seq> batch, std::vector<float>& logits) {
  impl& m = *impl_;
  const llama_hparams& hp = m.model.hparams();
  const int64_t E = hp.n_embd, KV = hp.kv_dim(), F = hp.n_ff, HD = hp.head_dim, V = hp.n_vocab;
  const int64_t bs = m.cfg.block_size;

  // Host-side layout of the step: token rows in batch order, the rows whose logits are wanted,
  // and a padded block table per sequence.
  int64_t N = 0, max_blocks = 1;
  for (const batch_seq& b : batch) {
    N += static_cast<int64_t>(b.tokens.size());
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(b.block_ids.size()));
    if (static_cast<int64_t>(b.block_ids.size()) * bs < b.pos0 + static_cast<int64_t>(b.tokens.size()))
      throw std::invalid_argument("cuda_forward: block table too short for the sequence");
    for (int32_t id : b.block_ids)
      if (id < 0 || id >= m.n_blocks) throw std::invalid_argument("cuda_forward: block id out of range");
  }
  logits.clear();
  if (N == 0) return;
  if (N > m.cfg.max_tokens_per_step || static_cast<int64_t>(batch.size()) > m.cfg.max_seqs_per_step)
    throw std::invalid_argument("cuda_forward: the step exceeds max_tokens_per_step / max_seqs_per_step");
  const int64_t S = static_cast<int64_t>(batch.size());
  const size_t need = static_cast<size_t>(4 * N + S * max_blocks);
  if (need > m.h_meta_count) {
    if (m.h_meta) SY_CUDA_CHECK(cudaFreeHost(m.h_meta));
    m.h_meta = nullptr;
    SY_CUDA_CHECK(cudaMallocHost(&m.h_meta, need * sizeof(int32_t)));
    m.h_meta_count = need;
    m.d_ids.alloc(static_cast<size_t>(m.cfg.max_tokens_per_step));
    m.d_pos.alloc(static_cast<size_t>(m.cfg.max_tokens_per_step));
    m.d_seq.alloc(static_cast<size_t>(m.cfg.max_tokens_per_step));
    m.d_slots.alloc(static_cast<size_t>(m.cfg.max_tokens_per_step));
  }
  if (m.d_tables.n < static_cast<size_t>(S * max_blocks)) m.d_tables.alloc(static_cast<size_t>(S * max_blocks));
  int32_t* ids = m.h_meta;
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
      if (b.tokens[j] < 0 || b.tokens[j] >= V)
        throw std::invalid_argument("cuda_forward: token id outside the vocabulary");
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
  if (static_cast<int64_t>(out_rows.size()) > m.cfg.max_seqs_per_step)
    throw std::invalid_argument("cuda_forward: more logits rows than max_seqs_per_step");
  cudaStream_t st = m.stream;
  SY_CUDA_CHECK(cudaMemcpyAsync(m.d_ids.p, ids, N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  SY_CUDA_CHECK(cudaMemcpyAsync(m.d_pos.p, pos, N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  SY_CUDA_CHECK(cudaMemcpyAsync(m.d_seq.p, seq, N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  SY_CUDA_CHECK(cudaMemcpyAsync(m.d_slots.p, slots, N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  SY_CUDA_CHECK(cudaMemcpyAsync(m.d_tables.p, tables, S * max_blocks * sizeof(int32_t), cudaMemcpyHostToDevice, st));

  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  cuda::embed_rows(m.embd.p, m.d_ids.p, N, E, V, m.x.p, st);
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const impl::layer& L = m.layers[static_cast<size_t>(l)];
    if (l == 0) cuda::rms_norm(m.x.p, L.attn_norm.p, m.xn.p, N, E, hp.rms_eps, st);
    m.gemm(L.wq, m.xn.p, N, m.q.p);
    m.gemm(L.wk, m.xn.p, N, m.k.p);
    m.gemm(L.wv, m.xn.p, N, m.v.p);
    cuda::rope(m.q.p, m.d_pos.p, N, hp.n_head, HD, hp.n_rot, hp.rope_base, st);
    cuda::rope(m.k.p, m.d_pos.p, N, hp.n_head_kv, HD, hp.n_rot, hp.rope_base, st);
    cuda::kv_write(m.k.p, m.v.p, m.d_slots.p, N, KV, m.k_cache[l].p, m.v_cache[l].p, st);
    cuda::paged_attention(m.q.p, m.k_cache[l].p, m.v_cache[l].p, m.d_tables.p, max_blocks, m.d_seq.p, m.d_pos.p, N,
                          hp.n_head, hp.n_head_kv, HD, bs, scale, m.attn.p, st);
    m.gemm(L.wo, m.attn.p, N, m.tmp.p);
    cuda::add_rms_norm(m.x.p, m.tmp.p, L.ffn_norm.p, m.xn.p, N, E, hp.rms_eps, st);  // x += attn; xn = norm(x)
    m.gemm(L.w_gate, m.xn.p, N, m.gate.p);
    m.gemm(L.w_up, m.xn.p, N, m.up.p);
    cuda::silu_mul(m.gate.p, m.up.p, m.h.p, N * F, st);
    m.gemm(L.w_down, m.h.p, N, m.tmp.p);
    // x += ffn; then the next layer's attention norm (or the output norm after the last layer).
    const float* next_norm = l + 1 < hp.n_layer ? m.layers[static_cast<size_t>(l + 1)].attn_norm.p : m.output_norm.p;
    cuda::add_rms_norm(m.x.p, m.tmp.p, next_norm, m.xn.p, N, E, hp.rms_eps, st);
  }
  // Logits only for the rows that want them: gather their normalized rows, one GEMM.
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  for (int64_t i = 0; i < n_out; ++i)
    SY_CUDA_CHECK(
        cudaMemcpyAsync(m.xo.p + i * E, m.xn.p + out_rows[i] * E, E * sizeof(__half), cudaMemcpyDeviceToDevice, st));
  if (n_out > 0) m.gemm(m.output, m.xo.p, n_out, m.logits.p);
  logits.resize(static_cast<size_t>(n_out * V));
  if (n_out > 0)
    SY_CUDA_CHECK(
        cudaMemcpyAsync(logits.data(), m.logits.p, logits.size() * sizeof(float), cudaMemcpyDeviceToHost, st));
  SY_CUDA_CHECK(cudaStreamSynchronize(st));
}

}  // namespace sy
