// The vector parts of ops.cpp's SiLU / GELU gates and softmax, 16 lanes at a time: the same
// operations per element as there (exp512 is exp256's sequence of operations), so the results are
// bitwise those of the 8-lane loops, and the softmax sum keeps their order (each 16 values are
// added to the 8 partial sums as their two halves, first then second). Each function does the
// first multiple of 16 elements and returns how many; ops.cpp does the rest as before. Compiled
// with -mavx512{f,bw,vl,dq,...}; only called when use_avx512_vnni_kernels().
#include <immintrin.h>

#include "kernels/cpu/ops.hpp"

namespace sy::cpu {
namespace {

// exp256 (simd.hpp), operation for operation.
inline __m512 exp512(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(live, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

}  // namespace

int64_t silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  return i;
}

int64_t gelu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float k_c = 0.7978845608028654f, k_a = 0.044715f;  // as gelu_mul
  const __m512 one = _mm512_set1_ps(1.f), m2c = _mm512_set1_ps(-2.f * k_c), a = _mm512_set1_ps(k_a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(gate + i);
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 e = exp512(_mm512_mul_ps(m2c, _mm512_fmadd_ps(a, x3, x)));
    const __m512 g = _mm512_div_ps(x, _mm512_add_ps(one, e));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(g, _mm512_loadu_ps(up + i)));
  }
  return i;
}

int64_t softmax_exp_avx512(float* x, int64_t n, float mx, float* sums8) {
  const __m512 vmx = _mm512_set1_ps(mx);
  __m256 acc = _mm256_loadu_ps(sums8);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmx));
    _mm512_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(e, 1));
  }
  _mm256_storeu_ps(sums8, acc);
  return i;
}

}  // namespace sy::cpu
