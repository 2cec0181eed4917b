// K panels (kquant_panels.hpp) to bf16 panels (gemm_kernels.hpp) with AVX-512: the prompt GEMM's
// weights for q4_K/q5_K/q6_K, built per step and panel. Lane-parallel: a K-panel line holds 16
// rows' 4 consecutive values side by side (one 32-bit lane per row), and a bf16 panel line 16
// rows' pairs of columns the same way, so each line of values becomes two bf16 lines with 16-lane
// instructions and no pass through per-row f32 buffers. The values are those of
// dequantize_kq_panel_row with the same operations in the same order (d * scale, then value *
// that - dmin * min, each rounded to f32; no fused multiply-add), rounded to bf16 as
// store_panel_row does: bitwise pack_bf16_panels_from_kq's scalar panels (tests/unit/
// test_kquant_panels.cpp). Compiled with -mavx512{f,bw,vl,dq,vnni,bf16}; only called when
// use_avx512_kernels().
// GCC 12 flags the self-initialised placeholder inside _mm512_undefined_* that some intrinsics use
// (GCC bug 105593), a false positive, as "maybe" or, where it is inlined deeper, as
// -Wuninitialized; nothing else in this file needs either warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/cpu/kquant_panels.hpp"

namespace sy::cpu {
namespace {

// Two f32 vectors (columns c and c + 1 of 16 rows) as one bf16 line: lane i = (lo_i, hi_i), each
// rounded to nearest even by the integer rule store_panel_row uses.
inline __m512i bf16_line(__m512 lo, __m512 hi) {
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  __m512i a = _mm512_castps_si512(lo), b = _mm512_castps_si512(hi);
  a = _mm512_add_epi32(a, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(a, 16), one)));
  b = _mm512_add_epi32(b, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(b, 16), one)));
  return _mm512_or_si512(_mm512_srli_epi32(a, 16), _mm512_and_si512(b, _mm512_set1_epi32(int(0xffff0000u))));
}

// One line of values (byte kk of lane i = row i's value of column col + kk, at most 63) into bf16
// lines col / 2 and col / 2 + 1 of `panel` (col even): s * x - m per value (q6_K: s * (x - 32),
// Offset), lanes outside `keep` zero.
template <bool Offset>
inline void put4(__m512i v, __m512 s, __m512 m, __mmask16 keep, uint16_t* panel, int64_t col) {
  const __m512i byte = _mm512_set1_epi32(0xff);
  __m512 f[4];
  for (int kk = 0; kk < 4; ++kk) {
    __m512i x = _mm512_and_si512(_mm512_srli_epi32(v, 8 * kk), byte);
    if constexpr (Offset) {
      x = _mm512_sub_epi32(x, _mm512_set1_epi32(32));
      f[kk] = _mm512_maskz_mul_ps(keep, s, _mm512_cvtepi32_ps(x));
    } else {
      f[kk] = _mm512_maskz_sub_ps(keep, _mm512_mul_ps(s, _mm512_cvtepi32_ps(x)), m);
    }
  }
  _mm512_storeu_si512(panel + (col / 2) * 32, bf16_line(f[0], f[1]));
  _mm512_storeu_si512(panel + (col / 2 + 1) * 32, bf16_line(f[2], f[3]));
}

// Row i's byte e (0 or 1) of its 16-bit pair in a scale/min line half (bytes 2i, 2i + 1), as f32.
inline __m512 pair_u8(const uint8_t* half, int e) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(half)));
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(w, 8 * e), _mm512_set1_epi32(0xff)));
}
inline __m512 pair_s8(const uint8_t* half, int e) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(half)));
  return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w, 24 - 8 * e), 24));
}
// Sub-block j's byte of every row in the pair lines from `first` (kquant_panels.hpp's layout).
template <weight_type wt>
inline const uint8_t* pair_half(const line64* blk, int64_t first, int j) {
  return blk[kq_at(wt, first + j / 4)].b + 32 * (j / 2 % 2);
}

template <weight_type wt>
void pack_from_kq(const line64* kq_panels, int64_t rows, int64_t k, int64_t p0, int64_t p1, uint16_t* out) {
  constexpr int64_t lines = kq_lines(wt);
  const int64_t nb = k / qk_k;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  for (int64_t p = p0; p < p1; ++p) {
    const kq_panel panel = kq_panel_of(kq_panels, wt, nb, kq_n_panels(rows), p);
    uint16_t* dst = out + (p - p0) * panel_rows * k;
    const int64_t left = rows - p * panel_rows;
    const __mmask16 keep = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    for (int64_t b = 0; b < nb; ++b) {
      const line64* blk = panel.block(b);
      if (b + 1 < nb) kq_prefetch_block(panel.block(b + 1), lines);
      uint16_t* col0 = dst + b * qk_k * 16;  // column b * 256 of the panel
      const __m512 d =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[kq_at(wt, lines - 1)].b)));
      if constexpr (wt == weight_type::q6_k) {
        const __m512i m3 = _mm512_set1_epi8(0x03);
        for (int j = 0; j < 8; ++j) {  // sub-blocks j (low nibbles) and 8 + j (high), 4 lines each
          const __m512 s_lo = _mm512_mul_ps(d, pair_s8(pair_half<wt>(blk, 48, j), j % 2));
          const __m512 s_hi = _mm512_mul_ps(d, pair_s8(pair_half<wt>(blk, 48, 8 + j), j % 2));
          for (int cc = 0; cc < 4; ++cc) {
            const int L = 4 * j + cc;
            const __m512i v = _mm512_load_si512(blk + kq_at(wt, L));
            const __m512i h = _mm512_srl_epi32(_mm512_load_si512(blk + kq_at(wt, 32 + 2 * j + cc / 2)),
                                               _mm_cvtsi32_si128(4 * (cc % 2)));
            const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, m4), _mm512_slli_epi32(_mm512_and_si512(h, m3), 4));
            const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(v, 4), m4),
                                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 2), m3), 4));
            put4<true>(lo, s_lo, s_lo, keep, col0, 4 * L);
            put4<true>(hi, s_hi, s_hi, keep, col0, 128 + 4 * L);
          }
        }
        continue;
      }
      const __m512 dmin =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[kq_at(wt, lines - 1)].b + 32)));
      constexpr int64_t s0 = lines - 5;
      for (int g = 0; g < 4; ++g) {
        const __m512 s_lo = _mm512_mul_ps(d, pair_u8(pair_half<wt>(blk, s0, 2 * g), 0));
        const __m512 s_hi = _mm512_mul_ps(d, pair_u8(pair_half<wt>(blk, s0, 2 * g + 1), 1));
        const __m512 m_lo = _mm512_mul_ps(dmin, pair_u8(pair_half<wt>(blk, s0 + 2, 2 * g), 0));
        const __m512 m_hi = _mm512_mul_ps(dmin, pair_u8(pair_half<wt>(blk, s0 + 2, 2 * g + 1), 1));
        for (int c = 0; c < 8; ++c) {
          const __m512i v = _mm512_load_si512(blk + kq_at(wt, 8 * g + c));
          __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
          if constexpr (wt == weight_type::q5_k) {
            const __m512i one = _mm512_set1_epi8(1);
            const __m512i h = _mm512_srl_epi32(_mm512_load_si512(blk + kq_at(wt, 32 + 2 * g + c / 4)),
                                               _mm_cvtsi32_si128(2 * (c % 4)));
            lo = _mm512_or_si512(lo, _mm512_slli_epi32(_mm512_and_si512(h, one), 4));
            hi = _mm512_or_si512(hi, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 1), one), 4));
          }
          put4<false>(lo, s_lo, m_lo, keep, col0, 64 * g + 4 * c);
          put4<false>(hi, s_hi, m_hi, keep, col0, 64 * g + 32 + 4 * c);
        }
      }
    }
  }
}

}  // namespace

void pack_bf16_panels_from_kq_avx512(weight_type t, const line64* kq_panels, int64_t rows, int64_t k, int64_t p0,
                                     int64_t p1, uint16_t* out) {
  switch (t) {
    case weight_type::q4_k:
      return pack_from_kq<weight_type::q4_k>(kq_panels, rows, k, p0, p1, out);
    case weight_type::q5_k:
      return pack_from_kq<weight_type::q5_k>(kq_panels, rows, k, p0, p1, out);
    case weight_type::q6_k:
      return pack_from_kq<weight_type::q6_k>(kq_panels, rows, k, p0, p1, out);
    default:
      return;
  }
}

}  // namespace sy::cpu
