// Attention of one query head over a sequence's cached keys and values.
//
// K and V are read through a block table: logical block b of the sequence holds positions
// [b * block_size, (b + 1) * block_size); each row (one position) is row_stride elements,
// n_kv_heads * head_dim of them, stored as `type` in kv_row_bytes(type, row_stride) bytes. A
// contiguous cache is the one-block case.
//
// q8_0 rows are GGML's Q8_0 blocks (block_q8_0: an fp16 scale d and 32 int8 q, x ~ d * q; 34
// bytes per 32 elements), so a kv head's slice starts at block kv_head * head_dim / 32: q8_0
// needs head_dim % 32 == 0 (kv_type_error says so).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant.hpp"

namespace sy::cpu {

enum class kv_type : uint8_t { f32, f16, q8_0 };
inline const char* kv_type_name(kv_type t) { return t == kv_type::f32 ? "f32" : t == kv_type::f16 ? "f16" : "q8_0"; }
// Bytes of n consecutive elements of a row stored as t (q8_0: n a multiple of 32).
inline int64_t kv_row_bytes(kv_type t, int64_t n) {
  switch (t) {
    case kv_type::f32:
      return 4 * n;
    case kv_type::f16:
      return 2 * n;
    case kv_type::q8_0:
      return n / qk * static_cast<int64_t>(sizeof(block_q8_0));
  }
  return 0;
}
// Empty when heads of head_dim elements can be stored as t; otherwise why not.
inline std::string kv_type_error(kv_type t, int64_t head_dim) {
  if (t == kv_type::q8_0 && head_dim % qk != 0)
    return "KV type q8_0 needs a head dimension that is a multiple of 32 (this model's is " + std::to_string(head_dim) +
           "); use f16 or f32";
  return {};
}
inline std::optional<kv_type> parse_kv_type(const std::string& s) {
  if (s == "f32") return kv_type::f32;
  if (s == "f16") return kv_type::f16;
  if (s == "q8_0") return kv_type::q8_0;
  return std::nullopt;
}
// For a model with heads of head_dim elements: the type, or nullopt and `error` says why not.
inline std::optional<kv_type> parse_kv_type(const std::string& s, int64_t head_dim, std::string& error) {
  const auto t = parse_kv_type(s);
  if (!t) {
    error = "KV type must be f16, f32 or q8_0 (got '" + s + "')";
    return std::nullopt;
  }
  error = kv_type_error(*t, head_dim);
  if (!error.empty()) return std::nullopt;
  return t;
}

// Layout of the rows inside a block.
//  * rows: [position][row_stride] (all kv heads of a position together);
//  * heads (the worker's CPU arena): [kv head][slice], one kv head's keys contiguous so attention
//    streams them. The K slice is dimension-major, so a key block's scores come out of plain
//    FMAs with one key per lane (no horizontal sums): f32/f16 [head_dim][block_size]; q8_0 the
//    fp16 scales [head_dim / 32][block_size], then the int8 values [head_dim][block_size] (the
//    same d and q as a Q8_0 row of the key, only placed differently; same bytes per slice). The
//    V slice is [block_size][head_dim] (q8_0: Q8_0 rows).
enum class kv_layout : uint8_t { rows, heads };

struct kv_layer_view {
  const void* const* k_blocks = nullptr;
  const void* const* v_blocks = nullptr;
  int64_t block_size = 0;  // positions per block
  int64_t row_stride = 0;  // elements per position (all kv heads)
  kv_type type = kv_type::f32;
  kv_layout layout = kv_layout::rows;
};
// Whether K slices are dimension-major (heads layout, every type).
inline bool k_dim_major(const kv_layer_view& kv) { return kv.layout == kv_layout::heads; }
// A dimension-major q8_0 K slice of a block of block_size positions: the scale of key p's 32-element
// block b at scales[b * block_size + p], its element d at values[d * block_size + p].
inline const uint16_t* q8_dm_scales(const void* slice) { return static_cast<const uint16_t*>(slice); }
inline const int8_t* q8_dm_values(const void* slice, int64_t head_dim, int64_t block_size) {
  return static_cast<const int8_t*>(slice) + 2 * (head_dim / qk) * block_size;
}
// Bytes from a block's start to kv head `kv_head`'s slice (heads) or to its part of position 0 (rows).
inline int64_t kv_head_offset(const kv_layer_view& kv, int64_t kv_head, int64_t head_dim) {
  const int64_t slice = kv_row_bytes(kv.type, head_dim);
  return kv.layout == kv_layout::heads ? kv_head * kv.block_size * slice : kv_head * slice;
}
// Bytes between consecutive positions of one kv head in a position-major slice (V; rows-layout K).
inline int64_t kv_position_stride(const kv_layer_view& kv, int64_t head_dim) {
  return kv.layout == kv_layout::heads ? kv_row_bytes(kv.type, head_dim) : kv_row_bytes(kv.type, kv.row_stride);
}

// Stores one position's K or V row (n floats) as `type` at `dst` (kv_row_bytes(type, n) bytes).
// q8_0: per 32 elements d = fp16(max|x| / 127), q = x / d rounded to nearest and clamped to
// [-127, 127], so |x - d * q| <= d / 2; an all-zero block stores d = 0.
void store_kv_row(const float* src, void* dst, int64_t n, kv_type type);
// Stores kv head `kv_head`'s key (is_key) or value (head_dim floats) for position `pos_in_block`
// into `block` as laid out by `kv` (either layout; the block pointers of `kv` are not used).
void store_kv_head(const float* src, void* block, const kv_layer_view& kv, int64_t pos_in_block, int64_t kv_head,
                   int64_t head_dim, bool is_key);

// out[0, head_dim) = softmax(scale * q . K[0..n_keys)) V[0..n_keys) for kv head `kv_head`.
// `scores` is scratch of at least n_keys floats. The first n_masked keys take no part (a sliding
// window that starts inside the view's first block): their weight is exactly 0.
void attend_head(const float* q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head, int64_t head_dim,
                 float scale, float* scores, float* out, int64_t n_masked = 0);

// The n_q query heads that share kv head `kv_head` (grouped-query attention) at once: q and out
// hold n_q consecutive heads of head_dim floats each. Same result as attend_head per head, but
// each K/V row is read and converted once for the group, dot products are reduced 8 keys at a
// time, and outputs accumulate in registers. `scratch`: attend_group_scratch floats. Each head's
// result depends only on its own inputs, never on n_q (bitwise): a group of one is the same.
void attend_group(const float* q, int64_t n_q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                  int64_t head_dim, float scale, float* scratch, float* out, int64_t n_masked = 0);
// Softmax of a row of scores whose first n_masked keys are outside a sliding window: they get
// -inf, which the vector exp turns into exactly 0, so they add nothing to the values.
inline void masked_softmax(float* scores, int64_t n_keys, int64_t n_masked) {
  for (int64_t j = 0; j < n_masked; ++j) scores[j] = -INFINITY;
  softmax_inplace(scores, n_keys);
}

// A heads-layout view read as one stream of slices: K of blocks 0 .. n-1, then V of blocks 0 .. n-1
// (n blocks hold n_keys keys; a slice is slice_bytes from head_off in its block). Blocks are
// scattered in memory, so the hardware prefetcher cannot run ahead of the passes; they prefetch
// the stream themselves, two slices ahead of the one they read, so that the first V slices arrive
// while the last scores are computed. The AVX-512 passes spread it, a line per dimension (scores)
// or per key (values), as they read the same bytes of their own slice; with the caller prefetching
// the next group's first slice (prefetch_attend_group), attention of 32 sequences of 160 keys went
// from ~12 to ~10 % of a decode step (a whole slice at once per block, 32 lines of an f16 head of
// 64 at 16 keys a block, measured no better: docs/cpu-backend.md).

// Slice s of that stream (its first byte), or nullptr past its end.
inline const uint8_t* kv_stream_slice(const kv_layer_view& kv, int64_t head_off, int64_t s, int64_t n_keys) {
  const int64_t n = (n_keys + kv.block_size - 1) / kv.block_size;
  if (s >= 2 * n) return nullptr;
  return static_cast<const uint8_t*>(s < n ? kv.k_blocks[s] : kv.v_blocks[s - n]) + head_off;
}
// Slice s on its way into L1 at once (a V slice only as far as it holds keys).
inline void prefetch_kv_slice(const kv_layer_view& kv, int64_t head_off, int64_t slice_bytes, int64_t s,
                              int64_t n_keys) {
  const uint8_t* base = kv_stream_slice(kv, head_off, s, n_keys);
  if (!base) return;
  const int64_t bs = kv.block_size, n = (n_keys + bs - 1) / bs;
  const int64_t bytes = s < n ? slice_bytes : std::min(slice_bytes, (n_keys - (s - n) * bs) * (slice_bytes / bs));
  for (int64_t c = 0; c < bytes; c += 64) __builtin_prefetch(base + c, 0, 3);
}
// At the start of K block b (the AVX2 scores): slice b + 2 at once, and at b == 0 also slice 1.
inline void prefetch_kv_stream(const kv_layer_view& kv, int64_t head_off, int64_t slice_bytes, int64_t b,
                               int64_t n_keys) {
  if (b == 0) prefetch_kv_slice(kv, head_off, slice_bytes, 1, n_keys);
  prefetch_kv_slice(kv, head_off, slice_bytes, b + 2, n_keys);
}
// The first K slice attend_group(kv, kv_head) reads, on its way into L1: a caller working through
// a list of groups calls it for the next one before the current one, whose scores then hide it.
inline void prefetch_attend_group(const kv_layer_view& kv, int64_t kv_head, int64_t head_dim, int64_t n_keys) {
  if (!k_dim_major(kv) || n_keys <= 0) return;
  prefetch_kv_slice(kv, kv_head_offset(kv, kv_head, head_dim), kv.block_size * kv_row_bytes(kv.type, head_dim), 0,
                    n_keys);
}

// attend_group on AVX-512 (attention_avx512.cpp), bitwise its results: f16/f32 heads-layout caches
// with head_dim and block_size multiples of 16; false (nothing done) for any other. Only where
// use_avx512_vnni_kernels(); attend_group calls it there.
bool attend_group_avx512(const float* q, int64_t n_q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                         int64_t head_dim, float scale, float* scratch, float* out, int64_t n_masked);
// V rows converted to f32 at a time (once for all the group's heads), so each head's output stays
// in registers over that many keys.
constexpr int64_t attend_value_rows = 32;
inline int64_t attend_group_scratch(int64_t n_q, int64_t n_keys, int64_t head_dim) {
  return n_q * ((n_keys + 31) / 32 * 32) + attend_value_rows * head_dim + 8;
}

}  // namespace sy::cpu
