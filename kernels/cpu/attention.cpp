#include "kernels/cpu/attention.hpp"

#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cpu/simd.hpp"

namespace sy::cpu {
namespace {

// 8 elements of a K/V row as floats.
template <kv_type T>
inline __m256 load8(const void* row, int64_t d) {
  if constexpr (T == kv_type::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + d);
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + d)));
  }
}

template <kv_type T>
inline float load1(const void* row, int64_t d) {
  if constexpr (T == kv_type::f32)
    return static_cast<const float*>(row)[d];
  else
    return fp16_to_fp32(static_cast<const uint16_t*>(row)[d]);
}

template <kv_type T>
void attend(const float* q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head, int64_t head_dim, float scale,
            float* scores, float* out) {
  const size_t eb = kv_elem_bytes(T);
  const int64_t off = kv_head * head_dim;
  auto row = [&](const void* const* blocks, int64_t j) {
    return static_cast<const uint8_t*>(blocks[j / kv.block_size]) +
           ((j % kv.block_size) * kv.row_stride + off) * static_cast<int64_t>(eb);
  };
  const bool vec = head_dim % 8 == 0 && head_dim <= 256;
  for (int64_t j = 0; j < n_keys; ++j) {
    const void* k = row(kv.k_blocks, j);
    float dot;
    if (vec) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8<T>(k, d), acc);
      dot = hsum(acc);
    } else {
      dot = 0;
      for (int64_t d = 0; d < head_dim; ++d) dot += q[d] * load1<T>(k, d);
    }
    scores[j] = dot * scale;
  }
  softmax_inplace(scores, n_keys);
  for (int64_t d = 0; d < head_dim; ++d) out[d] = 0;
  for (int64_t j = 0; j < n_keys; ++j) {
    const void* v = row(kv.v_blocks, j);
    const float p = scores[j];
    if (vec) {
      const __m256 vp = _mm256_set1_ps(p);
      for (int64_t d = 0; d < head_dim; d += 8)
        _mm256_storeu_ps(out + d, _mm256_fmadd_ps(vp, load8<T>(v, d), _mm256_loadu_ps(out + d)));
    } else {
      for (int64_t d = 0; d < head_dim; ++d) out[d] += p * load1<T>(v, d);
    }
  }
}

}  // namespace

void store_kv_row(const float* src, void* dst, int64_t n, kv_type type) {
  if (type == kv_type::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* h = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}

void attend_head(const float* q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head, int64_t head_dim,
                 float scale, float* scores, float* out) {
  if (kv.type == kv_type::f32)
    attend<kv_type::f32>(q, n_keys, kv, kv_head, head_dim, scale, scores, out);
  else
    attend<kv_type::f16>(q, n_keys, kv, kv_head, head_dim, scale, scores, out);
}

}  // namespace sy::cpu
