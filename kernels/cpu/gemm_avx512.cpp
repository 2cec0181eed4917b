// AVX-512 kernels: BF16 dot-product GEMM over repacked panels, VNNI integer GEMV over
// repacked integer panels.
// Compiled with -mavx512{f,bw,vl,dq,vnni,bf16}. The BF16 GEMM and conversion only run where
// use_avx512_kernels(); the integer kernels and quantizers use no BF16 instruction and run where
// use_avx512_vnni_kernels() (also Ice Lake and Cascade Lake Xeons).
// GCC 12 flags the self-initialised placeholder inside _mm512_undefined_* that some intrinsics use
// (GCC bug 105593), a false positive; nothing else in this file needs the warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/cpu_features.hpp"
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
  int8_t* qs = a.qs + t * a.k;
  float* dd = a.d + t * a.nb_pad;
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
    dd[i] = d;
  }
  for (int64_t i = a.nb; i < a.nb_pad; ++i) s[i] = dd[i] = 0.f;
}

namespace {

// Where kq_line_prefetch() says so (Intel), the first pass of tokens over a panel (the one that
// streams it from memory) asks each line of a block into L1 this many lines ahead of its load (a
// panel's blocks lie in reading order, the next panel after it). Measured on the Sapphire
// Rapids-class VM (2026-12-06, the engine's steps of the 1B-shaped Q8_0 file, alternating): one
// token, none 50.9-51.1 ms, 8 lines 46.8-47.7, 16 45.7-47.1, 32 43.6-46.0, 48 43.5-44.0, 64
// 46.0-46.5; SmolLM2-135M Q4_1 none 3.26-3.41, 16 2.89-2.91. 32 lines for every pass size: 8
// tokens 68.3-69.1 -> 61.7-62.3 ms, 4 tokens 56.1-56.9 -> 52.7-52.9, and with the VNNI kernels
// forced (SY_CPU_ISA=avx512) 32 tokens 155-159 -> 148-155 ms; SmolLM2's 8 tokens 8.9-10.2 ->
// 6.7-6.8 ms.
constexpr int64_t int_prefetch_lines = 32;

// One 16-row panel against tokens [t0, t0 + T): per block, T int32 accumulators collect the
// block's 32 columns with vpdpbusd (16 rows per instruction, activations broadcast), then one
// conversion and two FMAs per token fold in d_w * d_x and m_w * s_x.
template <weight_type wt, int T>
void panel_tokens(const line64* panel, int64_t nb, const q8_act_batch& a, int64_t t0, float* y, int64_t ldy,
                  int64_t row0, int64_t n_rows, bool line_prefetch) {
  constexpr int64_t nl = n_int_lines(wt);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const int8_t* xq[T];
  for (int t = 0; t < T; ++t) xq[t] = a.qs + (t0 + t) * a.k;
  for (int64_t b = 0; b < nb; ++b) {
    const line64* blk = panel + b * int_block_lines(wt);
    if (line_prefetch)
      for (int64_t l = 0; l < int_block_lines(wt); ++l) __builtin_prefetch(blk + int_prefetch_lines + l, 0, 3);
    __m512i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
    auto dot = [&](__m512i w, int64_t col) {
      for (int t = 0; t < T; ++t) {
        int32_t x4;
        __builtin_memcpy(&x4, xq[t] + 32 * b + col, 4);
        isum[t] = _mm512_dpbusd_epi32(isum[t], w, _mm512_set1_epi32(x4));
      }
    };
    if constexpr (nl == 4) {
      const __m512i lo4 = _mm512_set1_epi8(0x0f);
      for (int g = 0; g < 4; ++g) {
        const __m512i v = _mm512_load_si512(blk + g);
        dot(_mm512_and_si512(v, lo4), 4 * g);
        dot(_mm512_and_si512(_mm512_srli_epi16(v, 4), lo4), 16 + 4 * g);
      }
    } else if constexpr (nl == 5) {
      // Nibbles as q4, each byte's fifth bit from line 4: group g's low columns have it at bit g,
      // the high ones at bit 4 + g; it lands at bit 4 (vpternlogd 0xEA: (a & b) | c).
      const __m512i lo4 = _mm512_set1_epi8(0x0f), h = _mm512_load_si512(blk + 4);
      auto group = [&](auto gc) {
        constexpr int g = decltype(gc)::value;
        const __m512i v = _mm512_load_si512(blk + g);
        const __m512i h_lo = _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(1 << g)), 4 - g);
        const __m512i h_hi = _mm512_srli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(static_cast<char>(16 << g))), g);
        dot(_mm512_ternarylogic_epi32(v, lo4, h_lo, 0xEA), 4 * g);
        dot(_mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), lo4, h_hi, 0xEA), 16 + 4 * g);
      };
      group(std::integral_constant<int, 0>{});
      group(std::integral_constant<int, 1>{});
      group(std::integral_constant<int, 2>{});
      group(std::integral_constant<int, 3>{});
    } else {
      for (int g = 0; g < 8; ++g) dot(_mm512_load_si512(blk + g), 4 * g);
    }
    const __m512 dw = _mm512_load_ps(blk[nl].b);
    const __m512 mw = int_panel_has_m(wt) ? _mm512_load_ps(blk[nl + 1].b)
                                          : _mm512_mul_ps(dw, _mm512_set1_ps(int_panel_offset(wt)));  // exact
    for (int t = 0; t < T; ++t) {
      const float dx = a.d[(t0 + t) * a.nb_pad + b];
      const float sx = a.s[(t0 + t) * a.nb_pad + b];
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[t]);
      acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), acc[t]);
    }
  }
  const __mmask16 keep = n_rows >= 16 ? __mmask16(0xffff) : __mmask16((1u << n_rows) - 1);
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ldy + row0, keep, acc[t]);
}

template <weight_type wt>
void int_panels(const line64* panels, int64_t rows, int64_t p0, int64_t p1, const q8_act_batch& a, float* y,
                int64_t ldy) {
  const int64_t nb = a.nb, stride = int_panel_lines(wt, a.nb * 32);
  constexpr int tt = 8;
  const bool line_prefetch = kq_line_prefetch();
  for (int64_t p = p0; p < p1; ++p) {
    const line64* panel = panels + p * stride;
    const int64_t row0 = p * 16, n_rows = std::min<int64_t>(16, rows - row0);
    int64_t t0 = 0;
    // The first pass over a panel streams it from memory; later passes find it in cache.
    for (; t0 + tt <= a.n_tok; t0 += tt)
      panel_tokens<wt, tt>(panel, nb, a, t0, y, ldy, row0, n_rows, line_prefetch && t0 == 0);
    using tail_fn =
        void (*)(const line64*, int64_t, const q8_act_batch&, int64_t, float*, int64_t, int64_t, int64_t, bool);
    static constexpr tail_fn tails[tt] = {nullptr,
                                          &panel_tokens<wt, 1>,
                                          &panel_tokens<wt, 2>,
                                          &panel_tokens<wt, 3>,
                                          &panel_tokens<wt, 4>,
                                          &panel_tokens<wt, 5>,
                                          &panel_tokens<wt, 6>,
                                          &panel_tokens<wt, 7>};
    if (const int64_t rest = a.n_tok - t0)
      tails[rest](panel, nb, a, t0, y, ldy, row0, n_rows, line_prefetch && t0 == 0);
  }
}

}  // namespace

void gemv_int_panels_avx512(weight_type t, const line64* panels, int64_t rows, int64_t p0, int64_t p1,
                            const q8_act_batch& a, float* y, int64_t ldy) {
  switch (t) {
    case weight_type::q4_0:
      return int_panels<weight_type::q4_0>(panels, rows, p0, p1, a, y, ldy);
    case weight_type::q4_1:
      return int_panels<weight_type::q4_1>(panels, rows, p0, p1, a, y, ldy);
    case weight_type::q5_0:
      return int_panels<weight_type::q5_0>(panels, rows, p0, p1, a, y, ldy);
    case weight_type::q5_1:
      return int_panels<weight_type::q5_1>(panels, rows, p0, p1, a, y, ldy);
    case weight_type::q8_0:
      return int_panels<weight_type::q8_0>(panels, rows, p0, p1, a, y, ldy);
    default:
      return;
  }
}

}  // namespace sy::cpu
