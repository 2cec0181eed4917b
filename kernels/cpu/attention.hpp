// Attention of one query head over a sequence's cached keys and values.
//
// K and V are read through a block table: logical block b of the sequence holds positions
// [b * block_size, (b + 1) * block_size); each row (one position) is row_stride floats,
// n_kv_heads * head_dim of them. A contiguous cache is the one-block case.
#pragma once

#include <cstdint>

namespace sy::cpu {

struct kv_layer_view {
  const float* const* k_blocks = nullptr;
  const float* const* v_blocks = nullptr;
  int64_t block_size = 0;   // positions per block
  int64_t row_stride = 0;   // floats per position
};

// out[0, head_dim) = softmax(scale * q . K[0..n_keys)) V[0..n_keys) for kv head `kv_head`.
// `scores` is scratch of at least n_keys floats.
void attend_head(const float* q, int64_t n_keys, const kv_layer_view& kv, int64_t kv_head,
                 int64_t head_dim, float scale, float* scores, float* out);

}  // namespace sy::cpu
