#include "kernels/cpu/linear.hpp"

#include <algorithm>
#include <cstdlib>
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
  std::vector<float> q8_dexp, q8_s;
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
};
thread_local scratch tls_scratch;

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
}

bool linear::has_integer_path() const {
  return (type_ == weight_type::q4_0 || type_ == weight_type::q4_1 || type_ == weight_type::q8_0) &&
         cols_ <= k_max_int_cols;
}

void linear::forward_gemv(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy, thread_pool& pool) const {
  if (!has_integer_path()) return forward_gemm(x, ldx, n_tok, y, ldy, pool);
  const int64_t nb = cols_ / qk;
  if (use_avx512_kernels()) {
    q8_act_batch a;
    a.n_tok = n_tok;
    a.k = cols_;
    a.k_pad = (cols_ + 63) / 64 * 64;
    a.nb = nb;
    a.nb_pad = (nb + 15) / 16 * 16;
    auto& sc = tls_scratch;
    sc.q8_qs.resize(static_cast<size_t>(n_tok * a.k_pad));
    sc.q8_dexp.resize(static_cast<size_t>(n_tok * a.k_pad / 4));
    sc.q8_s.resize(static_cast<size_t>(n_tok * a.nb_pad));
    a.qs = sc.q8_qs.data();
    a.dexp = sc.q8_dexp.data();
    a.s = sc.q8_s.data();
    for (int64_t t = 0; t < n_tok; ++t) quantize_q8_act_avx512(x + t * ldx, a, t);
    pool.run([&](int ith, int nth) {
      int64_t r0, r1;
      thread_pool::split(rows_, 16, ith, nth, r0, r1);
      gemv_q8act_avx512(type_, data_, row_bytes_, r0, r1, a, y, ldy);
    });
    return;
  }
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
  // Panels cover whole 16-row groups: when rows_ is not a multiple of 16 the tail is computed
  // into a scratch and copied.
  const bool ragged = rows_ % panel_rows != 0;
  float* out = y;
  int64_t ldo = ldy;
  if (ragged) {
    tls_scratch.f32.resize(static_cast<size_t>(n_tok * n_panels_ * panel_rows));
    out = tls_scratch.f32.data();
    ldo = n_panels_ * panel_rows;
  }
  if (use_avx512_kernels()) {
    auto& xb = tls_scratch.bf16;
    xb.resize(static_cast<size_t>(n_tok * cols_));
    for (int64_t t = 0; t < n_tok; ++t) convert_f32_to_bf16_avx512(x + t * ldx, xb.data() + t * cols_, cols_);
    const uint16_t* xbp = xb.data();
    pool.run([&](int ith, int nth) {
      int64_t p0, p1;
      thread_pool::split(n_panels_, 1, ith, nth, p0, p1);
      gemm_panels_avx512(panels_.data(), cols_, p0, p1, xbp, cols_, n_tok, out, ldo);
    });
  } else {
    pool.run([&](int ith, int nth) {
      int64_t p0, p1;
      thread_pool::split(n_panels_, 1, ith, nth, p0, p1);
      gemm_panels_avx2(panels_.data(), cols_, p0, p1, x, ldx, n_tok, out, ldo);
    });
  }
  if (ragged)
    for (int64_t t = 0; t < n_tok; ++t) std::copy(out + t * ldo, out + t * ldo + rows_, y + t * ldy);
}

}  // namespace sy::cpu
