// Portable (x86-64-v3: AVX2, FMA, F16C) f32 FMA GEMM over bf16 panels (prompt tokens). Same
// results as the AVX-512 BF16 kernel up to the rounding of the activations to bf16 there.
#include <immintrin.h>

#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {
namespace {

// One panel (16 rows) x T tokens. Each 32-bit lane of a panel load holds one row's pair
// (k even in the low half, k odd in the high half); bf16 -> f32 is a 16-bit shift.
template <int T>
void panel_tile(const uint16_t* panel, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t row0) {
  __m256 lo[T], hi[T];
  for (int t = 0; t < T; ++t) lo[t] = hi[t] = _mm256_setzero_ps();
  const __m256i mask_hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t kp = 0; kp < k / 2; ++kp) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + kp * 32));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + kp * 32 + 16));
    const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
    const __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(w0, mask_hi));
    const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
    const __m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(w1, mask_hi));
    for (int t = 0; t < T; ++t) {
      const __m256 xe = _mm256_broadcast_ss(x + t * ldx + 2 * kp);
      const __m256 xo = _mm256_broadcast_ss(x + t * ldx + 2 * kp + 1);
      lo[t] = _mm256_fmadd_ps(o0, xo, _mm256_fmadd_ps(e0, xe, lo[t]));
      hi[t] = _mm256_fmadd_ps(o1, xo, _mm256_fmadd_ps(e1, xe, hi[t]));
    }
  }
  for (int t = 0; t < T; ++t) {
    _mm256_storeu_ps(y + t * ldy + row0, lo[t]);
    _mm256_storeu_ps(y + t * ldy + row0 + 8, hi[t]);
  }
}

}  // namespace

void gemm_panels_avx2(const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const float* x, int64_t ldx,
                      int64_t n_tok, float* y, int64_t ldy) {
  constexpr int tt = 4;
  for (int64_t p = p0; p < p1; ++p) {
    const uint16_t* panel = panels + p * panel_rows * k;
    const int64_t row0 = p * panel_rows;
    int64_t t = 0;
    for (; t + tt <= n_tok; t += tt) panel_tile<tt>(panel, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
    switch (n_tok - t) {
      case 1:
        panel_tile<1>(panel, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
        break;
      case 2:
        panel_tile<2>(panel, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
        break;
      case 3:
        panel_tile<3>(panel, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
        break;
      default:
        break;
    }
  }
}

}  // namespace sy::cpu
