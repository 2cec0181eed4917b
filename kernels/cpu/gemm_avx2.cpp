// Portable (x86-64-v3: AVX2, FMA, F16C) kernels: f32 FMA GEMM over bf16 panels, and integer
// GEMV with maddubs. Same results as the AVX-512 kernels up to float summation order.
#include <immintrin.h>

#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {
namespace {

inline float hsum_ps_256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

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

inline __m256i unpack_q4(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// Sum of u8 x s8 products in 8 int32 lanes (no overflow: |15 * 127 * 2| < 2^15, and the
// q8 path feeds |w| <= 127 times sign-adjusted a: 2 * 127 * 127 < 2^15).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

template <class Block>
void gemv_q4(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_act* a, int64_t nb, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const Block* b = reinterpret_cast<const Block*>(w + r * row_bytes);
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0;
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
      const __m256i isum = dot_u8s8(unpack_q4(b[i].qs), aq);
      const float dw = _cvtsh_ss(b[i].d);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * a[i].d), acc);
      if constexpr (sizeof(Block) == sizeof(block_q4_1)) {
        acc_m += _cvtsh_ss(reinterpret_cast<const block_q4_1&>(b[i]).m) * a[i].s;
      } else {
        acc_m -= 8.f * dw * a[i].s;
      }
    }
    y[r] = hsum_ps_256(acc) + acc_m;
  }
}

void gemv_q8(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_act* a, int64_t nb, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const block_q8_0* b = reinterpret_cast<const block_q8_0*>(w + r * row_bytes);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs));
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
      const __m256i isum = dot_u8s8(_mm256_abs_epi8(wq), _mm256_sign_epi8(aq, wq));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(_cvtsh_ss(b[i].d) * a[i].d), acc);
    }
    y[r] = hsum_ps_256(acc);
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

void gemv_q8act_avx2(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_act* a,
                     int64_t k, float* y) {
  const int64_t nb = k / qk;
  switch (t) {
    case weight_type::q4_0:
      gemv_q4<block_q4_0>(w, row_bytes, r0, r1, a, nb, y);
      break;
    case weight_type::q4_1:
      gemv_q4<block_q4_1>(w, row_bytes, r0, r1, a, nb, y);
      break;
    case weight_type::q8_0:
      gemv_q8(w, row_bytes, r0, r1, a, nb, y);
      break;
    default:
      break;
  }
}

}  // namespace sy::cpu
