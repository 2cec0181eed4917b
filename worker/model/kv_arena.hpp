// Storage for the KV cache: n_blocks blocks of block_size positions, for every layer, K and V.
// Which block belongs to which sequence is the block pool's business (bookkeeping only); this
// class only owns the bytes. Layout: k_[layer][block][...], each block in cpu::kv_layout::heads
// (attention.hpp: per kv head a contiguous slice, keys dimension-major); a position's K or V
// over all heads is kv_dim elements of `type`, cpu::kv_row_bytes(type, kv_dim) bytes (f16 by
// default: half the memory of f32, so twice the sequences per byte; q8_0 takes 34 bytes per 32
// elements, ~1.9x f16's sequences, and needs kv_dim % 32 == 0).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/huge_pages.hpp"

namespace sy {

class kv_arena {
 public:
  kv_arena() = default;
  kv_arena(int64_t n_layer, int64_t n_blocks, int64_t block_size, int64_t kv_dim, cpu::kv_type type = cpu::kv_type::f16)
      : n_layer_(n_layer),
        n_blocks_(n_blocks),
        block_size_(block_size),
        kv_dim_(kv_dim),
        type_(type),
        row_bytes_(cpu::kv_row_bytes(type, kv_dim)),
        k_(static_cast<size_t>(n_layer * n_blocks * block_size * row_bytes_)),
        v_(k_.size()) {}

  int64_t n_layer() const { return n_layer_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t kv_dim() const { return kv_dim_; }
  cpu::kv_type type() const { return type_; }
  // Bytes of one position's K (or V) row in one layer.
  int64_t row_bytes() const { return row_bytes_; }
  size_t bytes() const { return k_.size() + v_.size(); }
  // Bytes one block takes, K and V, all layers.
  static int64_t block_bytes(int64_t n_layer, int64_t block_size, int64_t kv_dim, cpu::kv_type t) {
    return 2 * n_layer * block_size * cpu::kv_row_bytes(t, kv_dim);
  }

  void* k_block(int64_t layer, int64_t block) { return k_.data() + offset(layer, block); }
  void* v_block(int64_t layer, int64_t block) { return v_.data() + offset(layer, block); }
  const void* k_block(int64_t layer, int64_t block) const { return k_.data() + offset(layer, block); }
  const void* v_block(int64_t layer, int64_t block) const { return v_.data() + offset(layer, block); }

 private:
  size_t offset(int64_t layer, int64_t block) const {
    return static_cast<size_t>((layer * n_blocks_ + block) * block_size_ * row_bytes_);
  }
  int64_t n_layer_ = 0, n_blocks_ = 0, block_size_ = 0, kv_dim_ = 0;
  cpu::kv_type type_ = cpu::kv_type::f16;
  int64_t row_bytes_ = 0;
  std::vector<uint8_t, cpu::huge_page_allocator<uint8_t>> k_, v_;  // huge pages: blocks are scattered
};

}  // namespace sy
