// Grouped attention over the worker's heads-layout cache (attention.hpp) with AVX-512, for f16 and
// f32 K/V: the same operations per element as attention.cpp's AVX2 loops, 16 lanes at a time, so
// the results are bitwise the same (tests/unit/test_kernels.cpp holds the two against each other).
//  * scores: a dimension-major K slice gives 16 keys per vector; score = fma over d = 0, 1, ... of
//    q[d] * k[d] from zero, then * scale.
//  * values: out[g][d] = fma over keys j = 0, 1, ... of p[g][j] * v[j][d] from zero. Each V row is
//    converted once into registers and used by every head of the pass; the heads' outputs stay in
//    registers over all the keys (as attention.cpp's values_regs, 8 lanes at a time).
// Compiled with -mavx512{f,bw,vl,dq,...}; only called when use_avx512_vnni_kernels().
// GCC 12 flags the self-initialised placeholder inside _mm512_undefined_* that some intrinsics use
// (GCC bug 105593), a false positive; nothing else in this file needs the warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/ops.hpp"

namespace sy::cpu {
namespace {

template <kv_type T>
inline __m512 load16(const uint8_t* p) {
  if constexpr (T == kv_type::f32)
    return _mm512_loadu_ps(p);
  else
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
constexpr int64_t elem_bytes(kv_type t) { return t == kv_type::f32 ? 4 : 2; }

// Scores of H heads against V vectors of 16 keys: vector v's keys start at keys[v] (dimension 0 of
// 16 consecutive positions of a dimension-major slice, the next dimension bs positions on). Two
// vectors give each head two independent FMA chains: with one, four heads' chains wait on the FMA
// latency; the two may lie in one block or in two (16-key blocks).
template <kv_type T, int V, int H>
void scores16(const float* q, int64_t head_dim, const uint8_t* const* keys, const uint8_t* const* ahead, int64_t bs,
              float scale, float* const* out) {
  __m512 acc[H][V];
  for (int h = 0; h < H; ++h)
    for (int v = 0; v < V; ++v) acc[h][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    __m512 k[V];
    for (int v = 0; v < V; ++v)
      _mm_prefetch(reinterpret_cast<const char*>(ahead[v] + d * bs * elem_bytes(T)), _MM_HINT_T0);
    for (int v = 0; v < V; ++v) k[v] = load16<T>(keys[v] + d * bs * elem_bytes(T));
    for (int h = 0; h < H; ++h) {
      const __m512 qd = _mm512_set1_ps(q[h * head_dim + d]);
      for (int v = 0; v < V; ++v) acc[h][v] = _mm512_fmadd_ps(qd, k[v], acc[h][v]);
    }
  }
  const __m512 vs = _mm512_set1_ps(scale);
  for (int h = 0; h < H; ++h)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out[h] + 16 * v, _mm512_mul_ps(acc[h][v], vs));
}

using scores_fn = void (*)(const float*, int64_t, const uint8_t* const*, const uint8_t* const*, int64_t, float,
                           float* const*);

// out[g][d0, d0 + 16 N) for H heads g, over all n_keys keys (the values pass). One loop over the
// keys, the row pointer moved to the next block at each block's start: with a loop per block GCC 12
// stored every accumulator to the stack once per key (16 stores per 16 FMAs, twice the time).
template <kv_type T, int N, int H>
void values16(const float* p, int64_t stride, int64_t n_keys, const kv_layer_view& kv, int64_t head_off,
              int64_t head_dim, int64_t d0, float* out) {
  const int64_t bs = kv.block_size, row_bytes = head_dim * elem_bytes(T);
  const int64_t n_blocks = (n_keys + bs - 1) / bs;
  __m512 acc[H][N];
  for (int h = 0; h < H; ++h)
    for (int k = 0; k < N; ++k) acc[h][k] = _mm512_setzero_ps();
  // The first pass over the dimensions prefetches the stream (attention.hpp) a row per key: the
  // same row of the slice two on.
  const uint8_t* row = nullptr;
  const uint8_t* ahead = nullptr;
  int64_t ahead_bytes = 0;
  for (int64_t j = 0, b = 0, block_end = 0; j < n_keys; ++j, row += row_bytes, ahead += row_bytes) {
    if (j == block_end) {  // block b starts
      block_end += bs;
      row = static_cast<const uint8_t*>(kv.v_blocks[b]) + head_off + d0 * elem_bytes(T);
      const uint8_t* next = d0 == 0 ? kv_stream_slice(kv, head_off, n_blocks + b + 2, n_keys) : nullptr;
      ahead = next ? next : row;  // past the stream's end: nothing prefetched
      ahead_bytes = next ? row_bytes : 0;
      ++b;
    }
    for (int64_t c = 0; c < ahead_bytes; c += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + c), _MM_HINT_T0);
    __m512 v[N];
    for (int k = 0; k < N; ++k) v[k] = load16<T>(row + 16 * k * elem_bytes(T));
    for (int h = 0; h < H; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h * stride + j]);
      for (int k = 0; k < N; ++k) acc[h][k] = _mm512_fmadd_ps(ph, v[k], acc[h][k]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int k = 0; k < N; ++k) _mm512_storeu_ps(out + h * head_dim + d0 + 16 * k, acc[h][k]);
}

using values_fn = void (*)(const float*, int64_t, int64_t, const kv_layer_view&, int64_t, int64_t, int64_t, float*);

// Heads per values pass for N vectors of output per head: N * H accumulators, N rows, one broadcast.
template <kv_type T, int N>
constexpr values_fn values_by_heads[] = {nullptr,
                                         &values16<T, N, 1>,
                                         &values16<T, N, 2>,
                                         &values16<T, N, 3>,
                                         &values16<T, N, 4>,
                                         &values16<T, N, 5>,
                                         &values16<T, N, 6>};

template <kv_type T>
void attend_group_dm16(const float* q, int64_t n_q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                       int64_t head_dim, float scale, float* scratch, float* out, int64_t n_masked) {
  const int64_t bs = kv.block_size, stride = (n_keys + 31) / 32 * 32;
  const int64_t head_off = kv_head_offset(kv, kv_head, head_dim);
  float* scores = scratch;  // [n_q][stride]; lanes past n_keys are scratch
  // 32 keys per step (two chains per head) where the heads are few and 16 keys past these are
  // left; the lanes past n_keys in the last vector read a block's unused slots and are scratch.
  static constexpr scores_fn by_heads_32[] = {nullptr, &scores16<T, 2, 1>, &scores16<T, 2, 2>, &scores16<T, 2, 3>,
                                              &scores16<T, 2, 4>};
  static constexpr scores_fn by_heads_16[] = {nullptr,
                                              &scores16<T, 1, 1>,
                                              &scores16<T, 1, 2>,
                                              &scores16<T, 1, 3>,
                                              &scores16<T, 1, 4>,
                                              &scores16<T, 1, 5>,
                                              &scores16<T, 1, 6>,
                                              &scores16<T, 1, 7>,
                                              &scores16<T, 1, 8>};
  const int64_t slice_bytes = bs * head_dim * elem_bytes(T);
  auto key_vector = [&](int64_t j) {  // keys j..j+15 (j a multiple of 16): dimension 0 of the 16
    return static_cast<const uint8_t*>(kv.k_blocks[j / bs]) + head_off + j % bs * elem_bytes(T);
  };
  for (int64_t j0 = 0; j0 < n_keys;) {
    const bool wide = n_q <= 4 && j0 + 16 < n_keys;
    const int P = wide ? 32 : 16;
    const int64_t max_heads = wide ? 4 : 8;
    const scores_fn* by_heads = wide ? by_heads_32 : by_heads_16;
    const uint8_t* keys[2] = {key_vector(j0), wide ? key_vector(j0 + 16) : nullptr};
    // The stream (attention.hpp) a line per dimension: the same bytes of the slice two on, or of
    // this one past its end (already in L1).
    const uint8_t* ahead[2];
    for (int v = 0; v < P / 16; ++v) {
      const int64_t j = j0 + 16 * v;
      const uint8_t* a = kv_stream_slice(kv, head_off, j / bs + 2, n_keys);
      ahead[v] = a ? a + j % bs * elem_bytes(T) : keys[v];
    }
    if (j0 == 0) prefetch_kv_slice(kv, head_off, slice_bytes, 1, n_keys);
    for (int64_t h0 = 0; h0 < n_q;) {
      const int H = static_cast<int>(std::min<int64_t>(n_q - h0, max_heads));
      float* o[8];
      for (int h = 0; h < H; ++h) o[h] = scores + (h0 + h) * stride + j0;
      by_heads[H](q + h0 * head_dim, head_dim, keys, ahead, bs, scale, o);
      h0 += H;
    }
    j0 += P;
  }
  for (int64_t g = 0; g < n_q; ++g) masked_softmax(scores + g * stride, n_keys, n_masked);
  // Values: 64 output elements of up to 6 heads per pass (24 accumulators), or 32 / 16 of more.
  for (int64_t d0 = 0; d0 < head_dim;) {
    const int64_t left = head_dim - d0;
    const int N = left >= 64 ? 4 : left >= 32 ? 2 : 1;
    for (int64_t h0 = 0; h0 < n_q;) {
      const int H = static_cast<int>(std::min<int64_t>(n_q - h0, 6));
      const values_fn* fns = N == 4 ? values_by_heads<T, 4> : N == 2 ? values_by_heads<T, 2> : values_by_heads<T, 1>;
      fns[H](scores + h0 * stride, stride, n_keys, kv, head_off, head_dim, d0, out + h0 * head_dim);
      h0 += H;
    }
    d0 += 16 * N;
  }
}

}  // namespace

bool attend_group_avx512(const float* q, int64_t n_q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                         int64_t head_dim, float scale, float* scratch, float* out, int64_t n_masked) {
  if (!k_dim_major(kv) || head_dim % 16 != 0 || head_dim > 256 || kv.block_size % 16 != 0) return false;
  switch (kv.type) {
    case kv_type::f16:
      attend_group_dm16<kv_type::f16>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out, n_masked);
      return true;
    case kv_type::f32:
      attend_group_dm16<kv_type::f32>(q, n_q, n_keys, kv, kv_head, head_dim, scale, scratch, out, n_masked);
      return true;
    default:
      return false;
  }
}

}  // namespace sy::cpu
