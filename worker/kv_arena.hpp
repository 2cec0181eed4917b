// Storage for the KV cache: n_blocks blocks of block_size positions, for every layer, K and V.
// Which block belongs to which sequence is the block pool's business (bookkeeping only); this
// class only owns the floats. Layout: k_[layer][block][position in block][kv_dim].
#pragma once

#include <cstdint>
#include <vector>

namespace sy {

class kv_arena {
 public:
  kv_arena() = default;
  kv_arena(int64_t n_layer, int64_t n_blocks, int64_t block_size, int64_t kv_dim)
      : n_layer_(n_layer), n_blocks_(n_blocks), block_size_(block_size), kv_dim_(kv_dim),
        k_(static_cast<size_t>(n_layer * n_blocks * block_size * kv_dim)),
        v_(k_.size()) {}

  int64_t n_layer() const { return n_layer_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t kv_dim() const { return kv_dim_; }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

  float* k_block(int64_t layer, int64_t block) { return k_.data() + offset(layer, block); }
  float* v_block(int64_t layer, int64_t block) { return v_.data() + offset(layer, block); }
  const float* k_block(int64_t layer, int64_t block) const { return k_.data() + offset(layer, block); }
  const float* v_block(int64_t layer, int64_t block) const { return v_.data() + offset(layer, block); }

 private:
  size_t offset(int64_t layer, int64_t block) const {
    return static_cast<size_t>((layer * n_blocks_ + block) * block_size_ * kv_dim_);
  }
  int64_t n_layer_ = 0, n_blocks_ = 0, block_size_ = 0, kv_dim_ = 0;
  std::vector<float> k_, v_;
};

}  // namespace sy
