// Small AVX2/FMA helpers shared by the portable kernels (x86-64-v3 baseline), and vector math
// written once for them and the AVX-512 files.
#pragma once

#include <immintrin.h>

namespace sy::cpu {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The vector math below is written once for 8 lanes (__m256, every build) and 16 (__m512, in the
// files compiled with AVX-512): the same operations per lane in the same order, so both widths give
// the same bits. vec<V> names the few instructions they use.
// (GCC warns that a vector type's attributes are ignored in a template argument: vec<__m256> and
// vec<__m512> stay distinct types, so the warning says nothing here.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
template <class V>
struct vec;
template <>
struct vec<__m256> {
  static __m256 set1(float x) { return _mm256_set1_ps(x); }
  static __m256 zero() { return _mm256_setzero_ps(); }
  static __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static __m256 sub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
  static __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  static __m256 div(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
  static __m256 max(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
  static __m256 min(__m256 a, __m256 b) { return _mm256_min_ps(a, b); }
  static __m256 fmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
  static __m256 fnmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fnmadd_ps(a, b, c); }
  static __m256 round(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in the float exponent's range.
  static __m256 pow2(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  // v where x >= lim (ordered), else 0.
  static __m256 where_ge(__m256 x, float lim, __m256 v) {
    return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(lim), _CMP_GE_OQ), v);
  }
};
#ifdef __AVX512F__
template <>
struct vec<__m512> {
  static __m512 set1(float x) { return _mm512_set1_ps(x); }
  static __m512 zero() { return _mm512_setzero_ps(); }
  static __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static __m512 sub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
  static __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  static __m512 div(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
  static __m512 max(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
  static __m512 min(__m512 a, __m512 b) { return _mm512_min_ps(a, b); }
  static __m512 fmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
  static __m512 fnmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fnmadd_ps(a, b, c); }
  static __m512 round(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m512 pow2(__m512 n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static __m512 where_ge(__m512 x, float lim, __m512 v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lim), _CMP_GE_OQ), v);
  }
};
#endif
#pragma GCC diagnostic pop

// e^x per lane, relative error ~2e-7; exactly 0 below -87.3 (so -inf, e.g. a masked score, gives
// 0) and saturating above 88.3. NaN gives 0. exp(x) = 2^n * 2^r, n = round(x log2 e).
template <class V>
inline V vexp(V x) {
  using O = vec<V>;
  const V x0 = x;
  x = O::max(x, O::set1(-87.3f));
  x = O::min(x, O::set1(88.3f));
  const V n = O::round(O::mul(x, O::set1(1.44269504088896341f)));
  // r = x - n ln2, in two parts for precision.
  V r = O::fnmadd(n, O::set1(0.693145751953125f), x);
  r = O::fnmadd(n, O::set1(1.428606765330187045e-06f), r);
  // e^r by its Taylor/minimax polynomial on [-ln2/2, ln2/2].
  V p = O::set1(1.9875691500e-4f);
  p = O::fmadd(p, r, O::set1(1.3981999507e-3f));
  p = O::fmadd(p, r, O::set1(8.3334519073e-3f));
  p = O::fmadd(p, r, O::set1(4.1665795894e-2f));
  p = O::fmadd(p, r, O::set1(1.6666665459e-1f));
  p = O::fmadd(p, r, O::set1(5.0000001201e-1f));
  p = O::fmadd(p, O::mul(r, r), O::add(r, O::set1(1.f)));
  return O::where_ge(x0, -87.3f, O::mul(p, O::pow2(n)));
}
inline __m256 exp256(__m256 x) { return vexp(x); }

// silu(g) * u = g / (1 + e^-g) * u per lane.
template <class V>
inline V vsilu_mul(V g, V u) {
  using O = vec<V>;
  return O::mul(O::div(g, O::add(O::set1(1.f), vexp(O::sub(O::zero(), g)))), u);
}
// gelu(x) * u per lane in its tanh form, x / (1 + e^(-2c (x + a x^3))) * u (c = sqrt(2 / pi),
// a = 0.044715; ops.hpp's gelu_mul).
template <class V>
inline V vgelu_mul(V x, V u) {
  using O = vec<V>;
  constexpr float k_c = 0.7978845608028654f, k_a = 0.044715f;
  const V x3 = O::mul(O::mul(x, x), x);
  const V e = vexp(O::mul(O::set1(-2.f * k_c), O::fmadd(O::set1(k_a), x3, x)));
  return O::mul(O::div(x, O::add(O::set1(1.f), e)), u);
}

}  // namespace sy::cpu
