// The AVX-512 VNNI kernel over K panels (kquant_panels.hpp), bitwise the scalar model's results.
// Compiled with -mavx512{f,bw,vl,dq,vnni,bf16} but uses no BF16 instruction: only called when
// use_avx512_vnni_kernels(), which Ice Lake and Cascade Lake Xeons (no BF16) pass too.
//
// Per panel and super-block, per sub-block (pair) the weight lines are unpacked once into u8
// vectors (16 rows x 4 columns each) and every token of the group multiplies them with vpdpbusd
// against its 4 activation bytes broadcast; a sub-block's int32 sums take the row's scale with
// one vpmulld; the mins (q4_K/q5_K) or the q6_K offset are one vpdpwssd per scale pair against
// the activations' block sums; then two conversions and FMAs per super-block and token.
// GCC 12 flags the self-initialised placeholder inside _mm512_undefined_* that some intrinsics use
// (GCC bug 105593), a false positive, as "maybe" or, where it is inlined deeper, as
// -Wuninitialized; nothing else in this file needs either warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/kquant_panels.hpp"

namespace sy::cpu {
namespace {

inline __m512i bcast4(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
inline __m512i load_line(const line64* l) { return _mm512_load_si512(l); }
// acc + vpdpbusd(w, the 4 bytes at p broadcast), the broadcast folded into the instruction as a
// memory operand ({1to16}): one instruction instead of two (GCC 12 emits a separate vpbroadcastd
// for _mm512_set1_epi32 of a load). One thread, Zen 4: q4_K / q6_K at two tokens 167 / 111 -> 174
// / 114 GMAC/s, at one token streaming from memory ~2 % faster, four and more tokens unchanged.
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}
// 32 bytes -> 16 lanes of two 16-bit values (a scale/min pair per row), zero- or sign-extended.
inline __m512i pairs_u8(const uint8_t* p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p)); }
inline __m512i pairs_s8(const uint8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)p)); }
// Element 0 / 1 of each lane's 16-bit pair as int32 (sign-extended; the q4_K/q5_K pairs are < 64).
inline __m512i pair_lo(__m512i v) { return _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16); }
inline __m512i pair_hi(__m512i v) { return _mm512_srai_epi32(v, 16); }
// Element 0 times 16 (exact: |element| < 2^11).
inline __m512i pair_lo16(__m512i v) { return _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 12); }

// An empty asm that takes v in a register: the sum before it is formed here, in source order.
// GCC 12 otherwise multiplies every pair's sums first and adds them up at the end, spilling the
// products (at 4 tokens, 81 registers spilled a super-block for q6_K, 30 for q4_K).
inline void pin(__m512i& v) { asm("" : "+v"(v)); }

// Shift of 16-bit lanes by a compile-time amount, left when positive.
template <int S>
inline __m512i shift16(__m512i v) {
  if constexpr (S > 0) return _mm512_slli_epi16(v, S);
  if constexpr (S < 0) return _mm512_srli_epi16(v, -S);
  return v;
}

// q6_K, sub-block pair j (sub-blocks j, low nibbles, and 8 + j, high): the rows' integer sums
// against T tokens before their scales, each line's 6-bit values unpacked once for all T.
template <int T>
[[gnu::always_inline]] inline void q6_pair_sums(const line64* blk, int j, const block_q8_K* const* x, __m512i* s_lo,
                                                __m512i* s_hi) {
  constexpr weight_type wt = weight_type::q6_k;
  const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(0x30);
  for (int t = 0; t < T; ++t) s_lo[t] = s_hi[t] = _mm512_setzero_si512();
  auto line = [&](auto cc) __attribute__((always_inline)) {
    constexpr int c = decltype(cc)::value;
    const __m512i v = load_line(blk + kq_at(wt, 4 * j + c));
    const __m512i h = load_line(blk + kq_at(wt, 32 + 2 * j + c / 2));
    const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, m4), _mm512_and_si512(shift16<4 - 4 * (c % 2)>(h), m3));
    const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                       _mm512_and_si512(shift16<2 - 4 * (c % 2)>(h), m3));
    for (int t = 0; t < T; ++t) {
      s_lo[t] = dpbusd_bcast(s_lo[t], lo, x[t]->qs + 16 * j + 4 * c);
      s_hi[t] = dpbusd_bcast(s_hi[t], hi, x[t]->qs + 128 + 16 * j + 4 * c);
    }
  };
  line(std::integral_constant<int, 0>{});
  line(std::integral_constant<int, 1>{});
  line(std::integral_constant<int, 2>{});
  line(std::integral_constant<int, 3>{});
}
// The rows' scales of sub-blocks j and 8 + j as int32 lanes.
[[gnu::always_inline]] inline void q6_pair_scales(const line64* blk, int j, __m512i& sc_lo, __m512i& sc_hi) {
  constexpr weight_type wt = weight_type::q6_k;
  const __m512i sp_lo = pairs_s8(blk[kq_at(wt, 48 + j / 4)].b + 32 * (j / 2 % 2));
  const __m512i sp_hi = pairs_s8(blk[kq_at(wt, 48 + (8 + j) / 4)].b + 32 * ((8 + j) / 2 % 2));
  sc_lo = j % 2 ? pair_hi(sp_lo) : pair_lo(sp_lo);
  sc_hi = j % 2 ? pair_hi(sp_hi) : pair_lo(sp_hi);
}
// The stored values are q + 32: a super-block's sums start at -32 * sum_j sc_j * bsums_j (exact
// int32, so the order of the additions does not matter), one per token.
template <int T>
[[gnu::always_inline]] inline void q6_offsets(const line64* blk, const block_q8_K* const* x, __m512i* start) {
  constexpr weight_type wt = weight_type::q6_k;
  __m512i sp[8];
  for (int q = 0; q < 8; ++q) sp[q] = pairs_s8(blk[kq_at(wt, 48 + q / 2)].b + 32 * (q % 2));
  for (int t = 0; t < T; ++t) {
    __m512i off = _mm512_setzero_si512();
    for (int q = 0; q < 8; ++q) off = _mm512_dpwssd_epi32(off, sp[q], bcast4(x[t]->bsums + 2 * q));
    start[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(off, 5));
  }
}

// q6_K against 8 tokens at once (kq_panels takes q6_K's tokens 8 at a time where a token block
// has 16 or more): each line's unpacking (two loads and ten instructions) serves 16 vpdpbusd
// instead of 8. The 2 x T sub-block sums fill the registers, so the super-block's scaled sums live
// in memory (L1), touched once per sub-block pair. Two threads, Zen 4, a 32768 x 2048 matrix from
// memory: 242-244 -> 253-256 GMAC/s at 32 tokens, 252-253 -> 270-273 at 128 (from L3: 272 -> 297
// at 32); q6_K is ~30 % of a decode step at 32 sequences of a Q4_K_M file (its output head and half
// its down projections), where the gain (~1 %) is inside the VM's run-to-run noise. The same
// grouping did not help q4_K (its unpacking is two instructions a line) nor q5_K.
template <int T>
[[gnu::always_inline]] inline void kq_q6_wide(const line64* blk, const block_q8_K* const* x, __m512* acc) {
  alignas(64) int32_t isum[T][16];
  {
    __m512i start[T];
    q6_offsets<T>(blk, x, start);
    for (int t = 0; t < T; ++t) _mm512_store_si512(isum[t], start[t]);
  }
  for (int j = 0; j < 8; ++j) {
    __m512i s_lo[T], s_hi[T], sc_lo, sc_hi;
    q6_pair_sums<T>(blk, j, x, s_lo, s_hi);
    q6_pair_scales(blk, j, sc_lo, sc_hi);
    for (int t = 0; t < T; ++t) {
      const __m512i add = _mm512_add_epi32(_mm512_mullo_epi32(s_lo[t], sc_lo), _mm512_mullo_epi32(s_hi[t], sc_hi));
      _mm512_store_si512(isum[t], _mm512_add_epi32(_mm512_load_si512(isum[t]), add));
    }
  }
  const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)blk[kq_at(weight_type::q6_k, 52)].b));
  for (int t = 0; t < T; ++t)
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(isum[t])), _mm512_mul_ps(dw, _mm512_set1_ps(x[t]->d)),
                             acc[t]);
}

// One super-block of one panel against T tokens (x: their q8_K blocks of it): adds to acc[t].
template <weight_type wt, int T>
[[gnu::always_inline]] inline void kq_block(const line64* blk, const block_q8_K* const* x, __m512* acc) {
  constexpr int64_t lines = kq_lines(wt);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  if constexpr (wt == weight_type::q6_k && T > 4) {
    kq_q6_wide<T>(blk, x, acc);
    return;
  }
  __m512i isum[T];
  if constexpr (wt == weight_type::q6_k) {
    q6_offsets<T>(blk, x, isum);  // the sums' start, taken first while few registers are live
    auto pair = [&](auto jc) {
      constexpr int j = decltype(jc)::value;
      __m512i sc_lo, sc_hi, s_lo[T], s_hi[T];
      q6_pair_scales(blk, j, sc_lo, sc_hi);
      q6_pair_sums<T>(blk, j, x, s_lo, s_hi);
      for (int t = 0; t < T; ++t) {
        isum[t] = _mm512_add_epi32(
            isum[t], _mm512_add_epi32(_mm512_mullo_epi32(s_lo[t], sc_lo), _mm512_mullo_epi32(s_hi[t], sc_hi)));
        pin(isum[t]);
      }
    };
    pair(std::integral_constant<int, 0>{});
    pair(std::integral_constant<int, 1>{});
    pair(std::integral_constant<int, 2>{});
    pair(std::integral_constant<int, 3>{});
    pair(std::integral_constant<int, 4>{});
    pair(std::integral_constant<int, 5>{});
    pair(std::integral_constant<int, 6>{});
    pair(std::integral_constant<int, 7>{});
    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)blk[kq_at(wt, 52)].b));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, _mm512_set1_ps(x[t]->d)), acc[t]);
  } else {
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
    constexpr int64_t s0 = lines - 5;  // scales, mins, d/dmin
    const __m512i m10 = _mm512_set1_epi8(0x10);
    auto pair = [&](auto gc) {
      constexpr int g = decltype(gc)::value;  // sub-blocks 2g (low nibbles) and 2g + 1 (high)
      const __m512i sp = pairs_u8(blk[kq_at(wt, s0 + g / 2)].b + 32 * (g % 2));
      // q4_K: the high nibbles stay in place (16 x their value), so the low ones' scale is 16x.
      const __m512i sc_lo = wt == weight_type::q4_k ? pair_lo16(sp) : pair_lo(sp), sc_hi = pair_hi(sp);
      __m512i s_lo[T], s_hi[T];
      for (int t = 0; t < T; ++t) s_lo[t] = s_hi[t] = _mm512_setzero_si512();
      auto line = [&](auto cc) {
        constexpr int c = decltype(cc)::value;
        const __m512i v = load_line(blk + kq_at(wt, 8 * g + c));
        __m512i lo = _mm512_and_si512(v, m4);
        __m512i hi =
            wt == weight_type::q4_k ? _mm512_andnot_si512(m4, v) : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if constexpr (wt == weight_type::q5_k) {
          const __m512i h = load_line(blk + kq_at(wt, 32 + 2 * g + c / 4));
          lo = _mm512_or_si512(lo, _mm512_and_si512(shift16<4 - 2 * (c % 4)>(h), m10));
          hi = _mm512_or_si512(hi, _mm512_and_si512(shift16<3 - 2 * (c % 4)>(h), m10));
        }
        for (int t = 0; t < T; ++t) {
          s_lo[t] = dpbusd_bcast(s_lo[t], lo, x[t]->qs + 64 * g + 4 * c);
          s_hi[t] = dpbusd_bcast(s_hi[t], hi, x[t]->qs + 64 * g + 32 + 4 * c);
        }
      };
      line(std::integral_constant<int, 0>{});
      line(std::integral_constant<int, 1>{});
      line(std::integral_constant<int, 2>{});
      line(std::integral_constant<int, 3>{});
      line(std::integral_constant<int, 4>{});
      line(std::integral_constant<int, 5>{});
      line(std::integral_constant<int, 6>{});
      line(std::integral_constant<int, 7>{});
      for (int t = 0; t < T; ++t) {
        isum[t] = _mm512_add_epi32(
            isum[t], _mm512_add_epi32(_mm512_mullo_epi32(s_lo[t], sc_lo), _mm512_mullo_epi32(s_hi[t], sc_hi)));
        pin(isum[t]);
      }
    };
    pair(std::integral_constant<int, 0>{});
    pair(std::integral_constant<int, 1>{});
    pair(std::integral_constant<int, 2>{});
    pair(std::integral_constant<int, 3>{});
    if constexpr (wt == weight_type::q4_k)
      for (int t = 0; t < T; ++t) isum[t] = _mm512_srai_epi32(isum[t], 4);  // exact: a multiple of 16
    __m512i mp[4];
    for (int q = 0; q < 4; ++q) mp[q] = pairs_u8(blk[kq_at(wt, s0 + 2 + q / 2)].b + 32 * (q % 2));
    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)blk[kq_at(wt, lines - 1)].b));
    const __m512 dmw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)(blk[kq_at(wt, lines - 1)].b + 32)));
    for (int t = 0; t < T; ++t) {
      __m512i ms = _mm512_setzero_si512();
      for (int q = 0; q < 4; ++q) ms = _mm512_dpwssd_epi32(ms, mp[q], bcast4(x[t]->sums32 + 2 * q));
      const __m512 dx = _mm512_set1_ps(x[t]->d);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, dx), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dmw, dx), acc[t]);
    }
  }
}

// Sums acc[t] (tokens t0 + t < t0 + n) into rows [row0, row0 + n_rows) of y.
inline void store_sums(const __m512* acc, int64_t n, float* y, int64_t ldy, int64_t t0, int64_t row0, int64_t n_rows) {
  const __mmask16 keep = n_rows >= 16 ? __mmask16(0xffff) : __mmask16((1u << n_rows) - 1);
  for (int64_t t = 0; t < n; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ldy + row0, keep, acc[t]);
}

// One panel against tokens [t0, t0 + T) (more than kq_group_tokens): y[(t0 + t) * ldy + row0 + i],
// the sums in registers; `stream`: the first token group of a block, which reads the panel from
// memory, each next super-block a group apart (prefetched one ahead: with it 16- and 32-token
// products from DRAM were 4-15 % faster than with the panels contiguous, 262,144 x 2048 q4_K on a
// Sapphire Rapids VM). Out of line: inlined into kq_panels with its lambdas, GCC's
// code for 32 tokens ran at two thirds of the speed (the same code, 8,192 x 2048 q4_K). Flattened
// (everything it calls inlined), as kq_group is: GCC's own choice kept some instantiations' sub-
// block pair lambdas out of line, which one more caller of them could tip (q4_K at 8 tokens from
// L3 ran at 200 GMAC/s that way against 330 inlined; two threads, AMD Zen 4).
template <weight_type wt, int T>
[[gnu::noinline, gnu::flatten]] void kq_tokens(kq_panel panel, int64_t nb, const block_q8_K* a, int64_t t0, float* y,
                                               int64_t ldy, int64_t row0, int64_t n_rows, bool stream) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const block_q8_K* x[T];
    for (int t = 0; t < T; ++t) x[t] = a + (t0 + t) * nb + b;
    if (stream && b + 1 < nb) kq_prefetch_block(panel.block(b + 1), kq_lines(wt));
    kq_block<wt, T>(panel.block(b), x, acc);
  }
  store_sums(acc, T, y, ldy, t0, row0, n_rows);
}

// The panels of a group (ps: n_ps of them, from panel p) against all n_tok tokens (decode, up to
// kq_group_tokens): super-block b of each panel in turn, which is the order they lie in memory,
// each against the tokens in groups of 4 (kq_token_groups); the sums on the stack. Flattened (see
// kq_tokens): 1-4 tokens 0-10 % faster than with GCC's choice.
template <weight_type wt>
[[gnu::flatten]] void kq_group(const kq_panel* ps, int n_ps, int64_t nb, const block_q8_K* a, int64_t n_tok, float* y,
                               int64_t ldy, int64_t p, int64_t rows, bool line_prefetch) {
  constexpr int64_t lines = kq_lines(wt);
  __m512 acc[kq_group_panels][kq_group_tokens];
  for (int j = 0; j < n_ps && j < kq_group_panels; ++j)
    for (int64_t t = 0; t < n_tok && t < kq_group_tokens; ++t) acc[j][t] = _mm512_setzero_ps();
  const bool prefetch = n_tok <= 2 && line_prefetch;  // decode streams the weights from memory
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < n_ps; ++j) {
      const line64* blk = ps[j].block(b);
      if (prefetch) kq_prefetch_ahead(blk, lines);
      auto tokens = [&](auto tc, int64_t t0) {
        constexpr int T = decltype(tc)::value;
        const block_q8_K* x[T];
        for (int t = 0; t < T; ++t) x[t] = a + (t0 + t) * nb + b;
        kq_block<wt, T>(blk, x, acc[j] + t0);
      };
      kq_token_groups<4>(0, n_tok, tokens);
    }
  for (int j = 0; j < n_ps; ++j) {
    const int64_t row0 = (p + j) * panel_rows;
    store_sums(acc[j], n_tok, y, ldy, 0, row0, std::min<int64_t>(panel_rows, rows - row0));
  }
}

template <weight_type wt>
void kq_panels(const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1, const block_q8_K* a,
               int64_t n_tok, float* y, int64_t ldy) {
  const int64_t nb = k / qk_k;
  if (n_tok <= kq_group_tokens) {
    const bool line_prefetch = kq_line_prefetch();
    kq_for_panel_groups(panels, wt, rows, nb, p0, p1, [&](const kq_panel* ps, int n_ps, int64_t p) {
      kq_group<wt>(ps, n_ps, nb, a, n_tok, y, ldy, p, rows, line_prefetch);
    });
    return;
  }
  kq_for_panels(panels, wt, rows, nb, p0, p1, n_tok,
                [&](auto tc, kq_panel panel, int64_t t0, int64_t row0, int64_t n_rows, bool first) {
                  kq_tokens<wt, decltype(tc)::value>(panel, nb, a, t0, y, ldy, row0, n_rows, first);
                });
}

}  // namespace

void quantize_row_q8_K_avx512(const float* x, block_q8_K* y, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), exp_mask = _mm512_set1_epi32(0x7f800000);
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) {
    block_q8_K& b = y[i];
    // The largest magnitude, and whether every value is finite (an all-ones exponent is not).
    __m512 amax = _mm512_setzero_ps();
    __mmask16 nonfinite = 0;
    for (int j = 0; j < qk_k; j += 16) {
      const __m512i bits = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x + j)), abs_mask);
      nonfinite |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exp_mask), exp_mask);
      amax = _mm512_max_ps(amax, _mm512_castsi512_ps(bits));
    }
    const float m = _mm512_reduce_max_ps(amax);
    if (nonfinite != 0 || m == 0) {
      set_q8_K_unscaled(b, nonfinite == 0);
      continue;
    }
    // The first element of that magnitude gives the scale its sign (the scalar loop's strict >).
    const __m512 mv = _mm512_set1_ps(m);
    float vmax = 0;
    for (int j = 0; j < qk_k; j += 16) {
      const __m512 v = _mm512_loadu_ps(x + j);
      const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(v), mv, _CMP_EQ_OQ);
      if (hit != 0) {
        vmax = x[j + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.f / vmax;
    const __m512 is = _mm512_set1_ps(iscale);
    for (int g = 0; g < 16; ++g) {
      // Converted with rounding to nearest even (nearbyint in the default mode) named in the
      // instruction; the narrowing saturates to [-128, 127] as the scalar clamp does.
      const __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(x + 16 * g)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b.qs + 16 * g), _mm512_cvtsepi32_epi8(q));
    }
    // Sums of the stored int8 values, 16 at a time: each 128-bit lane of a 64-byte load is one
    // group; the bytes + 128 summed by vpsadbw into its two quadwords, then 16 * 128 taken off.
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i lane_sums[4];
    for (int v = 0; v < 4; ++v) {
      const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(b.qs + 64 * v), bias);
      const __m512i sad = _mm512_sad_epu8(u, _mm512_setzero_si512());
      lane_sums[v] = _mm512_add_epi64(sad, _mm512_shuffle_epi32(sad, _MM_PERM_BADC));  // both halves: the sum
    }
    // Quadwords 0, 2, 4, 6 of each: groups 4v .. 4v + 3.
    const __m512i pick = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i g0_7 = _mm512_permutex2var_epi64(lane_sums[0], pick, lane_sums[1]);
    const __m512i g8_15 = _mm512_permutex2var_epi64(lane_sums[2], pick, lane_sums[3]);
    const __m256i sums16 = _mm256_sub_epi16(_mm256_set_m128i(_mm512_cvtepi64_epi16(g8_15), _mm512_cvtepi64_epi16(g0_7)),
                                            _mm256_set1_epi16(16 * 128));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.bsums), sums16);
    // Pairs: the sums of 32.
    const __m256i pairs = _mm256_madd_epi16(sums16, _mm256_set1_epi16(1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.sums32), _mm256_cvtepi32_epi16(pairs));
    b.d = 1.f / iscale;
  }
}

void gemv_kq_panels_avx512(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                           const block_q8_K* a, int64_t n_tok, float* y, int64_t ldy) {
  kq_for_type(t, [&](auto wt) { kq_panels<decltype(wt)::value>(panels, rows, k, p0, p1, a, n_tok, y, ldy); });
}

}  // namespace sy::cpu
