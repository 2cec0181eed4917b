#include "worker/model/kv_arena.hpp"

namespace sy {

kv_arena::kv_arena(int64_t n_layer, int64_t n_blocks, int64_t block_size, int64_t kv_dim, cpu::kv_type type,
                   cpu::thread_pool* pool)
    : n_layer_(n_layer),
      n_blocks_(n_blocks),
      block_size_(block_size),
      kv_dim_(kv_dim),
      type_(type),
      row_bytes_(cpu::kv_row_bytes(type, kv_dim)),
      half_bytes_(static_cast<size_t>(n_layer * n_blocks * block_size * row_bytes_)),
      v_offset_(cpu::huge_round_up(half_bytes_)) {
  if (half_bytes_ == 0) return;
  const size_t total = v_offset_ + half_bytes_;
  bytes_ = cpu::make_huge_buffer(total);
  cpu::fill_huge(bytes_.get(), total, 0, pool);
}

}  // namespace sy
