// AVX-512 kernels: BF16 dot-product GEMM over repacked panels, VNNI integer GEMV.
// Compiled with -mavx512{f,bw,vl,dq,vnni,bf16}; only called when cpu_features() says so.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {
namespace {

// P panels (16 rows each) x T tokens of accumulators, walking all of K.
template <int P, int T>
void panel_tile(const uint16_t* panels, int64_t k, const uint16_t* x, int64_t ldx, float* y,
                int64_t ldy, int64_t row0) {
  __m512 acc[P][T];
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
  const int64_t kp_n = k / 2;
  const int64_t panel_stride = panel_rows * k;
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    __m512i w[P];
    for (int p = 0; p < P; ++p)
      w[p] = _mm512_loadu_si512(panels + p * panel_stride + kp * 32);
    for (int t = 0; t < T; ++t) {
      int32_t pair;
      __builtin_memcpy(&pair, x + t * ldx + 2 * kp, 4);
      const __m512i b = _mm512_set1_epi32(pair);
      for (int p = 0; p < P; ++p)
        acc[p][t] = _mm512_dpbf16_ps(acc[p][t], (__m512bh)w[p], (__m512bh)b);
    }
  }
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ldy + row0 + p * panel_rows, acc[p][t]);
}

template <int P>
void panel_tile_tokens(const uint16_t* panels, int64_t k, const uint16_t* x, int64_t ldx,
                       int64_t n_tok, float* y, int64_t ldy, int64_t row0) {
  constexpr int tt = 6;
  int64_t t = 0;
  for (; t + tt <= n_tok; t += tt) panel_tile<P, tt>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0);
  switch (n_tok - t) {
    case 1: panel_tile<P, 1>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0); break;
    case 2: panel_tile<P, 2>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0); break;
    case 3: panel_tile<P, 3>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0); break;
    case 4: panel_tile<P, 4>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0); break;
    case 5: panel_tile<P, 5>(panels, k, x + t * ldx, ldx, y + t * ldy, ldy, row0); break;
    default: break;
  }
}

inline float hsum_ps_256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A weight row prepared for the multi-token integer kernel: unsigned 8-bit values u (k_pad,
// zero tail), per pair of blocks the expanded scales dw (16 floats), and per block the offset
// term mw such that w = dw * u + mw (q4_1: m; q4_0: -8 dw; q8_0 stored as u = q + 128: -128 dw).
struct prepared_row {
  alignas(64) uint8_t u[8192];
  alignas(64) float dwexp[8192 / 4];
  alignas(64) float mw[8192 / 32 + 16];
};

inline __m256i unpack_q4(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

void prepare_row(weight_type t, const uint8_t* row, int64_t nb, int64_t k_pad, prepared_row& pr) {
  for (int64_t i = 0; i < nb; ++i) {
    __m256i u;
    float dw, mw;
    switch (t) {
      case weight_type::q4_0: {
        const auto& b = reinterpret_cast<const block_q4_0*>(row)[i];
        u = unpack_q4(b.qs);
        dw = _cvtsh_ss(b.d);
        mw = -8.f * dw;
        break;
      }
      case weight_type::q4_1: {
        const auto& b = reinterpret_cast<const block_q4_1*>(row)[i];
        u = unpack_q4(b.qs);
        dw = _cvtsh_ss(b.d);
        mw = _cvtsh_ss(b.m);
        break;
      }
      default: {  // q8_0
        const auto& b = reinterpret_cast<const block_q8_0*>(row)[i];
        u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)), _mm256_set1_epi8(-128));
        dw = _cvtsh_ss(b.d);
        mw = -128.f * dw;
        break;
      }
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(pr.u + 32 * i), u);
    _mm256_store_ps(pr.dwexp + 8 * i, _mm256_set1_ps(dw));
    pr.mw[i] = mw;
  }
  for (int64_t i = nb; i < k_pad / 32; ++i) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(pr.u + 32 * i), _mm256_setzero_si256());
    _mm256_store_ps(pr.dwexp + 8 * i, _mm256_setzero_ps());
  }
  const int64_t nb_pad = (nb + 15) / 16 * 16;
  for (int64_t i = nb; i < nb_pad; ++i) pr.mw[i] = 0.f;
}

// One prepared row against T tokens (T <= 8), pairs of blocks per step.
template <int T>
void row_tokens(const prepared_row& pr, const q8_act_batch& a, int64_t t0, float* y, int64_t ldy, int64_t r) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const int64_t n_pairs = a.k_pad / 64;
  for (int64_t p = 0; p < n_pairs; ++p) {
    const __m512i w = _mm512_load_si512(pr.u + 64 * p);
    const __m512 dw = _mm512_load_ps(pr.dwexp + 16 * p);
    for (int t = 0; t < T; ++t) {
      const int64_t tt = t0 + t;
      const __m512i x = _mm512_loadu_si512(a.qs + tt * a.k_pad + 64 * p);
      const __m512 dx = _mm512_loadu_ps(a.dexp + tt * (a.k_pad / 4) + 16 * p);
      const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    const int64_t tt = t0 + t;
    __m512 m = _mm512_setzero_ps();
    for (int64_t i = 0; i < a.nb_pad; i += 16)
      m = _mm512_fmadd_ps(_mm512_load_ps(pr.mw + i), _mm512_loadu_ps(a.s + tt * a.nb_pad + i), m);
    y[tt * ldy + r] = _mm512_reduce_add_ps(acc[t]) + _mm512_reduce_add_ps(m);
  }
}

}  // namespace

void gemm_panels_avx512(const uint16_t* panels, int64_t k, int64_t p0, int64_t p1,
                        const uint16_t* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy) {
  constexpr int pp = 4;
  int64_t p = p0;
  for (; p + pp <= p1; p += pp)
    panel_tile_tokens<pp>(panels + p * panel_rows * k, k, x, ldx, n_tok, y, ldy, p * panel_rows);
  const uint16_t* rest = panels + p * panel_rows * k;
  switch (p1 - p) {
    case 1: panel_tile_tokens<1>(rest, k, x, ldx, n_tok, y, ldy, p * panel_rows); break;
    case 2: panel_tile_tokens<2>(rest, k, x, ldx, n_tok, y, ldy, p * panel_rows); break;
    case 3: panel_tile_tokens<3>(rest, k, x, ldx, n_tok, y, ldy, p * panel_rows); break;
    default: break;
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
      v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, _mm512_set1_ps(id)), _mm512_set1_ps(-127.f)), _mm512_set1_ps(127.f));
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

void gemv_q8act_avx512(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1,
                       const q8_act_batch& a, float* y, int64_t ldy) {
  static thread_local prepared_row pr;  // 43 KB per thread; rows up to 8192 wide
  for (int64_t r = r0; r < r1; ++r) {
    prepare_row(t, w + r * row_bytes, a.nb, a.k_pad, pr);
    int64_t t0 = 0;
    for (; t0 + 8 <= a.n_tok; t0 += 8) row_tokens<8>(pr, a, t0, y, ldy, r);
    switch (a.n_tok - t0) {
      case 1: row_tokens<1>(pr, a, t0, y, ldy, r); break;
      case 2: row_tokens<2>(pr, a, t0, y, ldy, r); break;
      case 3: row_tokens<3>(pr, a, t0, y, ldy, r); break;
      case 4: row_tokens<4>(pr, a, t0, y, ldy, r); break;
      case 5: row_tokens<5>(pr, a, t0, y, ldy, r); break;
      case 6: row_tokens<6>(pr, a, t0, y, ldy, r); break;
      case 7: row_tokens<7>(pr, a, t0, y, ldy, r); break;
      default: break;
    }
  }
}

}  // namespace sy::cpu
