#include "kernels/cpu/ops.hpp"

#include <cmath>

#include "kernels/cpu/simd.hpp"

namespace sy::cpu {

void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  double sum = hsum(acc);
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.f / std::sqrt(static_cast<float>(sum / n) + eps);
  for (i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void rope_norm(float* x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos, float base) {
  // theta_i = pos * base^(-2i/n_rot): computed as llama.cpp does, by repeated multiplication of
  // theta_scale = base^(-2/n_rot), so results match the reference bit for bit in the common case.
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(n_rot));
  float cos_sin[2 * 256];
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    cos_sin[2 * i] = std::cos(theta);
    cos_sin[2 * i + 1] = std::sin(theta);
    theta *= theta_scale;
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * c - b * s;
      v[2 * i + 1] = a * s + b * c;
    }
  }
}

void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp256(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void softmax_inplace(float* x, int64_t n) {
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(_mm256_loadu_ps(x + i), vmax);  // a NaN in x is skipped
  float mx = hmax(vmax);
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  i = 0;
  __m256 acc = _mm256_setzero_ps();
  const __m256 vmx = _mm256_set1_ps(mx);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.f / sum;
  for (i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace sy::cpu
