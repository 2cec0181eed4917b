// Parity of the elementwise / row CUDA ops with their CPU references (docs/cuda-backend.md,
// "Layout"): embedding gather (every weight type), RMSNorm (plain and fused with the residual add),
// add_inplace, f32 -> f16, RoPE (normal and neox, linear scaling, per-frequency divisors), the
// Q/K/V bias add,
// SwiGLU, KV write and weight dequantization (every weight type). Each case draws fresh random inputs, poisons the
// device output with NaN bytes before the launch, surrounds every output with guard bytes that must come back
// unchanged, and compares with the CPU op by normalised MSE (or bit for bit where the device must round exactly as the
// host does). Exits 77 without a device.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cuda/bias_add.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dequantize.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/kv_write.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "tests/gpu/gpu_check.hpp"
#include "tests/gpu/random_weights.hpp"

namespace {

using sy::gpu_test::k_all_types;
using sy::gpu_test::random_floats;
using sy::gpu_test::suite;

constexpr size_t k_guard = 256;  // bytes on each side of a buffer (keeps 256-byte alignment)
constexpr unsigned char k_guard_byte = 0xA5;
constexpr unsigned char k_poison_byte = 0xFF;  // 0xFFFF / 0xFFFFFFFF: NaN in fp16 and fp32

uint32_t g_seed = 1234;  // every case draws fresh inputs
uint32_t next_seed() { return g_seed += 7919; }

// n elements of T in device memory with k_guard guard bytes before and after.
template <class T>
class guarded {
 public:
  explicit guarded(size_t n) : n_(n) {
    SY_CUDA_CHECK(cudaMalloc(&base_, bytes() + 2 * k_guard));
    SY_CUDA_CHECK(cudaMemset(base_, k_guard_byte, bytes() + 2 * k_guard));
  }
  ~guarded() { cudaFree(base_); }
  guarded(const guarded&) = delete;
  guarded& operator=(const guarded&) = delete;

  T* get() { return reinterpret_cast<T*>(base_ + k_guard); }
  __half* as_half() { return reinterpret_cast<__half*>(get()); }
  size_t bytes() const { return n_ * sizeof(T); }

  void upload(const std::vector<T>& v) {
    if (v.size() != n_) throw std::logic_error("guarded::upload: size mismatch");
    SY_CUDA_CHECK(cudaMemcpy(get(), v.data(), bytes(), cudaMemcpyHostToDevice));
  }
  void poison() { SY_CUDA_CHECK(cudaMemset(get(), k_poison_byte, bytes())); }
  std::vector<T> download() {
    std::vector<T> v(n_);
    SY_CUDA_CHECK(cudaMemcpy(v.data(), get(), bytes(), cudaMemcpyDeviceToHost));
    return v;
  }
  bool guards_intact() {
    std::vector<unsigned char> g(k_guard);
    for (unsigned char* at : {base_, base_ + k_guard + bytes()}) {
      SY_CUDA_CHECK(cudaMemcpy(g.data(), at, k_guard, cudaMemcpyDeviceToHost));
      for (unsigned char b : g)
        if (b != k_guard_byte) return false;
    }
    return true;
  }

 private:
  size_t n_;
  unsigned char* base_ = nullptr;
};

std::vector<float> half_bits_to_float(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = sy::cpu::fp16_to_fp32(h[i]);
  return f;
}

std::vector<uint16_t> float_to_half_bits(const std::vector<float>& f) {
  std::vector<uint16_t> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) h[i] = sy::cpu::fp32_to_fp16(f[i]);
  return h;
}

// Bit-for-bit comparison; reports the first mismatch.
template <class T>
void check_bits(suite& s, const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  s.check(got.size() == want.size() && bad == 0, what + ": " + std::to_string(bad) + " of " +
                                                     std::to_string(want.size()) + " differ (first at " +
                                                     std::to_string(first) + ")");
}

template <class T>
void check_guards(suite& s, guarded<T>& b, const std::string& what) {
  s.check(b.guards_intact(), what + ": guard bytes intact");
}

void sync(cudaStream_t st) { SY_CUDA_CHECK(cudaStreamSynchronize(st)); }

// ---- embedding ------------------------------------------------------------------------------

void test_embedding(suite& s, cudaStream_t st) {
  using sy::cpu::weight_type;
  struct shape {
    int64_t n_vocab, n_embd, n_tokens;
  };
  for (const weight_type t : k_all_types) {
    const int64_t block = sy::cpu::block_elements(t);
    std::vector<shape> shapes;
    if (block == 1)
      shapes = {{49152, 576, 64}, {1000, 576, 37}, {50, 7, 5}, {3, 33, 1}};
    else if (block == 32)
      shapes = {{1000, 576, 37}, {50, 64, 5}, {3, 32, 1}};
    else
      shapes = {{1200, 256, 37}, {300, 768, 64}, {3, 256, 1}};
    for (const shape sh : shapes) {
      const std::string what = std::string("embed_rows ") + sy::cpu::weight_type_name(t) + " vocab " +
                               std::to_string(sh.n_vocab) + " embd " + std::to_string(sh.n_embd) + " tokens " +
                               std::to_string(sh.n_tokens);
      const auto table = sy::gpu_test::random_weights(t, sh.n_vocab, sh.n_embd, next_seed());
      const size_t rb = sy::cpu::row_bytes(t, sh.n_embd);
      std::mt19937 rng(next_seed());
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(sh.n_vocab - 1));
      std::vector<int32_t> ids(sh.n_tokens);
      for (auto& id : ids) id = pick(rng);
      ids[0] = static_cast<int32_t>(sh.n_vocab - 1);  // the last row: no read past the table
      // Out-of-range ids must give zeros.
      const int32_t bad_ids[] = {-1, static_cast<int32_t>(sh.n_vocab), INT32_MAX, INT32_MIN};
      for (size_t j = 0; j < std::size(bad_ids) && 2 * j + 1 < ids.size(); ++j) ids[2 * j + 1] = bad_ids[j];

      // The reference: llama_model::embed, i.e. cpu::dequantize_row of the row, bit for bit.
      std::vector<float> want(sh.n_tokens * sh.n_embd, 0.f);
      for (int64_t tk = 0; tk < sh.n_tokens; ++tk)
        if (ids[tk] >= 0 && ids[tk] < sh.n_vocab)
          sy::cpu::dequantize_row(t, table.data() + ids[tk] * rb, want.data() + tk * sh.n_embd, sh.n_embd);

      guarded<uint8_t> d_table(table.size());
      guarded<int32_t> d_ids(ids.size());
      guarded<float> d_out(want.size());
      d_table.upload(table);
      d_ids.upload(ids);
      d_out.poison();
      sy::cuda::embed_rows(d_table.get(), t, d_ids.get(), sh.n_tokens, sh.n_embd, sh.n_vocab, d_out.get(), st);
      sync(st);
      check_bits(s, d_out.download(), want, what);
      check_guards(s, d_out, what);
    }
  }
  // A row that is not whole blocks is refused up front.
  bool threw = false;
  try {
    sy::cuda::embed_rows(nullptr, weight_type::q6_k, nullptr, 1, 288, 1, nullptr, st);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  s.check(threw, "embed_rows refuses n_embd % 256 != 0 for q6_K");
}

// ---- RMSNorm, fused add + RMSNorm, add_inplace, f32 -> f16 -------------------------------------

void test_rms_norm(suite& s, cudaStream_t st) {
  struct shape {
    int64_t n_rows, n;
  };
  const float eps = 1e-5f;
  for (const shape sh :
       {shape{1, 576}, shape{37, 576}, shape{5, 7}, shape{3, 1536}, shape{2, 4097}, shape{70000, 33}}) {
    const std::string dims = " rows " + std::to_string(sh.n_rows) + " n " + std::to_string(sh.n);
    const int64_t total = sh.n_rows * sh.n;
    const auto x = random_floats(total, next_seed(), 3.f);
    const auto delta = random_floats(total, next_seed(), 0.5f);
    auto weight = random_floats(sh.n, next_seed(), 0.1f);
    for (auto& w : weight) w += 1.f;

    // CPU references: y = rms_norm(x); for the fused op, residual = x + delta then its norm.
    std::vector<float> want_y(total), sum = x, want_sum_y(total);
    sy::cpu::add_inplace(sum.data(), delta.data(), total);
    for (int64_t r = 0; r < sh.n_rows; ++r) {
      sy::cpu::rms_norm(x.data() + r * sh.n, weight.data(), want_y.data() + r * sh.n, sh.n, eps);
      sy::cpu::rms_norm(sum.data() + r * sh.n, weight.data(), want_sum_y.data() + r * sh.n, sh.n, eps);
    }

    guarded<float> d_x(total), d_delta(total), d_w(sh.n);
    guarded<uint16_t> d_y(total);
    d_x.upload(x);
    d_delta.upload(delta);
    d_w.upload(weight);

    d_y.poison();
    sy::cuda::rms_norm(d_x.get(), d_w.get(), d_y.as_half(), sh.n_rows, sh.n, eps, st);
    sync(st);
    s.check_nmse(half_bits_to_float(d_y.download()), want_y, 1e-6, "rms_norm" + dims);
    check_bits(s, d_x.download(), x, "rms_norm leaves x alone" + dims);
    check_guards(s, d_y, "rms_norm" + dims);

    d_y.poison();
    sy::cuda::add_rms_norm(d_x.get(), d_delta.get(), d_w.get(), d_y.as_half(), sh.n_rows, sh.n, eps, st);
    sync(st);
    // fp32 addition rounds exactly on both sides: the residual must match bit for bit.
    check_bits(s, d_x.download(), sum, "add_rms_norm residual" + dims);
    s.check_nmse(half_bits_to_float(d_y.download()), want_sum_y, 1e-6, "add_rms_norm y" + dims);
    check_guards(s, d_x, "add_rms_norm residual" + dims);
    check_guards(s, d_y, "add_rms_norm y" + dims);
  }
}

void test_add_and_convert(suite& s, cudaStream_t st) {
  for (const int64_t n : {int64_t{1}, int64_t{576 * 37}, int64_t{100003}, int64_t{20000000}}) {
    const std::string dims = " n " + std::to_string(n);
    const auto x = random_floats(n, next_seed(), 2.f);
    const auto y = random_floats(n, next_seed(), 2.f);
    std::vector<float> want = x;
    sy::cpu::add_inplace(want.data(), y.data(), n);

    guarded<float> d_x(n), d_y(n);
    d_x.upload(x);
    d_y.upload(y);
    sy::cuda::add_inplace(d_x.get(), d_y.get(), n, st);
    sync(st);
    check_bits(s, d_x.download(), want, "add_inplace" + dims);
    check_guards(s, d_x, "add_inplace" + dims);

    // Conversion: values across the fp16 range, including subnormals and overflow to inf.
    auto f = random_floats(n, next_seed(), 1.f);
    for (int64_t i = 0; i < n; ++i) f[i] *= (i % 5 == 0) ? 1e-6f : (i % 7 == 0 ? 3e4f : 1.f);
    guarded<float> d_f(n);
    guarded<uint16_t> d_h(n);
    d_f.upload(f);
    d_h.poison();
    sy::cuda::f32_to_f16(d_f.get(), d_h.as_half(), n, st);
    sync(st);
    check_bits(s, d_h.download(), float_to_half_bits(f), "f32_to_f16" + dims);
    check_guards(s, d_h, "f32_to_f16" + dims);
  }
}

// ---- RoPE -----------------------------------------------------------------------------------

// Llama 3.1-style divisors (1 for the high frequencies, `factor` for the low ones, a smooth ramp
// between) for n_pairs pairs, or uniform random ones in [1, 32].
std::vector<float> rope_divisors(int64_t n_pairs, float base, bool llama3) {
  std::vector<float> ff(static_cast<size_t>(n_pairs));
  std::mt19937 rng(next_seed());
  std::uniform_real_distribution<float> any(1.f, 32.f);
  for (int64_t i = 0; i < n_pairs; ++i) {
    if (!llama3) {
      ff[i] = any(rng);
      continue;
    }
    const double wavelen = 2 * std::numbers::pi * std::pow(static_cast<double>(base), 2.0 * i / (2.0 * n_pairs));
    const double lo = 8192 / 4.0, hi = 8192 / 1.0, factor = 32;
    if (wavelen < lo)
      ff[i] = 1.f;
    else if (wavelen > hi)
      ff[i] = static_cast<float>(factor);
    else {
      const double smooth = (8192 / wavelen - 1) / 3;
      ff[i] = static_cast<float>(1 / ((1 - smooth) / factor + smooth));
    }
  }
  return ff;
}

void test_rope(suite& s, cudaStream_t st) {
  struct shape {
    int64_t n_tok, n_heads, head_dim, n_rot;
    float base;
  };
  struct mode {
    bool neox;
    int factors;  // 0: none, 1: Llama 3.1-style, 2: random
    float freq_scale;
  };
  // SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64, rope base 100000. Qwen2-0.5B: 14 query
  // heads, 2 KV heads, head_dim 64, base 1e6. Llama 3.2: head_dim 64 / 128, base 500000.
  for (const shape sh : {shape{5, 9, 64, 64, 100000.f}, shape{5, 3, 64, 64, 100000.f}, shape{33, 9, 64, 32, 10000.f},
                         shape{3, 2, 10, 6, 10000.f}, shape{1, 1, 128, 128, 500000.f}, shape{300, 3, 64, 64, 100000.f},
                         shape{17, 14, 64, 64, 1000000.f}, shape{9, 8, 128, 128, 500000.f}}) {
    for (const mode md : {mode{false, 0, 1.f}, mode{true, 0, 1.f}, mode{false, 1, 1.f}, mode{true, 2, 1.f},
                          mode{true, 0, 0.25f}, mode{false, 2, 0.5f}}) {
      const std::string dims = std::string(md.neox ? " neox" : " normal") +
                               (md.factors == 1   ? " llama3-factors"
                                : md.factors == 2 ? " random-factors"
                                                  : "") +
                               " scale " + std::to_string(md.freq_scale) + " tok " + std::to_string(sh.n_tok) +
                               " heads " + std::to_string(sh.n_heads) + " dim " + std::to_string(sh.head_dim) +
                               " rot " + std::to_string(sh.n_rot);
      const int64_t row = sh.n_heads * sh.head_dim, total = sh.n_tok * row;
      const auto x = random_floats(total, next_seed());
      std::mt19937 rng(next_seed());
      std::uniform_int_distribution<int32_t> pick(0, 8191);
      std::vector<int32_t> pos(sh.n_tok);
      for (auto& p : pos) p = pick(rng);
      pos[0] = 0;
      if (sh.n_tok > 1) pos[1] = 8191;
      if (sh.n_tok > 2) pos[2] = 131071;  // a Llama 3.1 context length
      const std::vector<float> ff =
          md.factors ? rope_divisors(sh.n_rot / 2, sh.base, md.factors == 1) : std::vector<float>();

      sy::cpu::rope_config c;
      c.n_rot = sh.n_rot;
      c.base = sh.base;
      c.freq_scale = md.freq_scale;
      c.freq_factors = ff.empty() ? nullptr : ff.data();
      c.neox = md.neox;
      std::vector<float> want = x;
      for (int64_t t = 0; t < sh.n_tok; ++t) sy::cpu::rope(want.data() + t * row, sh.n_heads, sh.head_dim, pos[t], c);

      guarded<float> d_x(total), d_ff(std::max<size_t>(ff.size(), 1));
      guarded<int32_t> d_pos(pos.size());
      d_x.upload(x);
      d_pos.upload(pos);
      if (!ff.empty()) d_ff.upload(ff);
      sy::cuda::rope_params p;
      p.n_rot = sh.n_rot;
      p.base = sh.base;
      p.freq_scale = md.freq_scale;
      p.freq_factors = ff.empty() ? nullptr : d_ff.get();
      p.neox = md.neox;
      sy::cuda::rope(d_x.get(), d_pos.get(), sh.n_tok, sh.n_heads, sh.head_dim, p, st);
      sync(st);
      const auto got = d_x.download();
      // The angles are the CPU's bit for bit; cos/sin may differ in the last bit (~1e-14 nmse).
      s.check_nmse(got, want, 1e-10, "rope" + dims);
      // Elements from n_rot on are not rotated: they stay bit for bit.
      std::vector<float> got_tail, want_tail;
      for (int64_t h = 0; h < sh.n_tok * sh.n_heads; ++h)
        for (int64_t i = sh.n_rot; i < sh.head_dim; ++i) {
          got_tail.push_back(got[h * sh.head_dim + i]);
          want_tail.push_back(x[h * sh.head_dim + i]);
        }
      check_bits(s, got_tail, want_tail, "rope leaves dims past n_rot alone" + dims);
      check_guards(s, d_x, "rope" + dims);
    }
  }
  // Mode mix-ups must not pass unnoticed: neox and normal differ on the same input.
  {
    const int64_t n_heads = 2, head_dim = 64;
    const auto x = random_floats(n_heads * head_dim, next_seed());
    const std::vector<int32_t> pos = {1000};
    guarded<float> d_x(x.size());
    guarded<int32_t> d_pos(1);
    d_pos.upload(pos);
    sy::cuda::rope_params p;
    p.n_rot = head_dim;
    std::vector<float> results[2];
    for (int neox = 0; neox < 2; ++neox) {
      d_x.upload(x);
      p.neox = neox;
      sy::cuda::rope(d_x.get(), d_pos.get(), 1, n_heads, head_dim, p, st);
      sync(st);
      results[neox] = d_x.download();
    }
    s.check(suite::nmse(results[1], results[0]) > 1e-2, "rope: neox and normal modes differ");
  }
}

// ---- Q/K/V bias -------------------------------------------------------------------------------

void test_add_bias(suite& s, cudaStream_t st) {
  struct shape {
    int64_t n_rows, n;
  };
  // Qwen2-0.5B: Q 896, K/V 128; the tiny test family: 256 and 128.
  for (const shape sh : {shape{1, 896}, shape{37, 128}, shape{5, 7}, shape{300, 256}, shape{70000, 33}}) {
    const std::string dims = " rows " + std::to_string(sh.n_rows) + " n " + std::to_string(sh.n);
    const auto y = random_floats(sh.n_rows * sh.n, next_seed(), 3.f);
    const auto bias = random_floats(sh.n, next_seed(), 0.5f);
    std::vector<float> want = y;
    for (int64_t r = 0; r < sh.n_rows; ++r) sy::cpu::add_inplace(want.data() + r * sh.n, bias.data(), sh.n);

    guarded<float> d_y(y.size()), d_bias(bias.size());
    d_y.upload(y);
    d_bias.upload(bias);
    sy::cuda::add_bias(d_y.get(), d_bias.get(), sh.n_rows, sh.n, st);
    sync(st);
    check_bits(s, d_y.download(), want, "add_bias" + dims);
    check_bits(s, d_bias.download(), bias, "add_bias leaves the bias alone" + dims);
    check_guards(s, d_y, "add_bias" + dims);
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------------

void test_silu_mul(suite& s, cudaStream_t st) {
  for (const int64_t n : {int64_t{1}, int64_t{1536}, int64_t{1536 * 37}, int64_t{100003}}) {
    const std::string dims = " n " + std::to_string(n);
    const auto gate = random_floats(n, next_seed(), 4.f);
    const auto up = random_floats(n, next_seed(), 1.f);
    std::vector<float> want(n);
    sy::cpu::silu_mul(gate.data(), up.data(), want.data(), n);

    guarded<float> d_gate(n), d_up(n);
    guarded<uint16_t> d_out(n);
    d_gate.upload(gate);
    d_up.upload(up);
    d_out.poison();
    sy::cuda::silu_mul(d_gate.get(), d_up.get(), d_out.as_half(), n, st);
    sync(st);
    s.check_nmse(half_bits_to_float(d_out.download()), want, 1e-6, "silu_mul" + dims);
    check_guards(s, d_out, "silu_mul" + dims);
  }
}

// ---- KV write -------------------------------------------------------------------------------

void test_kv_write(suite& s, cudaStream_t st) {
  struct shape {
    int64_t n_tok, kv_dim, n_blocks, block_size;
  };
  // SmolLM2: kv_dim = 3 KV heads * 64.
  for (const shape sh : {shape{37, 192, 16, 16}, shape{1, 192, 4, 16}, shape{5, 7, 3, 4}, shape{256, 192, 16, 16}}) {
    const std::string dims = " tok " + std::to_string(sh.n_tok) + " kv_dim " + std::to_string(sh.kv_dim);
    const int64_t n_slots = sh.n_blocks * sh.block_size;
    const auto k = random_floats(sh.n_tok * sh.kv_dim, next_seed());
    const auto v = random_floats(sh.n_tok * sh.kv_dim, next_seed());
    std::vector<int32_t> slots(n_slots);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(next_seed()));
    slots.resize(sh.n_tok);           // distinct slots spread over the blocks
    if (sh.n_tok > 2) slots[2] = -1;  // a padding row writes nothing

    // Expected cache: the poison everywhere, the rounded rows at their slots.
    std::vector<uint16_t> want_k(n_slots * sh.kv_dim, 0xFFFF), want_v(want_k);
    for (int64_t t = 0; t < sh.n_tok; ++t) {
      if (slots[t] < 0) continue;
      for (int64_t j = 0; j < sh.kv_dim; ++j) {
        want_k[slots[t] * sh.kv_dim + j] = sy::cpu::fp32_to_fp16(k[t * sh.kv_dim + j]);
        want_v[slots[t] * sh.kv_dim + j] = sy::cpu::fp32_to_fp16(v[t * sh.kv_dim + j]);
      }
    }

    guarded<float> d_k(k.size()), d_v(v.size());
    guarded<int32_t> d_slots(slots.size());
    guarded<uint16_t> d_kc(want_k.size()), d_vc(want_v.size());
    d_k.upload(k);
    d_v.upload(v);
    d_slots.upload(slots);
    d_kc.poison();
    d_vc.poison();
    sy::cuda::kv_write(d_k.get(), d_v.get(), d_slots.get(), sh.n_tok, sh.kv_dim, d_kc.as_half(), d_vc.as_half(), st);
    sync(st);
    check_bits(s, d_kc.download(), want_k, "kv_write K cache" + dims);
    check_bits(s, d_vc.download(), want_v, "kv_write V cache" + dims);
    check_guards(s, d_kc, "kv_write K cache" + dims);
    check_guards(s, d_vc, "kv_write V cache" + dims);
  }
}

// ---- dequantize -----------------------------------------------------------------------------

void test_dequantize(suite& s, cudaStream_t st) {
  using sy::cpu::weight_type;
  struct shape {
    int64_t n_rows, n_cols;
  };
  for (const weight_type t : k_all_types) {
    const int64_t block = sy::cpu::block_elements(t);
    std::vector<shape> shapes;
    if (block == 256)
      shapes = {{256, 768}, {1536, 256}, {7, 512}, {3, 256}};
    else
      shapes = {{576, 576}, {1536, 576}, {7, 64}, {3, 32}};
    if (block == 1) shapes.insert(shapes.end(), {shape{5, 37}, shape{1, 1}});
    for (const shape sh : shapes) {
      const std::string what = std::string("dequantize_to_f16 ") + sy::cpu::weight_type_name(t) + " " +
                               std::to_string(sh.n_rows) + "x" + std::to_string(sh.n_cols);
      const auto src = sy::gpu_test::random_weights(t, sh.n_rows, sh.n_cols, next_seed());
      const size_t rb = sy::cpu::row_bytes(t, sh.n_cols);
      std::vector<float> row(sh.n_cols);
      std::vector<uint16_t> want(sh.n_rows * sh.n_cols);
      for (int64_t r = 0; r < sh.n_rows; ++r) {
        sy::cpu::dequantize_row(t, src.data() + r * rb, row.data(), sh.n_cols);
        for (int64_t c = 0; c < sh.n_cols; ++c) want[r * sh.n_cols + c] = sy::cpu::fp32_to_fp16(row[c]);
      }

      guarded<uint8_t> d_src(src.size());
      guarded<uint16_t> d_dst(want.size());
      d_src.upload(src);
      d_dst.poison();
      sy::cuda::dequantize_to_f16(d_src.get(), t, sh.n_rows, sh.n_cols, d_dst.as_half(), st);
      sync(st);
      check_bits(s, d_dst.download(), want, what);
      check_guards(s, d_dst, what);
    }
  }
  // A partial block is refused up front: 32 for the small blocks, 256 for the K-quants.
  auto refuses = [&](weight_type t, int64_t n_cols) {
    try {
      sy::cuda::dequantize_to_f16(nullptr, t, 1, n_cols, nullptr, st);
    } catch (const std::invalid_argument&) {
      return true;
    }
    return false;
  };
  s.check(refuses(weight_type::q8_0, 33), "dequantize_to_f16 refuses n_cols % 32 != 0 for q8_0");
  s.check(refuses(weight_type::q5_1, 48), "dequantize_to_f16 refuses n_cols % 32 != 0 for q5_1");
  for (const weight_type t : {weight_type::q4_k, weight_type::q5_k, weight_type::q6_k})
    s.check(refuses(t, 288),
            std::string("dequantize_to_f16 refuses n_cols % 256 != 0 for ") + sy::cpu::weight_type_name(t));
}

}  // namespace

int main() {
  return sy::gpu_test::run("cuda_ops", [](suite& s) {
    cudaStream_t st = nullptr;
    SY_CUDA_CHECK(cudaStreamCreate(&st));
    test_embedding(s, st);
    test_rms_norm(s, st);
    test_add_and_convert(s, st);
    test_rope(s, st);
    test_add_bias(s, st);
    test_silu_mul(s, st);
    test_kv_write(s, st);
    test_dequantize(s, st);
    SY_CUDA_CHECK(cudaStreamDestroy(st));
  });
}
