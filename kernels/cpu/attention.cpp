#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cpu/simd.hpp"

namespace sy::cpu {
namespace {

static_assert(qk == 32 && sizeof(block_q8_0) == 34, "q8_0 KV rows are GGML's Q8_0 blocks");

// 8 int8 values times a broadcast scale: the one q8_0 -> f32 conversion every path uses.
inline __m256 dequant8(const int8_t* q, __m256 d) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)))),
                       d);
}

// 8 elements [d, d + 8) of a K/V head slice as floats (d % 8 == 0).
template <kv_type T>
inline __m256 load8(const void* row, int64_t d) {
  if constexpr (T == kv_type::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + d);
  } else if constexpr (T == kv_type::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + d)));
  } else {
    const block_q8_0& b = static_cast<const block_q8_0*>(row)[d / qk];
    return dequant8(b.qs + d % qk, _mm256_set1_ps(_cvtsh_ss(b.d)));
  }
}

template <kv_type T>
inline float load1(const void* row, int64_t d) {
  if constexpr (T == kv_type::f32) {
    return static_cast<const float*>(row)[d];
  } else if constexpr (T == kv_type::f16) {
    return fp16_to_fp32(static_cast<const uint16_t*>(row)[d]);
  } else {
    const block_q8_0& b = static_cast<const block_q8_0*>(row)[d / qk];
    return static_cast<float>(b.qs[d % qk]) * _cvtsh_ss(b.d);
  }
}

template <kv_type T>
void attend(const float* q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head, int64_t head_dim, float scale,
            float* scores, float* out) {
  const int64_t row_bytes = kv_row_bytes(T, kv.row_stride), off = kv_row_bytes(T, kv_head * head_dim);
  auto row = [&](const void* const* blocks, int64_t j) {
    return static_cast<const uint8_t*>(blocks[j / kv.block_size]) + (j % kv.block_size) * row_bytes + off;
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

// Eight sums at once: lane r of the result is the sum of acc[r]'s lanes.
inline __m256 hsum8(const __m256* acc) {
  const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]), t3 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Rows [j0, j0 + nk) of K or V as f32 pointers: f16 and q8_0 rows are converted into `buf`.
// `off`: bytes from a row's start to the kv head's slice. The conversion of a row depends only
// on the row, never on how many query heads read it.
template <kv_type T>
inline void rows_f32(const void* const* blocks, const kv_layer_view& kv, int64_t off, int64_t j0, int64_t nk,
                     int64_t n_keys_total, int64_t head_dim, float* buf, const float** out) {
  const int64_t row_bytes = kv_row_bytes(T, kv.row_stride), slice_bytes = kv_row_bytes(T, head_dim);
  for (int64_t r = 0; r < nk; ++r) {
    const int64_t j = j0 + r;
    const uint8_t* p = static_cast<const uint8_t*>(blocks[j / kv.block_size]) + (j % kv.block_size) * row_bytes + off;
    // The next chunk's rows: KV rows are scattered over blocks and far apart in memory, so
    // the hardware prefetcher alone leaves the conversion waiting on loads.
    if (j + 8 < n_keys_total) {
      const int64_t jn = j + 8;
      const char* pn = static_cast<const char*>(blocks[jn / kv.block_size]) + (jn % kv.block_size) * row_bytes + off;
      for (int64_t c = 0; c < slice_bytes; c += 64) _mm_prefetch(pn + c, _MM_HINT_T0);
      if constexpr (T == kv_type::q8_0) _mm_prefetch(pn + slice_bytes - 1, _MM_HINT_T0);  // 34-byte blocks
    }
    if constexpr (T == kv_type::f32) {
      out[r] = reinterpret_cast<const float*>(p);
    } else if constexpr (T == kv_type::f16) {
      float* dst = buf + r * head_dim;
      for (int64_t d = 0; d < head_dim; d += 8) _mm256_storeu_ps(dst + d, load8<T>(p, d));
      out[r] = dst;
    } else {
      float* dst = buf + r * head_dim;
      const auto* b = reinterpret_cast<const block_q8_0*>(p);
      for (int64_t i = 0; i < head_dim / qk; ++i, dst += qk) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int k = 0; k < qk; k += 8) _mm256_storeu_ps(dst + k, dequant8(b[i].qs + k, d));
      }
      out[r] = buf + r * head_dim;
    }
  }
}

template <kv_type T>
void attend_group_vec(const float* q, int64_t n_q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                      int64_t head_dim, float scale, float* scratch, float* out) {
  const int64_t off = kv_row_bytes(T, kv_head * head_dim);
  float* scores = scratch;              // [n_q][n_keys]
  float* buf = scratch + n_q * n_keys;  // 8 converted rows
  const float* rp[8];
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t j0 = 0; j0 < n_keys; j0 += 8) {
    const int64_t nk = std::min<int64_t>(8, n_keys - j0);
    rows_f32<T>(kv.k_blocks, kv, off, j0, nk, n_keys, head_dim, buf, rp);
    for (int64_t g = 0; g < n_q; ++g) {
      const float* qg = q + g * head_dim;
      float* sg = scores + g * n_keys + j0;
      if (nk == 8) {
        __m256 acc[8];
        for (auto& a : acc) a = _mm256_setzero_ps();
        for (int64_t d = 0; d < head_dim; d += 8) {
          const __m256 qv = _mm256_loadu_ps(qg + d);
          for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rp[r] + d), acc[r]);
        }
        _mm256_storeu_ps(sg, _mm256_mul_ps(hsum8(acc), vscale));
      } else {
        for (int64_t r = 0; r < nk; ++r) {
          __m256 acc = _mm256_setzero_ps();
          for (int64_t d = 0; d < head_dim; d += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qg + d), _mm256_loadu_ps(rp[r] + d), acc);
          sg[r] = hsum(acc) * scale;
        }
      }
    }
  }
  for (int64_t g = 0; g < n_q; ++g) softmax_inplace(scores + g * n_keys, n_keys);
  for (int64_t i = 0; i < n_q * head_dim; ++i) out[i] = 0.f;
  for (int64_t j0 = 0; j0 < n_keys; j0 += 8) {
    const int64_t nk = std::min<int64_t>(8, n_keys - j0);
    rows_f32<T>(kv.v_blocks, kv, off, j0, nk, n_keys, head_dim, buf, rp);
    for (int64_t g = 0; g < n_q; ++g) {
      const float* p = scores + g * n_keys + j0;
      float* og = out + g * head_dim;
      for (int64_t d0 = 0; d0 < head_dim; d0 += 64) {  // up to 8 registers of the output
        const int n8 = static_cast<int>(std::min<int64_t>(64, head_dim - d0) / 8);
        __m256 acc[8];
        for (int k = 0; k < n8; ++k) acc[k] = _mm256_loadu_ps(og + d0 + 8 * k);
        for (int64_t r = 0; r < nk; ++r) {
          const __m256 pv = _mm256_set1_ps(p[r]);
          for (int k = 0; k < n8; ++k) acc[k] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(rp[r] + d0 + 8 * k), acc[k]);
        }
        for (int k = 0; k < n8; ++k) _mm256_storeu_ps(og + d0 + 8 * k, acc[k]);
      }
    }
  }
}

// n floats (n % 32 == 0) as Q8_0 blocks. The scale is rounded to fp16 before quantizing, so the
// stored d is the one the values were divided by: |x - d * q| <= d / 2 (the clamp only trims
// the max element by less than fp16's rounding of d, well under d / 2).
void store_row_q8_0(const float* x, block_q8_0* out, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.f), lim = _mm256_set1_ps(127.f), neg_lim = _mm256_set1_ps(-127.f);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    const uint16_t dh = _cvtss_sh(hmax(amax) / 127.f, _MM_FROUND_TO_NEAREST_INT);
    const float d = _cvtsh_ss(dh);
    const __m256 id = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, neg_lim), lim));
    }
    // Packing works within 128-bit lanes: the bytes come out as 0-3 8-11 16-19 24-27 4-7 12-15
    // 20-23 28-31 (4-byte groups); the permute puts the groups back in order.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    out[i].d = dh;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].qs),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
}

}  // namespace

void attend_group(const float* q, int64_t n_q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                  int64_t head_dim, float scale, float* scratch, float* out) {
  if (head_dim % 8 != 0 || head_dim > 256) {
    for (int64_t g = 0; g < n_q; ++g)
      attend_head(q + g * head_dim, n_keys, kv, kv_head, head_dim, scale, scratch, out + g * head_dim);
    return;
  }
  switch (kv.type) {
    case kv_type::f32:
      return attend_group_vec<kv_type::f32>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out);
    case kv_type::f16:
      return attend_group_vec<kv_type::f16>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out);
    case kv_type::q8_0:
      return attend_group_vec<kv_type::q8_0>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out);
  }
}

void store_kv_row(const float* src, void* dst, int64_t n, kv_type type) {
  if (type == kv_type::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  if (type == kv_type::q8_0) {
    store_row_q8_0(src, static_cast<block_q8_0*>(dst), n);
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
  switch (kv.type) {
    case kv_type::f32:
      return attend<kv_type::f32>(q, n_keys, kv, kv_head, head_dim, scale, scores, out);
    case kv_type::f16:
      return attend<kv_type::f16>(q, n_keys, kv, kv_head, head_dim, scale, scores, out);
    case kv_type::q8_0:
      return attend<kv_type::q8_0>(q, n_keys, kv, kv_head, head_dim, scale, scores, out);
  }
}

}  // namespace sy::cpu
