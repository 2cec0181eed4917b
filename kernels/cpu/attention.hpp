// Attention of one query head over a sequence's cached keys and values.
//
// K and V are read through a block table: logical block b of the sequence holds positions
// [b * block_size, (b + 1) * block_size); each row (one position) is row_stride elements,
// n_kv_heads * head_dim of them, stored as `type`. A contiguous cache is the one-block case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace sy::cpu {

enum class kv_type : uint8_t { f32, f16 };
inline size_t kv_elem_bytes(kv_type t) { return t == kv_type::f32 ? 4 : 2; }
inline const char* kv_type_name(kv_type t) { return t == kv_type::f32 ? "f32" : "f16"; }
inline std::optional<kv_type> parse_kv_type(const std::string& s) {
  if (s == "f32") return kv_type::f32;
  if (s == "f16") return kv_type::f16;
  return std::nullopt;
}

struct kv_layer_view {
  const void* const* k_blocks = nullptr;
  const void* const* v_blocks = nullptr;
  int64_t block_size = 0;  // positions per block
  int64_t row_stride = 0;  // elements per position
  kv_type type = kv_type::f32;
};

// Stores one position's K or V row (n floats) as `type` at `dst`.
void store_kv_row(const float* src, void* dst, int64_t n, kv_type type);

// out[0, head_dim) = softmax(scale * q . K[0..n_keys)) V[0..n_keys) for kv head `kv_head`.
// `scores` is scratch of at least n_keys floats.
void attend_head(const float* q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head, int64_t head_dim,
                 float scale, float* scores, float* out);

// The n_q query heads that share kv head `kv_head` (grouped-query attention) at once: q and out
// hold n_q consecutive heads of head_dim floats each. Same result as attend_head per head, but
// each K/V row is read and converted once for the group, dot products are reduced 8 keys at a
// time, and outputs accumulate in registers. `scratch`: attend_group_scratch floats. Each head's
// result depends only on its own inputs, never on n_q (bitwise): a group of one is the same.
void attend_group(const float* q, int64_t n_q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                  int64_t head_dim, float scale, float* scratch, float* out);
inline int64_t attend_group_scratch(int64_t n_q, int64_t n_keys, int64_t head_dim) {
  return n_q * n_keys + 8 * head_dim + 8;
}

}  // namespace sy::cpu
