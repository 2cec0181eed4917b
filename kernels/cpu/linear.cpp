#include "kernels/cpu/linear.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace sy::cpu {
namespace {

// Per-calling-thread scratch for converted activations (the step loop calls from one thread;
// pool workers only read it during the call).
struct scratch {
  std::vector<block_q8_act> q8;
  std::vector<int8_t> q8_qs;
  std::vector<float> q8_d, q8_s;
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
};
thread_local scratch tls_scratch;

// Activation conversions before a product: split over the pool from this many tokens on.
constexpr int64_t k_parallel_tokens = 16;

}  // namespace

linear::linear(weight_type type, const void* data, int64_t rows, int64_t cols, thread_pool& pool)
    : type_(type), data_(static_cast<const uint8_t*>(data)), rows_(rows), cols_(cols) {
  if (cols % qk != 0)
    throw std::runtime_error("linear: input width " + std::to_string(cols) + " is not a multiple of 32");
  row_bytes_ = static_cast<int64_t>(row_bytes(type, cols));
  n_panels_ = (rows + panel_rows - 1) / panel_rows;
  panels_.assign(static_cast<size_t>(n_panels_ * panel_rows * cols), 0);
  pool.run([&](int ith, int nth) {
    int64_t p0, p1;
    thread_pool::split(n_panels_, 1, ith, nth, p0, p1);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t p = p0; p < p1; ++p) {
      uint16_t* panel = panels_.data() + p * panel_rows * cols;
      for (int i = 0; i < panel_rows; ++i) {
        const int64_t r = p * panel_rows + i;
        if (r >= rows) break;
        dequantize_row(type_, data_ + r * row_bytes_, row.data(), cols);
        for (int64_t kp = 0; kp < cols / 2; ++kp) {
          panel[kp * 32 + 2 * i] = fp32_to_bf16(row[2 * kp]);
          panel[kp * 32 + 2 * i + 1] = fp32_to_bf16(row[2 * kp + 1]);
        }
      }
    }
  });
  const auto& f = cpu_features();
  if (has_integer_path() && f.avx512 && f.avx512_vnni) {
    int_panels_.resize(static_cast<size_t>(n_panels_ * int_panel_lines(type_, cols)));
    pool.run([&](int ith, int nth) {
      int64_t p0, p1;
      thread_pool::split(n_panels_, 1, ith, nth, p0, p1);
      repack_int_panels(type_, data_, row_bytes_, rows_, cols_, p0, p1, int_panels_.data());
    });
  }
}

void repack_int_panels(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                       int64_t p1, line64* out) {
  const int64_t nb = k / qk, nl = n_int_lines(t), stride = int_panel_lines(t, k);
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t b = 0; b < nb; ++b) {
      line64* blk = out + p * stride + b * (nl + 2);
      std::memset(blk, 0, static_cast<size_t>(nl + 2) * sizeof(line64));
      float* d = reinterpret_cast<float*>(blk[nl].b);
      float* m = reinterpret_cast<float*>(blk[nl + 1].b);
      for (int i = 0; i < panel_rows; ++i) {
        const int64_t r = p * panel_rows + i;
        if (r >= rows) break;
        const uint8_t* row = w + r * row_bytes;
        uint8_t u[32];  // q4: the 16 GGUF nibble bytes; q8_0: 32 bytes q + 128
        if (t == weight_type::q4_0) {
          const auto& blk0 = reinterpret_cast<const block_q4_0*>(row)[b];
          d[i] = fp16_to_fp32(blk0.d);
          m[i] = -8.f * d[i];
          std::memcpy(u, blk0.qs, 16);
        } else if (t == weight_type::q4_1) {
          const auto& blk1 = reinterpret_cast<const block_q4_1*>(row)[b];
          d[i] = fp16_to_fp32(blk1.d);
          m[i] = fp16_to_fp32(blk1.m);
          std::memcpy(u, blk1.qs, 16);
        } else {
          const auto& blk8 = reinterpret_cast<const block_q8_0*>(row)[b];
          d[i] = fp16_to_fp32(blk8.d);
          m[i] = -128.f * d[i];
          for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(blk8.qs[j] + 128);
        }
        for (int64_t g = 0; g < nl; ++g) std::memcpy(blk[g].b + 4 * i, u + 4 * g, 4);
      }
    }
}

bool linear::has_integer_path() const {
  return (type_ == weight_type::q4_0 || type_ == weight_type::q4_1 || type_ == weight_type::q8_0) &&
         cols_ <= k_max_int_cols;
}

void linear::forward_gemv(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy, thread_pool& pool) const {
  const linear_out out{this, y, ldy};
  forward_gemv_fused({&out, 1}, x, ldx, n_tok, pool);
}

// One pool job over the panels of all layers in `outs`, concatenated and split evenly between the
// threads: fn(i, p0, p1) runs panels [p0, p1) of layer i.
template <class F>
void linear::for_panels(std::span<const linear_out> outs, thread_pool& pool, F&& fn) {
  int64_t total = 0;
  for (const auto& o : outs) total += o.w->n_panels_;
  pool.run([&](int ith, int nth) {
    int64_t p0, p1;
    thread_pool::split(total, 1, ith, nth, p0, p1);
    int64_t base = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      const int64_t n = outs[i].w->n_panels_;
      const int64_t b0 = std::max(p0, base) - base, b1 = std::min(p1, base + n) - base;
      if (b0 < b1) fn(i, b0, b1);
      base += n;
    }
  });
}

void forward_gemv_fused(std::span<const linear_out> outs, const float* x, int64_t ldx, int64_t n_tok,
                        thread_pool& pool) {
  if (outs.empty() || n_tok == 0) return;
  const int64_t cols = outs[0].w->cols();
  bool int_panels = use_avx512_kernels();
  for (const auto& o : outs) {
    if (o.w->cols() != cols) throw std::invalid_argument("forward_gemv_fused: layers differ in input width");
    int_panels = int_panels && o.w->has_integer_path() && !o.w->int_panels_.empty();
  }
  if (!int_panels) {
    for (const auto& o : outs) o.w->forward_gemv_portable(x, ldx, n_tok, o.y, o.ldy, pool);
    return;
  }
  // Activations quantized once for every layer, then one job over all their panels.
  q8_act_batch a;
  a.n_tok = n_tok;
  a.k = cols;
  a.nb = cols / qk;
  a.nb_pad = (a.nb + 15) / 16 * 16;
  auto& sc = tls_scratch;
  sc.q8_qs.resize(static_cast<size_t>(n_tok * cols));
  sc.q8_d.resize(static_cast<size_t>(n_tok * a.nb_pad));
  sc.q8_s.resize(static_cast<size_t>(n_tok * a.nb_pad));
  a.qs = sc.q8_qs.data();
  a.d = sc.q8_d.data();
  a.s = sc.q8_s.data();
  pool.for_each(n_tok, k_parallel_tokens, [&](int64_t t) { quantize_q8_act_avx512(x + t * ldx, a, t); });
  linear::for_panels(outs, pool, [&](size_t i, int64_t b0, int64_t b1) {
    const linear& w = *outs[i].w;
    gemv_int_panels_avx512(w.type_, w.int_panels_.data(), w.rows_, b0, b1, a, outs[i].y, outs[i].ldy);
  });
}

void linear::forward_gemv_portable(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy,
                                   thread_pool& pool) const {
  if (!has_integer_path()) return forward_gemm(x, ldx, n_tok, y, ldy, pool);
  const int64_t nb = cols_ / qk;
  auto& q8 = tls_scratch.q8;
  q8.resize(static_cast<size_t>(n_tok * nb));
  for (int64_t t = 0; t < n_tok; ++t) quantize_row_q8_act(x + t * ldx, q8.data() + t * nb, cols_);
  const block_q8_act* a = q8.data();
  pool.run([&](int ith, int nth) {
    int64_t r0, r1;
    thread_pool::split(rows_, 16, ith, nth, r0, r1);
    // Rows in chunks that stay in L1 while every token passes over them.
    for (int64_t c = r0; c < r1; c += 32) {
      const int64_t c1 = std::min(c + 32, r1);
      for (int64_t t = 0; t < n_tok; ++t)
        gemv_q8act_avx2(type_, data_, row_bytes_, c, c1, a + t * nb, cols_, y + t * ldy);
    }
  });
}

void linear::forward_gemm(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy, thread_pool& pool) const {
  const linear_out out{this, y, ldy};
  forward_gemm_fused({&out, 1}, x, ldx, n_tok, pool);
}

void forward_gemm_fused(std::span<const linear_out> outs, const float* x, int64_t ldx, int64_t n_tok,
                        thread_pool& pool) {
  if (outs.empty() || n_tok == 0) return;
  const int64_t cols = outs[0].w->cols();
  for (const auto& o : outs)
    if (o.w->cols() != cols) throw std::invalid_argument("forward_gemm_fused: layers differ in input width");
  // Panels cover whole 16-row groups: a layer whose rows are not a multiple of 16 runs alone,
  // its tail computed into a scratch and copied.
  if (outs.size() > 1)
    for (const auto& o : outs)
      if (o.w->rows() % panel_rows != 0) {
        for (const auto& one : outs) forward_gemm_fused({&one, 1}, x, ldx, n_tok, pool);
        return;
      }
  const linear& w0 = *outs[0].w;
  const bool ragged = w0.rows() % panel_rows != 0;
  float* y0 = outs[0].y;
  int64_t ld0 = outs[0].ldy;
  if (ragged) {
    tls_scratch.f32.resize(static_cast<size_t>(n_tok * w0.n_panels_ * panel_rows));
    y0 = tls_scratch.f32.data();
    ld0 = w0.n_panels_ * panel_rows;
  }
  const bool wide = use_avx512_kernels();
  const uint16_t* xb = nullptr;
  if (wide) {  // activations converted to bf16 once for every layer
    auto& buf = tls_scratch.bf16;
    buf.resize(static_cast<size_t>(n_tok * cols));
    uint16_t* xbw = buf.data();
    pool.for_each(n_tok, k_parallel_tokens,
                  [&](int64_t t) { convert_f32_to_bf16_avx512(x + t * ldx, xbw + t * cols, cols); });
    xb = xbw;
  }
  linear::for_panels(outs, pool, [&](size_t i, int64_t b0, int64_t b1) {
    const linear& w = *outs[i].w;
    float* y = i == 0 ? y0 : outs[i].y;
    const int64_t ldy = i == 0 ? ld0 : outs[i].ldy;
    if (wide)
      gemm_panels_avx512(w.panels_.data(), cols, b0, b1, xb, cols, n_tok, y, ldy);
    else
      gemm_panels_avx2(w.panels_.data(), cols, b0, b1, x, ldx, n_tok, y, ldy);
  });
  if (ragged)
    for (int64_t t = 0; t < n_tok; ++t) std::copy(y0 + t * ld0, y0 + t * ld0 + w0.rows(), outs[0].y + t * outs[0].ldy);
}

}  // namespace sy::cpu
