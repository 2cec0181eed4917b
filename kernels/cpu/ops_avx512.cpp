// The vector parts of ops.cpp's SiLU / GELU gates and softmax, 16 lanes at a time: the same
// per-lane functions as there (simd.hpp's vexp, vsilu_mul, vgelu_mul at 16 lanes), so the results
// are bitwise those of the 8-lane loops, and the softmax sum keeps their order (each 16 values
// are added to the 8 partial sums as their two halves, first then second). Each function does the
// first multiple of 16 elements and returns how many; ops.cpp does the rest as before. Compiled
// with -mavx512{f,bw,vl,dq,...}; only called when use_avx512_vnni_kernels().
// GCC 12 flags the self-initialised placeholder inside _mm512_undefined_* that some intrinsics use
// (GCC bug 105593), a false positive; nothing else in this file needs the warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/simd.hpp"

namespace sy::cpu {

int64_t silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, vsilu_mul(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  return i;
}

int64_t gelu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, vgelu_mul(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  return i;
}

int64_t softmax_exp_avx512(float* x, int64_t n, float mx, float* sums8) {
  const __m512 vmx = _mm512_set1_ps(mx);
  __m256 acc = _mm256_loadu_ps(sums8);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = vexp(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmx));
    _mm512_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(e, 1));
  }
  _mm256_storeu_ps(sums8, acc);
  return i;
}

}  // namespace sy::cpu
