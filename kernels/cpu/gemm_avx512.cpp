// AVX-512 kernels: BF16 dot-product GEMM over repacked panels, VNNI integer GEMV.
// Compiled with -mavx512{f,bw,vl,dq,vnni,bf16}; only called when cpu_features() says so.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {
namespace {

// P panels (16 rows each) x T tokens of accumulators, walking all of K.
template <int P, int T>
void panel_tile(const uint16_t* panels, int64_t k, const uint16_t* x, int64_t ldx, float* y, int64_t ldy,
                int64_t row0) {
  __m512 acc[P][T];
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
  const int64_t kp_n = k / 2;
  const int64_t panel_stride = panel_rows * k;
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    __m512i w[P];
    for (int p = 0; p < P; ++p) w[p] = _mm512_loadu_si512(panels + p * panel_stride + kp * 32);
    for (int t = 0; t < T; ++t) {
      int32_t pair;
      __builtin_memcpy(&pair, x + t * ldx + 2 * kp, 4);
      const __m512i b = _mm512_set1_epi32(pair);
      for (int p = 0; p < P; ++p) acc[p][t] = _mm512_dpbf16_ps(acc[p][t], (__m512bh)w[p], (__m512bh)b);
    }
  }
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ldy + row0 + p * panel_rows, acc[p][t]);
}

template <int P>
void panel_tile_tokens(const uint16_t* panels, int64_t k, const uint16_t* x, int64_t ldx, int64_t n_tok, float* y,
                       int64_t ldy, int64_t row0) {
  constexpr int tt = 6;
  int64_t t = 0;
  for (; t + tt <= n_tok; t += tt) panel_tile<P, tt>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
  switch (n_tok - t) {
    case 1:
      panel_tile<P, 1>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
      break;
    case 2:
      panel_tile<P, 2>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
      break;
    case 3:
      panel_tile<P, 3>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
      break;
    case 4:
      panel_tile<P, 4>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
      break;
    case 5:
      panel_tile<P, 5>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
      break;
    default:
      break;
  }
}

inline float hsum_ps_256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i unpack_q4(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// Block i of a weight row as 32 unsigned bytes u with w = dw * u + mw
// (q4_1: m; q4_0: -8 dw; q8_0 read as u = q + 128: -128 dw).
template <weight_type t>
inline __m256i load_block(const uint8_t* row, int64_t i, float& dw, float& mw) {
  if constexpr (t == weight_type::q4_0) {
    const auto& b = reinterpret_cast<const block_q4_0*>(row)[i];
    dw = _cvtsh_ss(b.d);
    mw = -8.f * dw;
    return unpack_q4(b.qs);
  } else if constexpr (t == weight_type::q4_1) {
    const auto& b = reinterpret_cast<const block_q4_1*>(row)[i];
    dw = _cvtsh_ss(b.d);
    mw = _cvtsh_ss(b.m);
    return unpack_q4(b.qs);
  } else {
    const auto& b = reinterpret_cast<const block_q8_0*>(row)[i];
    dw = _cvtsh_ss(b.d);
    mw = -128.f * dw;
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)), _mm256_set1_epi8(-128));
  }
}

// One weight row against tokens [t0, t0 + T), two blocks per 512-bit step; the weights are
// unpacked once into registers and shared by the T tokens. The instruction sequence for one
// (row, token) pair is the same for every T.
template <weight_type wt, int T>
void row_tokens(const uint8_t* row, const q8_act_batch& a, int64_t t0, float* y, int64_t ldy, int64_t r) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  alignas(64) float mw[k_max_int_cols / qk + 16];
  const int64_t nb = a.nb;
  auto step = [&](__m512i w, __m512 dw, int64_t p) {
    for (int t = 0; t < T; ++t) {
      const int64_t tt = t0 + t;
      const __m512i x = _mm512_loadu_si512(a.qs + tt * a.k_pad + 64 * p);
      const __m512 dx = _mm512_loadu_ps(a.dexp + tt * (a.k_pad / 4) + 16 * p);
      const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc[t]);
    }
  };
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    float d0, d1;
    const __m256i u0 = load_block<wt>(row, i, d0, mw[i]);
    const __m256i u1 = load_block<wt>(row, i + 1, d1, mw[i + 1]);
    step(_mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1),
         _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(d1), 1), i / 2);
  }
  if (i < nb) {  // odd block count: the upper half is zero (activations are zero-padded too)
    float d0;
    const __m256i u0 = load_block<wt>(row, i, d0, mw[i]);
    step(_mm512_inserti64x4(_mm512_setzero_si512(), u0, 0),
         _mm512_insertf32x8(_mm512_setzero_ps(), _mm256_set1_ps(d0), 0), i / 2);
  }
  for (int64_t j = nb; j < a.nb_pad; ++j) mw[j] = 0.f;
  for (int t = 0; t < T; ++t) {
    const int64_t tt = t0 + t;
    __m512 m = _mm512_setzero_ps();
    for (int64_t j = 0; j < a.nb_pad; j += 16)
      m = _mm512_fmadd_ps(_mm512_load_ps(mw + j), _mm512_loadu_ps(a.s + tt * a.nb_pad + j), m);
    y[tt * ldy + r] = _mm512_reduce_add_ps(acc[t]) + _mm512_reduce_add_ps(m);
  }
}

}  // namespace

void gemm_panels_avx512(const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const uint16_t* x, int64_t ldx,
                        int64_t n_tok, float* y, int64_t ldy) {
  constexpr int pp = 4;
  int64_t p = p0;
  for (; p + pp <= p1; p += pp)
    panel_tile_tokens<pp>(panels + p * panel_rows * k, k, x, ldx, n_tok, y, ldy, p * panel_rows);
  const uint16_t* rest = panels + p * panel_rows * k;
  switch (p1 - p) {
    case 1:
      panel_tile_tokens<1>(rest, k, x, ldx, n_tok, y, ldy, p * panel_rows);
      break;
    case 2:
      panel_tile_tokens<2>(rest, k, x, ldx, n_tok, y, ldy, p * panel_rows);
      break;
    case 3:
      panel_tile_tokens<3>(rest, k, x, ldx, n_tok, y, ldy, p * panel_rows);
      break;
    default:
      break;
  }
}

void convert_f32_to_bf16_avx512(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(out + i, (__m512i)v);
  }
  for (; i < n; ++i) out[i] = fp32_to_bf16(x[i]);
}

void quantize_q8_act_avx512(const float* x, q8_act_batch& a, int64_t t) {
  int8_t* qs = a.qs + t * a.k_pad;
  float* dexp = a.dexp + t * (a.k_pad / 4);
  float* s = a.s + t * a.nb_pad;
  const __m512 sign_off = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < a.nb; ++i) {
    const __m512 x0 = _mm512_loadu_ps(x + 32 * i), x1 = _mm512_loadu_ps(x + 32 * i + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(x0, sign_off), _mm512_and_ps(x1, sign_off)));
    const float d = amax / 127.f;
    const float id = d > 0 && d < INFINITY ? 1.f / d : 0.f;
    // Clamped before conversion (also maps NaN into range), rounded half to even.
    auto q = [&](__m512 v) {
      v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, _mm512_set1_ps(id)), _mm512_set1_ps(-127.f)),
                        _mm512_set1_ps(127.f));
      return _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    };
    const __m512i q0 = q(x0), q1 = q(x1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * i), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * i + 16), _mm512_cvtsepi32_epi8(q1));
    s[i] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    _mm256_storeu_ps(dexp + 8 * i, _mm256_set1_ps(d));
  }
  for (int64_t i = a.nb; i < a.k_pad / 32; ++i) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * i), _mm256_setzero_si256());
    _mm256_storeu_ps(dexp + 8 * i, _mm256_setzero_ps());
  }
  for (int64_t i = a.nb; i < a.nb_pad; ++i) s[i] = 0.f;
}

template <weight_type wt>
void gemv_rows(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const q8_act_batch& a, float* y,
               int64_t ldy) {
  // Rows in chunks whose weights stay in L1 while every group of 8 tokens (whose activations
  // also fit in L1) passes over them: neither side is re-read from L2 per (row, token).
  constexpr int64_t chunk = 32;
  for (int64_t c0 = r0; c0 < r1; c0 += chunk) {
    const int64_t c1 = std::min(c0 + chunk, r1);
    int64_t t0 = 0;
    for (; t0 + 8 <= a.n_tok; t0 += 8)
      for (int64_t r = c0; r < c1; ++r) row_tokens<wt, 8>(w + r * row_bytes, a, t0, y, ldy, r);
    const int64_t rest = a.n_tok - t0;
    for (int64_t r = c0; r < c1 && rest > 0; ++r) {
      const uint8_t* row = w + r * row_bytes;
      switch (rest) {
        case 1:
          row_tokens<wt, 1>(row, a, t0, y, ldy, r);
          break;
        case 2:
          row_tokens<wt, 2>(row, a, t0, y, ldy, r);
          break;
        case 3:
          row_tokens<wt, 3>(row, a, t0, y, ldy, r);
          break;
        case 4:
          row_tokens<wt, 4>(row, a, t0, y, ldy, r);
          break;
        case 5:
          row_tokens<wt, 5>(row, a, t0, y, ldy, r);
          break;
        case 6:
          row_tokens<wt, 6>(row, a, t0, y, ldy, r);
          break;
        case 7:
          row_tokens<wt, 7>(row, a, t0, y, ldy, r);
          break;
        default:
          break;
      }
    }
  }
}

void gemv_q8act_avx512(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1,
                       const q8_act_batch& a, float* y, int64_t ldy) {
  switch (t) {
    case weight_type::q4_0:
      return gemv_rows<weight_type::q4_0>(w, row_bytes, r0, r1, a, y, ldy);
    case weight_type::q4_1:
      return gemv_rows<weight_type::q4_1>(w, row_bytes, r0, r1, a, y, ldy);
    case weight_type::q8_0:
      return gemv_rows<weight_type::q8_0>(w, row_bytes, r0, r1, a, y, ldy);
    default:
      return;
  }
}

}  // namespace sy::cpu
