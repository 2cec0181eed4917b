// Portable (x86-64-v3: AVX2, FMA, F16C) products of weight rows as stored in GGUF with the
// activations of a few tokens: integer dot products for the quantized types (u8 x s8 with
// maddubs, exact integer sums per block, then the block's scales), f32 FMAs for float weights.
//
// Each kernel walks a row once per group of up to 4 tokens, unpacking the weights once for the
// group. A (row, token) result is computed by the same instruction sequence whatever the group
// size, so results do not depend on how many tokens share the step (batching invariance).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {
namespace {

inline float hsum_ps_256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 packed bytes -> 32 nibbles: low nibbles in bytes 0..15, high nibbles in bytes 16..31.
inline __m256i unpack_q4(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// The 32 fifth bits of a q5 block (bit j of the little-endian u32 -> byte j) as 0x10 or 0.
inline __m256i q5_high_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i rep = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(rep, sel), sel), _mm256_set1_epi8(0x10));
}

// Sums of u8 x s8 products of adjacent pairs, 16 int16 lanes (no overflow: u <= 63, |s| <= 127).
inline __m256i maddubs(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }
// ... and on to 8 int32 lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_madd_epi16(maddubs(u, s), _mm256_set1_epi16(1)); }

// ---------------------------------------------------------------------------------------------
// q4_0 / q4_1 / q5_0 / q5_1 / q8_0 against q8_act (32-element blocks with d and s = d * sum(q)).

template <weight_type W>
constexpr size_t legacy_block_bytes() {
  if constexpr (W == weight_type::q4_0) return sizeof(block_q4_0);
  if constexpr (W == weight_type::q4_1) return sizeof(block_q4_1);
  if constexpr (W == weight_type::q5_0) return sizeof(block_q5_0);
  if constexpr (W == weight_type::q5_1) return sizeof(block_q5_1);
  return sizeof(block_q8_0);
}

template <weight_type W, int T>
void row_legacy(const uint8_t* row, const block_q8_act* a, int64_t nb, float* y, int64_t ldy) {
  __m256 acc[T];
  float acc_m[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = _mm256_setzero_ps();
    acc_m[t] = 0;
  }
  constexpr size_t bytes = legacy_block_bytes<W>();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = row + i * bytes;
    uint16_t dh, mh = 0;
    std::memcpy(&dh, b, 2);
    if constexpr (W == weight_type::q4_1 || W == weight_type::q5_1) std::memcpy(&mh, b + 2, 2);
    const float dw = _cvtsh_ss(dh);
    __m256i u;
    if constexpr (W == weight_type::q4_0) u = unpack_q4(b + 2);
    if constexpr (W == weight_type::q4_1) u = unpack_q4(b + 4);
    if constexpr (W == weight_type::q5_0) u = _mm256_or_si256(unpack_q4(b + 6), q5_high_bits(b + 2));
    if constexpr (W == weight_type::q5_1) u = _mm256_or_si256(unpack_q4(b + 8), q5_high_bits(b + 4));
    if constexpr (W == weight_type::q8_0) {
      // Signed weights: |w| against the activations with w's sign (2 * 127 * 127 < 2^15).
      const __m256i wq = load256(b + 2);
      const __m256i wabs = _mm256_abs_epi8(wq);
      for (int t = 0; t < T; ++t) {
        const block_q8_act& x = a[t * nb + i];
        const __m256i isum = dot_u8s8(wabs, _mm256_sign_epi8(load256(x.qs), wq));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * x.d), acc[t]);
      }
    } else {
      const float m = W == weight_type::q4_1 || W == weight_type::q5_1 ? _cvtsh_ss(mh)
                      : W == weight_type::q4_0                         ? -8.f * dw
                                                                       : -16.f * dw;
      for (int t = 0; t < T; ++t) {
        const block_q8_act& x = a[t * nb + i];
        const __m256i isum = dot_u8s8(u, load256(x.qs));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * x.d), acc[t]);
        acc_m[t] += m * x.s;
      }
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum_ps_256(acc[t]) + acc_m[t];
}

// ---------------------------------------------------------------------------------------------
// q4_K / q5_K / q6_K against q8_K (256-element blocks: d, int8 values, sums of each 16).

// The 8 six-bit scales (bytes 0..7) and mins (bytes 8..15) of a q4_K / q5_K super-block, from its
// 12 packed bytes as 32-bit words w0..w2 (k_scale_min, eight at a time): scales 0-3 are the low 6
// bits of w0's bytes, mins 0-3 those of w1; scales 4-7 are w2's low nibbles with w0's top 2 bits
// above them, mins 4-7 w2's high nibbles with w1's top 2 bits.
inline __m128i k_scales_mins(const uint8_t* packed) {
  // Bytes 0..11 in lanes 0..11 (the block's next 4 bytes, its qh/qs, ride along and are masked off).
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  // p: lanes 0-3 w0, 4-7 w2, 8-11 w1, 12-15 w2 (the low 6 bits / nibbles of each result lane);
  // h: lanes 4-7 w0, 12-15 w1 (the bytes whose top 2 bits go above the nibbles); zero elsewhere.
  const __m128i p = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i h = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i lo = _mm_and_si128(p, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  const __m128i hi_nib =
      _mm_and_si128(_mm_srli_epi16(p, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  const __m128i top = _mm_and_si128(_mm_srli_epi16(h, 2), _mm_set1_epi8(0x30));
  return _mm_or_si128(_mm_or_si128(lo, hi_nib), top);
}

// q4_K / q5_K, row against T tokens: the super-block's weights are unpacked once per 32-element
// sub-block pair and used by every token while in registers.
template <weight_type W, int T>
void row_k45(const uint8_t* row, const block_q8_K* a, int64_t nb, float* y, int64_t ldy) {
  constexpr size_t bytes = W == weight_type::q4_k ? sizeof(block_q4_K) : sizeof(block_q5_K);
  __m256 acc[T];
  __m128 acc_m[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = _mm256_setzero_ps();
    acc_m[t] = _mm_setzero_ps();
  }
  const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = row + i * bytes;
    const uint8_t* qs = W == weight_type::q4_k ? b + 16 : b + 48;
    uint16_t dh, dminh;
    std::memcpy(&dh, b, 2);
    std::memcpy(&dminh, b + 2, 2);
    const float d = _cvtsh_ss(dh), dmin = _cvtsh_ss(dminh);
    const __m128i sm = k_scales_mins(b + 4);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
    __m256i qh = _mm256_setzero_si256();
    if constexpr (W == weight_type::q5_k) qh = load256(b + 16);
    auto sub_block_pair = [&](int g) {
      const __m256i q = load256(qs + 32 * g);
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (W == weight_type::q5_k) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
      }
      // Broadcast 16-bit lane 2g (and 2g + 1) of sc16: bytes (4g, 4g + 1) (and + 2, + 3) everywhere.
      const __m256i s_lo = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(static_cast<int16_t>((4 * g + 1) << 8 | 4 * g)));
      const __m256i s_hi =
          _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(static_cast<int16_t>((4 * g + 3) << 8 | (4 * g + 2))));
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = a[t * nb + i].qs + 64 * g;
        const __m256i p_lo = _mm256_madd_epi16(maddubs(lo, load256(xq)), s_lo);
        const __m256i p_hi = _mm256_madd_epi16(maddubs(hi, load256(xq + 32)), s_hi);
        sumi[t] = _mm256_add_epi32(_mm256_add_epi32(sumi[t], p_lo), p_hi);
      }
    };
    if constexpr (T <= 2) {  // few registers in use: unrolled, the shuffle controls are constants
      sub_block_pair(0);
      sub_block_pair(1);
      sub_block_pair(2);
      sub_block_pair(3);
    } else {
      // Not unrolled: GCC 12 otherwise interleaves the sub-block pairs and spills the products.
#pragma GCC unroll 1
      for (int g = 0; g < 4; ++g) sub_block_pair(g);
    }
    for (int t = 0; t < T; ++t) {
      const block_q8_K& x = a[t * nb + i];
      const __m128i msum = _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sums32)));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_set1_ps(d * x.d), acc[t]);
      acc_m[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(msum), _mm_set1_ps(dmin * x.d), acc_m[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    __m128 m = _mm_add_ps(acc_m[t], _mm_movehl_ps(acc_m[t], acc_m[t]));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    y[t * ldy] = hsum_ps_256(acc[t]) - _mm_cvtss_f32(m);
  }
}

// q6_K, row against T tokens, like row_k45. The chunk of 32 elements 32q.. takes scales 2q and 2q + 1
// (16 elements each): 16-bit lanes 0-7 and 8-15 of the chunk's scale vector, picked with one vpermd
// from the scales duplicated into 32-bit lanes (sd_lo: scales 0-3 and 8-11, sd_hi: 4-7 and 12-15).
template <int T>
void row_q6k(const uint8_t* row, const block_q8_K* a, int64_t nb, float* y, int64_t ldy) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i) {
    const auto& b = reinterpret_cast<const block_q6_K*>(row)[i];
    const float d = _cvtsh_ss(b.d);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    const __m256i sd_lo = _mm256_unpacklo_epi16(sc16, sc16), sd_hi = _mm256_unpackhi_epi16(sc16, sc16);
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
    auto chunk = [&](int n, int c, __m256i ql0, __m256i ql1, __m256i qh) {
      const __m256i lsrc = c & 1 ? ql1 : ql0;
      const __m256i lbits = _mm256_and_si256(c < 2 ? lsrc : _mm256_srli_epi16(lsrc, 4), m4);
      const __m256i hbits = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m2), 4);
      const __m256i q = _mm256_or_si256(lbits, hbits);  // q + 32, in [0, 63]
      const int j = 8 * n + 2 * c;                      // first scale of the chunk
      const int lane = (j & 3) + 4 * (j >> 3);          // its 32-bit lane in sd_lo / sd_hi
      const __m256i idx = _mm256_setr_epi32(lane, lane, lane, lane, lane + 1, lane + 1, lane + 1, lane + 1);
      const __m256i s16 = _mm256_permutevar8x32_epi32((j & 4) ? sd_hi : sd_lo, idx);
      for (int t = 0; t < T; ++t) {
        const __m256i p = maddubs(q, load256(a[t * nb + i].qs + 128 * n + 32 * c));
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, s16));
      }
    };
    auto half = [&](int n, auto unrolled) {
      const __m256i ql0 = load256(b.ql + 64 * n), ql1 = load256(b.ql + 64 * n + 32);
      const __m256i qh = load256(b.qh + 32 * n);
      if constexpr (decltype(unrolled)::value) {
        for (int c = 0; c < 4; ++c) chunk(n, c, ql0, ql1, qh);
      } else {
#pragma GCC unroll 1
        for (int c = 0; c < 4; ++c) chunk(n, c, ql0, ql1, qh);
      }
    };
    if constexpr (T <= 2) {  // few registers in use: unrolled, the permute indices are constants
      half(0, std::true_type{});
      half(1, std::true_type{});
    } else {
#pragma GCC unroll 1
      for (int n = 0; n < 2; ++n) half(n, std::false_type{});
    }
    for (int t = 0; t < T; ++t) {
      // The +32 of every q: subtract 32 * sum_j scales[j] * bsums[j].
      const block_q8_K& x = a[t * nb + i];
      const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(load256(x.bsums), sc16), 5);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[t], off)), _mm256_set1_ps(d * x.d), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum_ps_256(acc[t]);
}

// ---------------------------------------------------------------------------------------------
// f32 / f16 / bf16 rows against f32 activations.

template <weight_type W>
inline __m256 load_w8(const uint8_t* row, int64_t j) {
  if constexpr (W == weight_type::f32) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + j);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + j));
  if constexpr (W == weight_type::f16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <weight_type W, int T>
void row_float(const uint8_t* row, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy) {
  __m256 acc0[T], acc1[T];
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    const __m256 w0 = load_w8<W>(row, j), w1 = load_w8<W>(row, j + 8);
    for (int t = 0; t < T; ++t) {
      acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + j), acc0[t]);
      acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * ldx + j + 8), acc1[t]);
    }
  }
  for (; j < k; j += 8) {  // k is a multiple of 32 for every matrix we load, so of 8
    const __m256 w0 = load_w8<W>(row, j);
    for (int t = 0; t < T; ++t) acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + j), acc0[t]);
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum_ps_256(_mm256_add_ps(acc0[t], acc1[t]));
}

// ---------------------------------------------------------------------------------------------
// Row x token loops: rows in chunks that stay in L1 while every group of tokens passes over them.

constexpr int64_t k_row_chunk = 16;

template <class RowFn>
void for_rows_tokens(int64_t r0, int64_t r1, int64_t n_tok, RowFn&& row) {
  for (int64_t c = r0; c < r1; c += k_row_chunk) {
    const int64_t c1 = c + k_row_chunk < r1 ? c + k_row_chunk : r1;
    int64_t t = 0;
    for (; t + 8 <= n_tok; t += 8)
      for (int64_t r = c; r < c1; ++r) row(std::integral_constant<int, 8>{}, r, t);
    for (; t + 4 <= n_tok; t += 4)
      for (int64_t r = c; r < c1; ++r) row(std::integral_constant<int, 4>{}, r, t);
    const int64_t rest = n_tok - t;
    for (int64_t r = c; r < c1; ++r) {
      if (rest == 3) row(std::integral_constant<int, 3>{}, r, t);
      if (rest == 2) row(std::integral_constant<int, 2>{}, r, t);
      if (rest == 1) row(std::integral_constant<int, 1>{}, r, t);
    }
  }
}

template <weight_type W>
void legacy_rows(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_act* a, int64_t nb,
                 int64_t n_tok, float* y, int64_t ldy) {
  for_rows_tokens(r0, r1, n_tok, [&](auto tt, int64_t r, int64_t t) {
    row_legacy<W, decltype(tt)::value>(w + r * row_bytes, a + t * nb, nb, y + t * ldy + r, ldy);
  });
}

template <weight_type W>
void k_rows(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_K* a, int64_t nb, int64_t n_tok,
            float* y, int64_t ldy) {
  for_rows_tokens(r0, r1, n_tok, [&](auto tt, int64_t r, int64_t t) {
    if constexpr (W == weight_type::q6_k)
      row_q6k<decltype(tt)::value>(w + r * row_bytes, a + t * nb, nb, y + t * ldy + r, ldy);
    else
      row_k45<W, decltype(tt)::value>(w + r * row_bytes, a + t * nb, nb, y + t * ldy + r, ldy);
  });
}

template <weight_type W>
void float_rows(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t k,
                int64_t n_tok, float* y, int64_t ldy) {
  for_rows_tokens(r0, r1, n_tok, [&](auto tt, int64_t r, int64_t t) {
    row_float<W, decltype(tt)::value>(w + r * row_bytes, x + t * ldx, ldx, k, y + t * ldy + r, ldy);
  });
}

}  // namespace

void gemv_q8act_avx2(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_act* a,
                     int64_t k, int64_t n_tok, float* y, int64_t ldy) {
  const int64_t nb = k / qk;
  switch (t) {
    case weight_type::q4_0:
      return legacy_rows<weight_type::q4_0>(w, row_bytes, r0, r1, a, nb, n_tok, y, ldy);
    case weight_type::q4_1:
      return legacy_rows<weight_type::q4_1>(w, row_bytes, r0, r1, a, nb, n_tok, y, ldy);
    case weight_type::q5_0:
      return legacy_rows<weight_type::q5_0>(w, row_bytes, r0, r1, a, nb, n_tok, y, ldy);
    case weight_type::q5_1:
      return legacy_rows<weight_type::q5_1>(w, row_bytes, r0, r1, a, nb, n_tok, y, ldy);
    case weight_type::q8_0:
      return legacy_rows<weight_type::q8_0>(w, row_bytes, r0, r1, a, nb, n_tok, y, ldy);
    default:
      return;
  }
}

void gemv_q8k_avx2(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_K* a,
                   int64_t k, int64_t n_tok, float* y, int64_t ldy) {
  const int64_t nb = k / qk_k;
  switch (t) {
    case weight_type::q4_k:
      return k_rows<weight_type::q4_k>(w, row_bytes, r0, r1, a, nb, n_tok, y, ldy);
    case weight_type::q5_k:
      return k_rows<weight_type::q5_k>(w, row_bytes, r0, r1, a, nb, n_tok, y, ldy);
    case weight_type::q6_k:
      return k_rows<weight_type::q6_k>(w, row_bytes, r0, r1, a, nb, n_tok, y, ldy);
    default:
      return;
  }
}

void gemv_f32act_avx2(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const float* x,
                      int64_t ldx, int64_t k, int64_t n_tok, float* y, int64_t ldy) {
  switch (t) {
    case weight_type::f32:
      return float_rows<weight_type::f32>(w, row_bytes, r0, r1, x, ldx, k, n_tok, y, ldy);
    case weight_type::f16:
      return float_rows<weight_type::f16>(w, row_bytes, r0, r1, x, ldx, k, n_tok, y, ldy);
    case weight_type::bf16:
      return float_rows<weight_type::bf16>(w, row_bytes, r0, r1, x, ldx, k, n_tok, y, ldy);
    default:
      return;
  }
}

}  // namespace sy::cpu
