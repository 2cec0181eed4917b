// AVX-512 kernels: BF16 dot-product GEMM over repacked panels, VNNI integer GEMV.
// Compiled with -mavx512{f,bw,vl,dq,vnni,bf16}; only called when cpu_features() says so.
#include <immintrin.h>

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

// 32 nibbles of a q4 block as 32 unsigned bytes in element order.
inline __m256i unpack_q4(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

template <class Block>
void gemv_q4(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_act* a,
             int64_t nb, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const Block* b = reinterpret_cast<const Block*>(w + r * row_bytes);
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0;
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i wq = unpack_q4(b[i].qs);
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
      const __m256i isum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, aq);
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

void gemv_q8(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_act* a,
             int64_t nb, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const block_q8_0* b = reinterpret_cast<const block_q8_0*>(w + r * row_bytes);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs));
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
      // dpbusd multiplies unsigned by signed: move w's sign onto a.
      const __m256i isum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wq),
                                               _mm256_sign_epi8(aq, wq));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(_cvtsh_ss(b[i].d) * a[i].d), acc);
    }
    y[r] = hsum_ps_256(acc);
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

void gemv_q8act_avx512(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1,
                       const block_q8_act* a, int64_t k, float* y) {
  const int64_t nb = k / qk;
  switch (t) {
    case weight_type::q4_0: gemv_q4<block_q4_0>(w, row_bytes, r0, r1, a, nb, y); break;
    case weight_type::q4_1: gemv_q4<block_q4_1>(w, row_bytes, r0, r1, a, nb, y); break;
    case weight_type::q8_0: gemv_q8(w, row_bytes, r0, r1, a, nb, y); break;
    default: break;
  }
}

}  // namespace sy::cpu
