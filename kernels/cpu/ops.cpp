#include "kernels/cpu/ops.hpp"

#include <cmath>

#include "kernels/cpu/cpu_features.hpp"
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

void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const rope_config& c) {
  const int64_t half = c.n_rot / 2;
  const float theta_scale = std::pow(c.base, -2.0f / static_cast<float>(c.n_rot));
  float cos_sin[2 * 256];
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < half; ++i) {
    const float ff = c.freq_factors ? c.freq_factors[i] : 1.0f;
    const float t = c.freq_scale * (theta / ff);
    cos_sin[2 * i] = std::cos(t) * c.mscale;
    cos_sin[2 * i + 1] = std::sin(t) * c.mscale;
    theta *= theta_scale;
  }
  const int64_t step = c.neox ? 1 : 2, other = c.neox ? half : 1;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float cs = cos_sin[2 * i], sn = cos_sin[2 * i + 1];
      float* p = v + i * step;
      const float a = p[0], b = p[other];
      p[0] = a * cs - b * sn;
      p[other] = a * sn + b * cs;
    }
  }
}

void rope_norm(float* x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos, float base) {
  rope_config c;
  c.n_rot = n_rot;
  c.base = base;
  rope(x, n_heads, head_dim, pos, c);
}

void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp256(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = use_avx512_vnni_kernels() ? silu_mul_avx512(gate, up, out, n) : 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, vsilu_mul(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

void gelu_mul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float k_c = 0.7978845608028654f, k_a = 0.044715f;  // sqrt(2 / pi), as vgelu_mul
  int64_t i = use_avx512_vnni_kernels() ? gelu_mul_avx512(gate, up, out, n) : 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, vgelu_mul(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  for (; i < n; ++i) {
    const float x = gate[i];
    out[i] = x / (1.f + std::exp(-2.f * k_c * (x + k_a * x * x * x))) * up[i];
  }
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
  alignas(32) float sums8[8] = {};
  i = use_avx512_vnni_kernels() ? softmax_exp_avx512(x, n, mx, sums8) : 0;
  __m256 acc = _mm256_load_ps(sums8);
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
