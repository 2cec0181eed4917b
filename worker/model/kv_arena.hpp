// Storage for the KV cache: n_blocks blocks of block_size positions, for every layer, K and V.
// Which block belongs to which sequence is the block pool's business (bookkeeping only); this
// class only owns the bytes. Layout: k_[layer][block][...], each block in cpu::kv_layout::heads
// (attention.hpp: per kv head a contiguous slice, keys dimension-major); a position's K or V
// over all heads is kv_dim elements of `type`, cpu::kv_row_bytes(type, kv_dim) bytes (f16 by
// default: half the memory of f32, so twice the sequences per byte; q8_0 takes 34 bytes per 32
// elements, ~1.9x f16's sequences, and needs kv_dim % 32 == 0).
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/huge_pages.hpp"

namespace sy::cpu {
class thread_pool;
}

namespace sy {

class kv_arena {
 public:
  kv_arena() = default;
  // The bytes are zeroed here, over `pool` when given: the first write to each page is the
  // kernel providing it, which on a VM can take longer than repacking the weights
  // (docs/cpu-backend.md, "Start-up"). All of it at once, so a memory limit too small for the
  // arena shows at start, not once traffic fills the cache.
  kv_arena(int64_t n_layer, int64_t n_blocks, int64_t block_size, int64_t kv_dim, cpu::kv_type type = cpu::kv_type::f16,
           cpu::thread_pool* pool = nullptr);

  int64_t n_layer() const { return n_layer_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t kv_dim() const { return kv_dim_; }
  cpu::kv_type type() const { return type_; }
  // Bytes of one position's K (or V) row in one layer.
  int64_t row_bytes() const { return row_bytes_; }
  size_t bytes() const { return 2 * half_bytes_; }
  // Bytes one block takes, K and V, all layers.
  static int64_t block_bytes(int64_t n_layer, int64_t block_size, int64_t kv_dim, cpu::kv_type t) {
    return 2 * n_layer * block_size * cpu::kv_row_bytes(t, kv_dim);
  }

  void* k_block(int64_t layer, int64_t block) { return bytes_.get() + offset(layer, block); }
  void* v_block(int64_t layer, int64_t block) { return bytes_.get() + v_offset_ + offset(layer, block); }
  const void* k_block(int64_t layer, int64_t block) const { return bytes_.get() + offset(layer, block); }
  const void* v_block(int64_t layer, int64_t block) const { return bytes_.get() + v_offset_ + offset(layer, block); }

 private:
  size_t offset(int64_t layer, int64_t block) const {
    return static_cast<size_t>((layer * n_blocks_ + block) * block_size_ * row_bytes_);
  }
  int64_t n_layer_ = 0, n_blocks_ = 0, block_size_ = 0, kv_dim_ = 0;
  cpu::kv_type type_ = cpu::kv_type::f16;
  int64_t row_bytes_ = 0;
  size_t half_bytes_ = 0, v_offset_ = 0;  // K at 0, V at v_offset_ (K's bytes rounded up to a huge page)
  cpu::huge_buffer bytes_;                // huge pages: blocks are scattered
};

}  // namespace sy
