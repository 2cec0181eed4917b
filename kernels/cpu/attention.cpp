#include "kernels/cpu/attention.hpp"

#include <cmath>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/simd.hpp"

namespace sy::cpu {

void attend_head(const float* q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                 int64_t head_dim, float scale, float* scores, float* out) {
  const int64_t off = kv_head * head_dim;
  const bool vec = head_dim % 8 == 0 && head_dim <= 256;
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* k = kv.k_blocks[j / kv.block_size] + (j % kv.block_size) * kv.row_stride + off;
    float dot;
    if (vec) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc);
      dot = hsum(acc);
    } else {
      dot = 0;
      for (int64_t d = 0; d < head_dim; ++d) dot += q[d] * k[d];
    }
    scores[j] = dot * scale;
  }
  softmax_inplace(scores, n_keys);
  for (int64_t d = 0; d < head_dim; ++d) out[d] = 0;
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* v = kv.v_blocks[j / kv.block_size] + (j % kv.block_size) * kv.row_stride + off;
    const float p = scores[j];
    if (vec) {
      const __m256 vp = _mm256_set1_ps(p);
      for (int64_t d = 0; d < head_dim; d += 8)
        _mm256_storeu_ps(out + d, _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + d), _mm256_loadu_ps(out + d)));
    } else {
      for (int64_t d = 0; d < head_dim; ++d) out[d] += p * v[d];
    }
  }
}

}  // namespace sy::cpu
