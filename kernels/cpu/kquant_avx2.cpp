// The AVX2 kernel over K panels (kquant_panels.hpp), bitwise the scalar model's results: the
// kernel of every x86-64-v3 CPU without AVX-512 VNNI (AMD EPYC before Zen 4, Xeons before Cascade
// Lake), and of SY_CPU_ISA=avx2.
//
// A panel line is two halves of 32 bytes, rows 0-7 and rows 8-15; each half is one ymm of 8
// lanes, lane i = 4 bytes of row 8h + i, so the kernel runs the AVX-512 kernel's arithmetic on
// two registers per line, one for each half. Without vpdpbusd the u8 x s8
// products go through vpmaddubsw (pairs summed into int16) and are added up in int16 across the
// lines of a sub-block for as long as that cannot overflow (values < 2^w, activations >= -128:
// one vpmaddubsw lane is at most 2 * (2^w - 1) * 128 in magnitude, so 8 lines for q4_K, 4 for
// q5_K and 2 for q6_K stay below 2^15); one vpmaddwd against the row's scale, duplicated into
// both 16-bit halves of its lane, then gives the int32 sum already scaled. The integer sums are
// exact either way, so the results are the model's bit for bit (tests/unit/test_kquant_panels.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/kquant_panels.hpp"

namespace sy::cpu {
namespace {

inline __m256i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
inline __m256i load_half(const line64* l, int h) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(l->b + 32 * h));
}
// load_half that the compiler cannot merge with another load of the same line.
inline __m256i load_half_again(const line64* l, int h) {
  __m256i v;
  asm volatile("vmovdqa %1, %0" : "=x"(v) : "m"(*reinterpret_cast<const __m256i*>(l->b + 32 * h)));
  return v;
}
// 16 bytes -> 8 lanes of two 16-bit values (a scale/min pair per row), zero- or sign-extended.
inline __m256i pairs_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i pairs_s8(const uint8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// Element 0 / 1 of each lane's 16-bit pair, in both halves of the lane.
inline __m256i dup_lo(__m256i v) {
  const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
  return _mm256_or_si256(lo, _mm256_slli_epi32(lo, 16));
}
inline __m256i dup_hi(__m256i v) {
  const __m256i hi = _mm256_srli_epi32(v, 16);
  return _mm256_or_si256(hi, _mm256_slli_epi32(hi, 16));
}
// Element nib of each row's pair of bytes p[2r], p[2r + 1] (rows r = 0..7), zero-extended into
// both 16-bit halves of lane r.
template <int nib>
inline __m256i scale_pair(const uint8_t* p) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  constexpr char z = -128, a = nib;
  const __m256i m = _mm256_setr_epi8(a, z, a, z, a + 2, z, a + 2, z, a + 4, z, a + 4, z, a + 6, z, a + 6, z, a + 8, z,
                                     a + 8, z, a + 10, z, a + 10, z, a + 12, z, a + 12, z, a + 14, z, a + 14, z);
  return _mm256_shuffle_epi8(v, m);
}
// An empty asm that takes v in a register: the add before it happens here, in source order. GCC
// otherwise computes a run's products first and sums them later, spilling most of them (q4_K at 8+
// tokens: 138 -> 168 GMAC/s). q6_K's 2-line runs instead unpack both lines first and then take
// the tokens one at a time (93-106 -> 122-125 GMAC/s at 8-32 tokens).
inline void pin(__m256i& v) { asm("" : "+x"(v)); }
template <int S>
inline __m256i shift16(__m256i v) {
  if constexpr (S > 0) return _mm256_slli_epi16(v, S);
  if constexpr (S < 0) return _mm256_srli_epi16(v, -S);
  return v;
}

template <class F, int... I>
[[gnu::always_inline]] inline void unroll(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}

// One half line's values: nibble `nib` (0 low, 1 high) of each byte of v with its high bits
// from hb (the line of fifth bits, q5_K; of top two bits, q6_K) in place, as u8 of 8 rows x 4
// columns. q5_K: line c of a sub-block pair, d = c % 4 (its bits in hb: 2d low, 2d + 1 high);
// q6_K: line c, odd = c % 2 (its bits in hb at 4 odd + 2 nib). kq_halves unpacks the same values
// inline, written out there: with these helpers in its one-token loop GCC scheduled that loop
// differently and q6_K at one token ran 8-15 % slower (Zen 4, AVX2 forced).
template <int nib, int d>
[[gnu::always_inline]] inline __m256i q5_values(__m256i v, __m256i hb) {
  const __m256i lo4 = _mm256_and_si256(nib ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
  return _mm256_or_si256(lo4, _mm256_and_si256(shift16<4 - nib - 2 * d>(hb), _mm256_set1_epi8(0x10)));
}
[[gnu::always_inline]] inline __m256i q6_values(__m256i v, __m256i hb, int nib, int odd) {
  const __m256i lo4 = _mm256_and_si256(nib ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
  const __m256i hs =
      odd ? (nib ? _mm256_srli_epi16(hb, 2) : hb) : (nib ? _mm256_slli_epi16(hb, 2) : _mm256_slli_epi16(hb, 4));
  return _mm256_or_si256(lo4, _mm256_and_si256(hs, _mm256_set1_epi8(0x30)));
}

// Prompts: a q5_K or q6_K super-block's values unpacked once, into L1, for every token group of
// a pass (kq_group), instead of once per group: [sub-block pair][line of it][nibble][half] (q5_K:
// 4 pairs of 8 lines, q6_K: 8 of 4), 128 ymm. Two threads, AMD Zen 4 with the AVX2 kernels
// forced, 131,072 x 2048 matrices, alternating with the kernel before: q5_K at 12 / 16 / 24 / 32 /
// 128 tokens 129 / 137 / 151 / 156 / 166 -> 134 / 150 / 176 / 180-185 / 200-206 GMAC/s, the 1B
// Q5_K_M file's pp512 143-160 -> 163-204 tok/s; q6_K at 32 / 64 / 128 156 / 155 / 160 -> 161 / 163
// / 169, flat at 8-24. Not q4_K (two instructions a line to unpack: at 8-16 tokens it was 10-25 %
// slower this way), nor a single group (decode of up to 4 sequences, 8 for q6_K: the weights come
// from memory once, nothing to share; docs/cpu-backend.md, "K panels").
constexpr int kq_unpacked_vectors = 128;
constexpr int q5_unpacked_at(int g, int c, int nib, int hh) { return ((8 * g + c) * 2 + nib) * 2 + hh; }
constexpr int q6_unpacked_at(int j, int c, int nib, int hh) { return ((4 * j + c) * 2 + nib) * 2 + hh; }
inline void q5_unpack(const line64* blk, int halves, __m256i* out) {
  constexpr weight_type wt = weight_type::q5_k;
  for (int g = 0; g < 4; ++g)
    for (int hh = 0; hh < halves; ++hh)
      for (int h4 = 0; h4 < 2; ++h4) {
        const __m256i hb = load_half(blk + kq_at(wt, 32 + 2 * g + h4), hh);
        unroll(
            [&](auto dc) __attribute__((always_inline)) {
              constexpr int d = decltype(dc)::value;
              const int c = 4 * h4 + d;
              const __m256i v = load_half(blk + kq_at(wt, 8 * g + c), hh);
              out[q5_unpacked_at(g, c, 0, hh)] = q5_values<0, d>(v, hb);
              out[q5_unpacked_at(g, c, 1, hh)] = q5_values<1, d>(v, hb);
            },
            std::make_integer_sequence<int, 4>{});
      }
}
inline void q6_unpack(const line64* blk, int halves, __m256i* out) {
  constexpr weight_type wt = weight_type::q6_k;
  for (int j = 0; j < 8; ++j)
    for (int hh = 0; hh < halves; ++hh)
      for (int c = 0; c < 4; ++c) {
        const __m256i v = load_half(blk + kq_at(wt, 4 * j + c), hh);
        const __m256i hb = load_half(blk + kq_at(wt, 32 + 2 * j + c / 2), hh);
        out[q6_unpacked_at(j, c, 0, hh)] = q6_values(v, hb, 0, c % 2);
        out[q6_unpacked_at(j, c, 1, hh)] = q6_values(v, hb, 1, c % 2);
      }
}

// The first H halves (rows 8h..8h + 7 each; H = 1 for a last panel of 8 rows or fewer) of one
// super-block against T tokens: adds to acc[h][t] (rows of S sums). Both halves at once share each activation
// broadcast and give the core two independent chains (q4_K on the Sapphire Rapids VM, 1-4 tokens:
// 110-115 GMAC/s against 83-97 for one half after the other). The low nibbles' sub-block, then the
// high nibbles', so that only one int16 sum per (half, token) is live. From 4 tokens on the
// sub-block pairs (groups) run as a loop, not unrolled: unrolled, one super-block at 4 tokens is
// 2000-2700 instructions for q4_K / q5_K, and at 8 for q6_K (its groups of 8: kq_panels) twice
// that, which crowds the core's op cache and L1i. Zen 4 VM, two threads, 16384 or 32768 x 2048,
// alternating: q4_K at 4 / 32 / 512 tokens 202-209 / 231 / 216-218 -> 227-232 / 246 / 224-227
// GMAC/s, q5_K 140-146 / 148-165 / 159-161 -> 149-157 / 169-172 / 163-165, q6_K at 4 98-108 ->
// 110-115, at 32 (groups of 8) 146 -> 156 (unrolled at 8 it was 111); the 1B Q4_K_M file's pp512
// 187-190 -> 195-201 tok/s, Q6_K's 145 -> 156-157. Below 4 tokens (decode) they stay unrolled.
// With `pre` (q5_K / q6_K, kq_group's prompt passes) the weight values come from `unpacked`
// (q5_unpack / q6_unpack) instead of the lines; without it `unpacked` is not read.
template <weight_type wt, int T, int H, int S, bool pre>
inline void kq_halves(const line64* blk, const block_q8_K* const* x, __m256 (*acc)[S], const __m256i* unpacked) {
  constexpr int64_t lines = kq_lines(wt);
  constexpr bool pairs_as_loop = T >= 4;  // the comment above says why
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  // Line L of the super-block (kquant_panels.hpp's numbering).
  auto ln = [&](int64_t L) __attribute__((always_inline)) { return blk + kq_at(wt, L); };
  // Bytes [off, off + 32) of a line hold a pair per row: half hh's 8 rows are 16 of them.
  auto half_bytes = [&](const line64* l, int off, int hh) __attribute__((always_inline)) {
    return l->b + off + 16 * hh;
  };
  // The scaled int32 sums, updated once per run of lines: kept in memory (L1), which leaves the
  // registers to the run's int16 sums; for q6_K at one token (its two-line runs, two sums) in
  // registers, which streams it faster from memory (Zen 4, one thread: 19-20 -> 23-24 GMAC/s;
  // not so for q4_K, nor for q6_K at two tokens, where they crowd the 16 registers).
  constexpr bool isum_in_regs = T == 1 && wt == weight_type::q6_k;
  alignas(32) int32_t isum_mem[isum_in_regs ? 1 : H][isum_in_regs ? 1 : T][8] = {};
  __m256i isum_reg[H][T];
  if constexpr (isum_in_regs)
    for (int hh = 0; hh < H; ++hh)
      for (int t = 0; t < T; ++t) isum_reg[hh][t] = _mm256_setzero_si256();
  auto isum_add = [&](int hh, int t, __m256i v) __attribute__((always_inline)) {
    if constexpr (isum_in_regs) {
      isum_reg[hh][t] = _mm256_add_epi32(isum_reg[hh][t], v);
      pin(isum_reg[hh][t]);
    } else {
      __m256i* p = reinterpret_cast<__m256i*>(isum_mem[hh][t]);
      _mm256_store_si256(p, _mm256_add_epi32(_mm256_load_si256(p), v));
    }
  };
  auto isum = [&](int hh, int t) __attribute__((always_inline)) {
    if constexpr (isum_in_regs) return isum_reg[hh][t];
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(isum_mem[hh][t]));
  };
  if constexpr (wt == weight_type::q6_k) {
    const __m256i m3 = _mm256_set1_epi8(0x30);
    auto pair = [&](auto jc) __attribute__((always_inline)) {
      const int j = jc;  // sub-blocks j (low nibbles) and 8 + j (high)
      __m256i sc_lo[H], sc_hi[H];
      for (int hh = 0; hh < H; ++hh) {
        const __m256i sp_lo = pairs_s8(half_bytes(ln(48 + j / 4), 32 * (j / 2 % 2), hh));
        const __m256i sp_hi = pairs_s8(half_bytes(ln(48 + (8 + j) / 4), 32 * ((8 + j) / 2 % 2), hh));
        sc_lo[hh] = j % 2 ? dup_hi(sp_lo) : dup_lo(sp_lo);
        sc_hi[hh] = j % 2 ? dup_hi(sp_hi) : dup_lo(sp_hi);
      }
      // Two lines at a time in int16 (values < 64), then scaled into int32.
      unroll(
          [&](auto cc2) __attribute__((always_inline)) {
            constexpr int c0 = 2 * decltype(cc2)::value;
            // Sub-block j (low nibbles), then 8 + j (high).
            unroll(
                [&](auto nc) __attribute__((always_inline)) {
                  constexpr int nib = decltype(nc)::value;
                  // The run's two lines unpacked once, then each token in turn: few live sums.
                  __m256i w[2][H];
                  for (int d = 0; d < 2; ++d)
                    for (int hh = 0; hh < H; ++hh) {
                      const int c = c0 + d;
                      if constexpr (pre) {
                        w[d][hh] = _mm256_load_si256(unpacked + q6_unpacked_at(j, c, nib, hh));
                        continue;
                      }
                      const __m256i v = load_half(ln(4 * j + c), hh);
                      const __m256i hb = load_half(ln(32 + 2 * j + c / 2), hh);
                      // The top two bits to bits 4-5: line c's byte has them at 4 (c % 2) + 2 nib.
                      const __m256i hs = d ? (nib ? _mm256_srli_epi16(hb, 2) : hb)
                                           : (nib ? _mm256_slli_epi16(hb, 2) : _mm256_slli_epi16(hb, 4));
                      w[d][hh] = _mm256_or_si256(_mm256_and_si256(nib ? _mm256_srli_epi16(v, 4) : v, m4),
                                                 _mm256_and_si256(hs, m3));
                    }
                  for (int t = 0; t < T; ++t) {
                    const __m256i x0 = bcast4(x[t]->qs + 128 * nib + 16 * j + 4 * c0);
                    const __m256i x1 = bcast4(x[t]->qs + 128 * nib + 16 * j + 4 * c0 + 4);
                    for (int hh = 0; hh < H; ++hh) {
                      const __m256i sm =
                          _mm256_add_epi16(_mm256_maddubs_epi16(w[0][hh], x0), _mm256_maddubs_epi16(w[1][hh], x1));
                      isum_add(hh, t, _mm256_madd_epi16(sm, nib ? sc_hi[hh] : sc_lo[hh]));
                    }
                  }
                },
                std::make_integer_sequence<int, 2>{});
          },
          std::make_integer_sequence<int, 2>{});
    };
    if constexpr (pairs_as_loop) {
      for (int j = 0; j < 8; ++j) pair(j);
    } else {
      unroll(pair, std::make_integer_sequence<int, 8>{});
    }
    // The stored values are q + 32: subtract 32 * sum_j sc_j * bsums_j.
    for (int hh = 0; hh < H; ++hh) {
      __m256i sp[8];
      for (int q = 0; q < 8; ++q) sp[q] = pairs_s8(half_bytes(ln(48 + q / 2), 32 * (q % 2), hh));
      const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(half_bytes(ln(52), 0, hh))));
      for (int t = 0; t < T; ++t) {
        __m256i off = _mm256_setzero_si256();
        for (int q = 0; q < 8; ++q) off = _mm256_add_epi32(off, _mm256_madd_epi16(sp[q], bcast4(x[t]->bsums + 2 * q)));
        const __m256i is = _mm256_sub_epi32(isum(hh, t), _mm256_slli_epi32(off, 5));
        acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(x[t]->d)), acc[hh][t]);
      }
    }
  } else {
    constexpr int64_t s0 = lines - 5;  // scales, mins, d/dmin
    // Lines summed in int16 before the scale: 8 for q4_K (values < 16), 4 for q5_K (< 32).
    constexpr int run = wt == weight_type::q4_k ? 8 : 4;
    // From 4 tokens on: each line loaded again for its high nibbles and each sub-block's scales
    // built where they are used, not held across the pair: GCC otherwise keeps every line of a
    // pair in a register and spills them (docs/cpu-backend.md, "K panels").
    // Below 4 tokens the code is the one measured for decode.
    constexpr bool sc_late = T >= 4;
    const __m256i m10 = _mm256_set1_epi8(0x10);
    auto group = [&](auto gc) __attribute__((always_inline)) {
      const int g = gc;  // sub-blocks 2g (low nibbles) and 2g + 1 (high)
      __m256i sc_lo[H], sc_hi[H];
      if constexpr (!sc_late)
        for (int hh = 0; hh < H; ++hh) {
          const __m256i sp = pairs_u8(half_bytes(ln(s0 + g / 2), 32 * (g % 2), hh));
          sc_lo[hh] = dup_lo(sp);
          sc_hi[hh] = dup_hi(sp);
        }
      unroll(
          [&](auto rc) __attribute__((always_inline)) {
            constexpr int c0 = run * decltype(rc)::value;
            // The low nibbles (sub-block 2g), then the high ones (2g + 1).
            unroll(
                [&](auto nc) __attribute__((always_inline)) {
                  constexpr int nib = decltype(nc)::value;
                  __m256i sum[H][T];
                  unroll(
                      [&](auto dc) __attribute__((always_inline)) {
                        constexpr int c = c0 + decltype(dc)::value;
                        __m256i w[H];
                        for (int hh = 0; hh < H; ++hh) {
                          if constexpr (pre) {
                            w[hh] = _mm256_load_si256(unpacked + q5_unpacked_at(g, c, nib, hh));
                            continue;
                          }
                          __m256i v;
                          if constexpr (sc_late)
                            v = load_half_again(ln(8 * g + c), hh);
                          else
                            v = load_half(ln(8 * g + c), hh);
                          w[hh] = _mm256_and_si256(nib ? _mm256_srli_epi16(v, 4) : v, m4);
                          if constexpr (wt == weight_type::q5_k) {
                            const __m256i hb = load_half(ln(32 + 2 * g + c / 4), hh);
                            w[hh] = _mm256_or_si256(w[hh], _mm256_and_si256(shift16<4 - nib - 2 * (c % 4)>(hb), m10));
                          }
                        }
                        for (int t = 0; t < T; ++t) {
                          const __m256i xv = bcast4(x[t]->qs + 64 * g + 32 * nib + 4 * c);
                          for (int hh = 0; hh < H; ++hh) {
                            const __m256i pr = _mm256_maddubs_epi16(w[hh], xv);
                            sum[hh][t] = c == c0 ? pr : _mm256_add_epi16(sum[hh][t], pr);
                            pin(sum[hh][t]);
                          }
                        }
                      },
                      std::make_integer_sequence<int, run>{});
                  if constexpr (sc_late) {
                    for (int hh = 0; hh < H; ++hh) {
                      const __m256i sc = scale_pair<nib>(half_bytes(ln(s0 + g / 2), 32 * (g % 2), hh));
                      for (int t = 0; t < T; ++t) isum_add(hh, t, _mm256_madd_epi16(sum[hh][t], sc));
                    }
                  } else {
                    for (int hh = 0; hh < H; ++hh)
                      for (int t = 0; t < T; ++t)
                        isum_add(hh, t, _mm256_madd_epi16(sum[hh][t], nib ? sc_hi[hh] : sc_lo[hh]));
                  }
                },
                std::make_integer_sequence<int, 2>{});
          },
          std::make_integer_sequence<int, 8 / run>{});
    };
    if constexpr (pairs_as_loop) {
      for (int g = 0; g < 4; ++g) group(g);
    } else {
      unroll(group, std::make_integer_sequence<int, 4>{});
    }
    for (int hh = 0; hh < H; ++hh) {
      __m256i mp[4];
      for (int q = 0; q < 4; ++q) mp[q] = pairs_u8(half_bytes(ln(s0 + 2 + q / 2), 32 * (q % 2), hh));
      const __m256 dw =
          _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(half_bytes(ln(lines - 1), 0, hh))));
      const __m256 dmw =
          _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(half_bytes(ln(lines - 1), 32, hh))));
      for (int t = 0; t < T; ++t) {
        __m256i ms = _mm256_setzero_si256();
        for (int q = 0; q < 4; ++q) ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mp[q], bcast4(x[t]->sums32 + 2 * q)));
        const __m256 dx = _mm256_set1_ps(x[t]->d);
        acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum(hh, t)), _mm256_mul_ps(dw, dx), acc[hh][t]);
        acc[hh][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(dmw, dx), acc[hh][t]);
      }
    }
  }
}

// Sums acc[h * S + t] (half h, token t < n) into rows [row0, row0 + n_rows) of tokens t0 + t.
inline void store_halves(const __m256* acc, int S, int halves, int64_t n, float* y, int64_t ldy, int64_t t0,
                         int64_t row0, int64_t n_rows) {
  for (int h = 0; h < halves; ++h) {
    const int64_t m = std::min<int64_t>(8, n_rows - 8 * h);
    for (int64_t t = 0; t < n; ++t) {
      float* out = y + (t0 + t) * ldy + row0 + 8 * h;
      if (m == 8) {
        _mm256_storeu_ps(out, acc[h * S + t]);
      } else {
        alignas(32) float v[8];
        _mm256_store_ps(v, acc[h * S + t]);
        std::copy(v, v + m, out);
      }
    }
  }
}

// Tokens a pass over a group of panels takes at most (their sums on the stack, 16 KiB).
constexpr int64_t kq_pass_tokens = 64;

// The panels of a group (ps: n_ps of them, from panel p) against tokens [b0, b1) (at most
// kq_pass_tokens): super-block b of each panel in turn, which is the order they lie in memory
// (kquant_panels.hpp), each against the tokens in groups (kq_token_groups); the sums on the stack.
// (Panel by panel, the super-blocks a group apart, the 1B Q4_K_M file's pp512 with these kernels
// was 7 % slower.)
template <weight_type wt, int group, bool pre>
void kq_group(const kq_panel* ps, int n_ps, int64_t nb, const block_q8_K* a, int64_t b0, int64_t b1, float* y,
              int64_t ldy, int64_t p, int64_t rows, bool line_prefetch) {
  constexpr int64_t lines = kq_lines(wt);
  constexpr int S = kq_pass_tokens;
  const int64_t n = b1 - b0;
  __m256 acc[kq_group_panels][2][S];
  for (int j = 0; j < n_ps && j < kq_group_panels; ++j)
    for (int h = 0; h < 2; ++h)
      for (int64_t t = 0; t < n && t < S; ++t) acc[j][h][t] = _mm256_setzero_ps();
  const bool prefetch = n <= 2 && line_prefetch;  // decode streams the weights from memory
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < n_ps; ++j) {
      const line64* blk = ps[j].block(b);
      if (prefetch) kq_prefetch_ahead(blk, lines);
      // A last panel of 8 rows or fewer skips its empty half.
      const bool both = rows - (p + j) * panel_rows > 8;
      alignas(32) __m256i unpacked[pre ? kq_unpacked_vectors : 1];
      if constexpr (pre && wt == weight_type::q5_k) q5_unpack(blk, both ? 2 : 1, unpacked);
      if constexpr (pre && wt == weight_type::q6_k) q6_unpack(blk, both ? 2 : 1, unpacked);
      auto tokens = [&](auto tc, int64_t t0) {
        constexpr int T = decltype(tc)::value;
        const block_q8_K* x[T];
        for (int t = 0; t < T; ++t) x[t] = a + (t0 + t) * nb + b;
        __m256(*at)[S] = reinterpret_cast<__m256(*)[S]>(&acc[j][0][t0 - b0]);
        if (both)
          kq_halves<wt, T, 2, S, pre>(blk, x, at, unpacked);
        else
          kq_halves<wt, T, 1, S, pre>(blk, x, at, unpacked);
      };
      kq_token_groups<group>(b0, b1, tokens);
    }
  for (int j = 0; j < n_ps; ++j) {
    const int64_t row0 = (p + j) * panel_rows, n_rows = std::min<int64_t>(panel_rows, rows - row0);
    store_halves(&acc[j][0][0], S, n_rows > 8 ? 2 : 1, n, y, ldy, b0, row0, n_rows);
  }
}

// Every token count goes through the panel groups: a prompt's tokens in blocks of
// kq_token_block(nb) (at most kq_pass_tokens), every group of the range against one block before
// the next (kquant_panels.hpp, kq_for_panels, says why).
template <weight_type wt>
void kq_panels(const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1, const block_q8_K* a,
               int64_t n_tok, float* y, int64_t ldy) {
  const int64_t nb = k / qk_k;
  constexpr int group = wt == weight_type::q6_k ? 8 : 4;
  const bool line_prefetch = kq_line_prefetch();
  const int64_t block = std::min(kq_pass_tokens, std::max<int64_t>(kq_token_block(nb), 2 * group));
  for (int64_t b0 = 0; b0 < n_tok; b0 += block) {
    const int64_t b1 = std::min(n_tok, b0 + block);
    kq_for_panel_groups(panels, wt, rows, nb, p0, p1, [&](const kq_panel* ps, int n_ps, int64_t p) {
      // q5_K and q6_K against more than one token group: kq_unpacked_vectors says why.
      if constexpr (wt != weight_type::q4_k)
        if (b1 - b0 > group) return kq_group<wt, group, true>(ps, n_ps, nb, a, b0, b1, y, ldy, p, rows, line_prefetch);
      kq_group<wt, group, false>(ps, n_ps, nb, a, b0, b1, y, ldy, p, rows, line_prefetch);
    });
  }
}

}  // namespace

void quantize_row_q8_K_avx2(const float* x, block_q8_K* y, int64_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  // packs_epi32 / packs_epi16 interleave the 128-bit lanes; this puts the 4-byte runs back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) {
    block_q8_K& b = y[i];
    // The largest magnitude, and whether every value is finite (an all-ones exponent is not).
    __m256 amax = _mm256_setzero_ps();
    __m256i nonfinite = _mm256_setzero_si256();
    for (int j = 0; j < qk_k; j += 8) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask);
      const __m256i e = _mm256_and_si256(_mm256_castps_si256(a), exp_mask);
      nonfinite = _mm256_or_si256(nonfinite, _mm256_cmpeq_epi32(e, exp_mask));
      amax = _mm256_max_ps(amax, a);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float m = _mm_cvtss_f32(m4);
    const bool finite = _mm256_testz_si256(nonfinite, nonfinite) != 0;
    if (!finite || m == 0) {
      set_q8_K_unscaled(b, finite);
      continue;
    }
    // The first element of that magnitude gives the scale its sign (the scalar loop's strict >).
    const __m256 mv = _mm256_set1_ps(m);
    float vmax = 0;
    for (int j = 0; j < qk_k; j += 8) {
      const __m256 v = _mm256_loadu_ps(x + j);
      const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, abs_mask), mv, _CMP_EQ_OQ));
      if (hit != 0) {
        vmax = x[j + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.f / vmax;
    const __m256 is = _mm256_set1_ps(iscale);
    // 32 values at a time: converted in the current rounding mode (nearest even by default, as the
    // scalar nearbyint), narrowed with signed saturation to [-128, 127] as the scalar clamp.
    for (int g = 0; g < 8; ++g) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(x + 32 * g + 8 * k)));
      const __m256i bytes = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.qs + 32 * g), bytes);
      // Sums of the two groups of 16: the bytes + 128 summed by vpsadbw, 16 * 128 taken off.
      const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(bytes, bias), _mm256_setzero_si256());
      const __m256i both = _mm256_add_epi64(sad, _mm256_shuffle_epi32(sad, 0x4e));
      b.bsums[2 * g] = static_cast<int16_t>(_mm256_extract_epi64(both, 0) - 16 * 128);
      b.bsums[2 * g + 1] = static_cast<int16_t>(_mm256_extract_epi64(both, 2) - 16 * 128);
    }
    for (int g = 0; g < 8; ++g) b.sums32[g] = static_cast<int16_t>(b.bsums[2 * g] + b.bsums[2 * g + 1]);
    b.d = 1.f / iscale;
  }
}

void gemv_kq_panels_avx2(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                         const block_q8_K* a, int64_t n_tok, float* y, int64_t ldy) {
  kq_for_type(t, [&](auto wt) { kq_panels<decltype(wt)::value>(panels, rows, k, p0, p1, a, n_tok, y, ldy); });
}

}  // namespace sy::cpu
