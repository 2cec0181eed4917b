#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
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
            float* scores, float* out, int64_t n_masked) {
  const int64_t head_off = kv_head_offset(kv, kv_head, head_dim), pos_stride = kv_position_stride(kv, head_dim);
  auto row = [&](const void* const* blocks, int64_t j) {
    return static_cast<const uint8_t*>(blocks[j / kv.block_size]) + head_off + (j % kv.block_size) * pos_stride;
  };
  const bool vec = head_dim % 8 == 0 && head_dim <= 256;
  for (int64_t j = 0; j < n_keys; ++j) {
    float dot;
    if (k_dim_major(kv)) {  // element d of key j sits at d * block_size + j % block_size
      const uint8_t* slice = static_cast<const uint8_t*>(kv.k_blocks[j / kv.block_size]) + head_off;
      const int64_t p = j % kv.block_size;
      dot = 0;
      if constexpr (T == kv_type::q8_0) {  // per 32-element block: its scale times the block's sum
        const uint16_t* sc = q8_dm_scales(slice);
        const int8_t* k8 = q8_dm_values(slice, head_dim, kv.block_size);
        for (int64_t b = 0; b < head_dim / qk; ++b) {
          float part = 0;
          for (int64_t d = b * qk; d < (b + 1) * qk; ++d)
            part = std::fma(q[d], static_cast<float>(k8[d * kv.block_size + p]), part);
          dot = std::fma(part, fp16_to_fp32(sc[b * kv.block_size + p]), dot);
        }
      } else {
        for (int64_t d = 0; d < head_dim; ++d) dot += q[d] * load1<T>(slice, d * kv.block_size + p);
      }
      scores[j] = dot * scale;
      continue;
    }
    const void* k = row(kv.k_blocks, j);
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
  masked_softmax(scores, n_keys, n_masked);
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
// The conversion of a row depends only on the row, never on how many query heads read it.
template <kv_type T>
inline void rows_f32(const void* const* blocks, const kv_layer_view& kv, int64_t kv_head, int64_t j0, int64_t nk,
                     int64_t n_keys_total, int64_t head_dim, float* buf, const float** out) {
  const int64_t slice_bytes = kv_row_bytes(T, head_dim);
  const int64_t head_off = kv_head_offset(kv, kv_head, head_dim), pos_stride = kv_position_stride(kv, head_dim);
  auto at = [&](int64_t j) {
    return static_cast<const uint8_t*>(blocks[j / kv.block_size]) + head_off + (j % kv.block_size) * pos_stride;
  };
  for (int64_t r = 0; r < nk; ++r) {
    const int64_t j = j0 + r;
    const uint8_t* p = at(j);
    // The next chunk's rows: KV rows are scattered over blocks and far apart in memory, so
    // the hardware prefetcher alone leaves the conversion waiting on loads.
    if (j + 8 < n_keys_total) {
      const char* pn = reinterpret_cast<const char*>(at(j + 8));
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
void values_rows(const float* scores, int64_t stride, int64_t n_q, int64_t n_keys, const kv_layer_view& kv,
                 int64_t kv_head, int64_t head_dim, float* buf, float* out);

template <kv_type T>
void attend_group_vec(const float* q, int64_t n_q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                      int64_t head_dim, float scale, float* scratch, float* out, int64_t n_masked) {
  float* scores = scratch;              // [n_q][n_keys]
  float* buf = scratch + n_q * n_keys;  // attend_value_rows converted rows
  const float* rp[8];
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t j0 = 0; j0 < n_keys; j0 += 8) {
    const int64_t nk = std::min<int64_t>(8, n_keys - j0);
    rows_f32<T>(kv.k_blocks, kv, kv_head, j0, nk, n_keys, head_dim, buf, rp);
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
  for (int64_t g = 0; g < n_q; ++g) masked_softmax(scores + g * n_keys, n_keys, n_masked);
  values_rows<T>(scores, n_keys, n_q, n_keys, kv, kv_head, head_dim, buf, out);
}

// out[g] = sum over keys j of p[g][j] * V[j] for the n_q heads (p[g] at scores + g * stride):
// V rows are converted attend_value_rows at a time into `buf`, once for all heads, and each head's
// output stays in registers over them; each output element accumulates over j = 0, 1, ... from
// zero whatever the chunking.
template <kv_type T>
void values_rows(const float* scores, int64_t stride, int64_t n_q, int64_t n_keys, const kv_layer_view& kv,
                 int64_t kv_head, int64_t head_dim, float* buf, float* out) {
  const float* rp[attend_value_rows];
  for (int64_t i = 0; i < n_q * head_dim; ++i) out[i] = 0.f;
  for (int64_t j0 = 0; j0 < n_keys; j0 += attend_value_rows) {
    const int64_t nk = std::min<int64_t>(attend_value_rows, n_keys - j0);
    rows_f32<T>(kv.v_blocks, kv, kv_head, j0, nk, n_keys, head_dim, buf, rp);
    for (int64_t g = 0; g < n_q; ++g) {
      const float* p = scores + g * stride + j0;
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

// Eight elements [i, i + 8) of an f32 or f16 slice as floats.
template <kv_type T>
inline __m256 load8_at(const uint8_t* slice, int64_t i) {
  if constexpr (T == kv_type::f32)
    return _mm256_loadu_ps(reinterpret_cast<const float*>(slice) + i);
  else
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(slice) + i)));
}

// Scores of H query heads against P keys of one block, one key per lane: K is dimension-major
// ([head_dim][block_size]), so every step is a broadcast q element times 8 keys' element d.
// A score's arithmetic is fma over d = 0, 1, ... from zero, then * scale: the same whatever P,
// H or the number of heads in the group (batching invariance).
template <kv_type T, int P, int H>
inline void scores_dm(const float* q, int64_t head_dim, const uint8_t* kslice, int64_t bs, int64_t p0, float scale,
                      float* const* out) {
  constexpr int V = P / 8;
  __m256 acc[H][V];
  for (int h = 0; h < H; ++h)
    for (int v = 0; v < V; ++v) acc[h][v] = _mm256_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    __m256 k[V];
    for (int v = 0; v < V; ++v) k[v] = load8_at<T>(kslice, d * bs + p0 + 8 * v);
    for (int h = 0; h < H; ++h) {
      const __m256 qd = _mm256_broadcast_ss(q + h * head_dim + d);
      for (int v = 0; v < V; ++v) acc[h][v] = _mm256_fmadd_ps(qd, k[v], acc[h][v]);
    }
  }
  const __m256 vs = _mm256_set1_ps(scale);
  for (int h = 0; h < H; ++h)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(out[h] + 8 * v, _mm256_mul_ps(acc[h][v], vs));
}

// The same for a dimension-major q8_0 K slice (q8_dm_scales / q8_dm_values): per 32-element block
// b, part = fma over its d = 32b, 32b + 1, ... of q[d] * int8 key element, from zero; then
// score = fma(part, d_b, score) over b = 0, 1, ... from zero, then * scale. The int8 values of 8
// keys are converted once per d for all H heads. Again the same whatever P, H or the group.
template <int P, int H>
inline void scores_dm_q8(const float* q, int64_t head_dim, const uint8_t* kslice, int64_t bs, int64_t p0, float scale,
                         float* const* out) {
  constexpr int V = P / 8;
  const uint16_t* sc = q8_dm_scales(kslice) + p0;
  const int8_t* k8 = q8_dm_values(kslice, head_dim, bs) + p0;
  __m256 tot[H][V];
  for (int h = 0; h < H; ++h)
    for (int v = 0; v < V; ++v) tot[h][v] = _mm256_setzero_ps();
  for (int64_t b = 0; b < head_dim / qk; ++b) {
    __m256 acc[H][V];
    for (int h = 0; h < H; ++h)
      for (int v = 0; v < V; ++v) acc[h][v] = _mm256_setzero_ps();
    for (int64_t d = b * qk; d < (b + 1) * qk; ++d) {
      __m256 k[V];
      for (int v = 0; v < V; ++v)
        k[v] = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(k8 + d * bs + 8 * v))));
      for (int h = 0; h < H; ++h) {
        const __m256 qd = _mm256_broadcast_ss(q + h * head_dim + d);
        for (int v = 0; v < V; ++v) acc[h][v] = _mm256_fmadd_ps(qd, k[v], acc[h][v]);
      }
    }
    for (int v = 0; v < V; ++v) {
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + b * bs + 8 * v)));
      for (int h = 0; h < H; ++h) tot[h][v] = _mm256_fmadd_ps(acc[h][v], dv, tot[h][v]);
    }
  }
  const __m256 vs = _mm256_set1_ps(scale);
  for (int h = 0; h < H; ++h)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(out[h] + 8 * v, _mm256_mul_ps(tot[h][v], vs));
}

using scores_fn = void (*)(const float*, int64_t, const uint8_t*, int64_t, int64_t, float, float* const*);
// The values pass with the outputs in registers (heads layout: a head's V rows position-major in
// each block): out[g][d0, d0 + 8 N) for H heads g over all n_keys keys, each V row's part
// converted once for all H heads (values_rows converts rows into a buffer and reloads them per
// head). Per element the same conversion (load8) and fma over j = 0, 1, ... from zero as values_rows.
template <kv_type T, int N, int H>
void values_regs(const float* p, int64_t stride, int64_t n_keys, const kv_layer_view& kv, int64_t head_off,
                 int64_t head_dim, int64_t d0, float* out) {
  const int64_t bs = kv.block_size, row_bytes = kv_row_bytes(T, head_dim), slice_bytes = bs * row_bytes;
  const int64_t n_blocks = (n_keys + bs - 1) / bs;
  __m256 acc[H][N];
  for (int h = 0; h < H; ++h)
    for (int k = 0; k < N; ++k) acc[h][k] = _mm256_setzero_ps();
  const uint8_t* row = nullptr;
  for (int64_t j = 0, b = 0, block_end = 0; j < n_keys; ++j, row += row_bytes) {
    if (j == block_end) {  // block b starts
      block_end += bs;
      if (d0 == 0) prefetch_kv_slice(kv, head_off, slice_bytes, n_blocks + b + 1, n_keys);  // the next V block
      row = static_cast<const uint8_t*>(kv.v_blocks[b++]) + head_off;
    }
    __m256 v[N];
    for (int k = 0; k < N; ++k) v[k] = load8<T>(row, d0 + 8 * k);
    for (int h = 0; h < H; ++h) {
      const __m256 ph = _mm256_set1_ps(p[h * stride + j]);
      for (int k = 0; k < N; ++k) acc[h][k] = _mm256_fmadd_ps(ph, v[k], acc[h][k]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int k = 0; k < N; ++k) _mm256_storeu_ps(out + h * head_dim + d0 + 8 * k, acc[h][k]);
}

using values_fn = void (*)(const float*, int64_t, int64_t, const kv_layer_view&, int64_t, int64_t, int64_t, float*);

// 16 output elements of up to 4 heads per pass (8 accumulators, 2 rows, one broadcast), or 8.
template <kv_type T>
void values_by_regs(const float* scores, int64_t stride, int64_t n_q, int64_t n_keys, const kv_layer_view& kv,
                    int64_t head_off, int64_t head_dim, float* out) {
  static constexpr values_fn wide[] = {nullptr, &values_regs<T, 2, 1>, &values_regs<T, 2, 2>, &values_regs<T, 2, 3>,
                                       &values_regs<T, 2, 4>};
  static constexpr values_fn narrow[] = {nullptr, &values_regs<T, 1, 1>, &values_regs<T, 1, 2>, &values_regs<T, 1, 3>,
                                         &values_regs<T, 1, 4>};
  for (int64_t d0 = 0; d0 < head_dim;) {
    const bool two = head_dim - d0 >= 16;
    for (int64_t h0 = 0; h0 < n_q;) {
      const int H = static_cast<int>(std::min<int64_t>(n_q - h0, 4));
      (two ? wide : narrow)[H](scores + h0 * stride, stride, n_keys, kv, head_off, head_dim, d0, out + h0 * head_dim);
      h0 += H;
    }
    d0 += two ? 16 : 8;
  }
}

// Keys per step (P) and the scores kernels by number of heads per pass (index H, up to
// max_heads): as many heads as the 16 registers hold. 32 keys per step where the block allows
// and the heads are few (more independent FMA chains).
struct scores_plan {
  int P;
  int64_t max_heads;
  const scores_fn* by_heads;
};
template <kv_type T>
scores_plan plan_scores(int64_t bs, int64_t n_q) {
  if constexpr (T == kv_type::q8_0) {  // acc and tot per (head, 8 keys), plus the converted keys
    static constexpr scores_fn by_heads_32[] = {nullptr, &scores_dm_q8<32, 1>};
    static constexpr scores_fn by_heads_16[] = {nullptr, &scores_dm_q8<16, 1>, &scores_dm_q8<16, 2>,
                                                &scores_dm_q8<16, 3>};
    static constexpr scores_fn by_heads_8[] = {nullptr,
                                               &scores_dm_q8<8, 1>,
                                               &scores_dm_q8<8, 2>,
                                               &scores_dm_q8<8, 3>,
                                               &scores_dm_q8<8, 4>,
                                               &scores_dm_q8<8, 5>,
                                               &scores_dm_q8<8, 6>};
    if (bs % 32 == 0 && n_q == 1) return {32, 1, by_heads_32};
    if (bs % 16 == 0) return {16, 3, by_heads_16};
    return {8, 6, by_heads_8};
  } else {
    static constexpr scores_fn by_heads_32[] = {nullptr, &scores_dm<T, 32, 1>, &scores_dm<T, 32, 2>};
    static constexpr scores_fn by_heads_16[] = {nullptr, &scores_dm<T, 16, 1>, &scores_dm<T, 16, 2>,
                                                &scores_dm<T, 16, 3>, &scores_dm<T, 16, 4>};
    static constexpr scores_fn by_heads_8[] = {nullptr, &scores_dm<T, 8, 1>, &scores_dm<T, 8, 2>, &scores_dm<T, 8, 3>,
                                               &scores_dm<T, 8, 4>};
    if (bs % 32 == 0 && n_q <= 2) return {32, 2, by_heads_32};
    if (bs % 16 == 0) return {16, 4, by_heads_16};
    return {8, 4, by_heads_8};
  }
}

// Grouped attention over a heads-layout cache (block_size % 8 == 0, head_dim % 8 == 0).
template <kv_type T>
void attend_group_dm(const float* q, int64_t n_q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                     int64_t head_dim, float scale, float* scratch, float* out, int64_t n_masked) {
  const int64_t bs = kv.block_size, stride = (n_keys + 31) / 32 * 32;
  const int64_t head_off = kv_head_offset(kv, kv_head, head_dim);
  float* scores = scratch;  // [n_q][stride]; lanes past n_keys are scratch
  const scores_plan plan = plan_scores<T>(bs, n_q);
  const int P = plan.P;
  const int64_t max_heads = plan.max_heads;
  const scores_fn* by_heads = plan.by_heads;
  for (int64_t j0 = 0; j0 < n_keys; j0 += P) {
    const uint8_t* kslice = static_cast<const uint8_t*>(kv.k_blocks[j0 / bs]) + head_off;
    const int64_t p0 = j0 % bs;
    if (p0 == 0) prefetch_kv_stream(kv, head_off, kv_row_bytes(T, head_dim) * bs, j0 / bs, n_keys);
    for (int64_t h0 = 0; h0 < n_q;) {
      const int H = static_cast<int>(std::min<int64_t>(n_q - h0, max_heads));
      float* o[8];
      for (int h = 0; h < H; ++h) o[h] = scores + (h0 + h) * stride + j0;
      by_heads[H](q + h0 * head_dim, head_dim, kslice, bs, p0, scale, o);
      h0 += H;
    }
  }
  for (int64_t g = 0; g < n_q; ++g) masked_softmax(scores + g * stride, n_keys, n_masked);
  values_by_regs<T>(scores, stride, n_q, n_keys, kv, head_off, head_dim, out);
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
                  int64_t head_dim, float scale, float* scratch, float* out, int64_t n_masked) {
  if (use_avx512_vnni_kernels() &&
      attend_group_avx512(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out, n_masked))
    return;
  if (head_dim % 8 != 0 || head_dim > 256) {
    for (int64_t g = 0; g < n_q; ++g)
      attend_head(q + g * head_dim, n_keys, kv, kv_head, head_dim, scale, scratch, out + g * head_dim, n_masked);
    return;
  }
  if (k_dim_major(kv)) {
    if (kv.block_size % 8 != 0) {
      for (int64_t g = 0; g < n_q; ++g)
        attend_head(q + g * head_dim, n_keys, kv, kv_head, head_dim, scale, scratch, out + g * head_dim, n_masked);
      return;
    }
    switch (kv.type) {
      case kv_type::f32:
        return attend_group_dm<kv_type::f32>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out, n_masked);
      case kv_type::f16:
        return attend_group_dm<kv_type::f16>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out, n_masked);
      case kv_type::q8_0:
        return attend_group_dm<kv_type::q8_0>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out, n_masked);
    }
  }
  switch (kv.type) {
    case kv_type::f32:
      return attend_group_vec<kv_type::f32>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out, n_masked);
    case kv_type::f16:
      return attend_group_vec<kv_type::f16>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out, n_masked);
    case kv_type::q8_0:
      return attend_group_vec<kv_type::q8_0>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out, n_masked);
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

void store_kv_head(const float* src, void* block, const kv_layer_view& kv, int64_t pos_in_block, int64_t kv_head,
                   int64_t head_dim, bool is_key) {
  uint8_t* slice = static_cast<uint8_t*>(block) + kv_head_offset(kv, kv_head, head_dim);
  if (!(is_key && k_dim_major(kv))) {
    store_kv_row(src, slice + pos_in_block * kv_position_stride(kv, head_dim), head_dim, kv.type);
    return;
  }
  if (kv.type == kv_type::q8_0) {  // the key's Q8_0 row, each scale and value put in its place
    const int64_t nb = head_dim / qk, bs = kv.block_size;
    block_q8_0 small[8];
    std::vector<block_q8_0> large(nb > 8 ? nb : 0);
    block_q8_0* row = nb > 8 ? large.data() : small;
    store_row_q8_0(src, row, head_dim);
    auto* sc = reinterpret_cast<uint16_t*>(slice);
    int8_t* k8 = reinterpret_cast<int8_t*>(slice) + 2 * nb * bs;
    for (int64_t b = 0; b < nb; ++b) {
      sc[b * bs + pos_in_block] = row[b].d;
      for (int k = 0; k < qk; ++k) k8[(b * qk + k) * bs + pos_in_block] = row[b].qs[k];
    }
    return;
  }
  for (int64_t d = 0; d < head_dim; ++d) {
    const int64_t at = d * kv.block_size + pos_in_block;
    if (kv.type == kv_type::f32)
      reinterpret_cast<float*>(slice)[at] = src[d];
    else
      reinterpret_cast<uint16_t*>(slice)[at] = fp32_to_fp16(src[d]);
  }
}

void attend_head(const float* q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head, int64_t head_dim,
                 float scale, float* scores, float* out, int64_t n_masked) {
  switch (kv.type) {
    case kv_type::f32:
      return attend<kv_type::f32>(q, n_keys, kv, kv_head, head_dim, scale, scores, out, n_masked);
    case kv_type::f16:
      return attend<kv_type::f16>(q, n_keys, kv, kv_head, head_dim, scale, scores, out, n_masked);
    case kv_type::q8_0:
      return attend<kv_type::q8_0>(q, n_keys, kv, kv_head, head_dim, scale, scores, out, n_masked);
  }
}

}  // namespace sy::cpu
