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
