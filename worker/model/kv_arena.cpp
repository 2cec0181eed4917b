#include "worker/model/kv_arena.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/thread_pool.hpp"

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
  // One huge page a take.
  const size_t total = v_offset_ + half_bytes_;
  bytes_ = cpu::make_huge_buffer(total);
  uint8_t* p = bytes_.get();
  const auto n_chunks = static_cast<int64_t>(cpu::huge_round_up(total) / cpu::huge_page_bytes);
  auto fill = [&](int64_t c0, int64_t c1) {
    const size_t b = static_cast<size_t>(c0) * cpu::huge_page_bytes,
                 e = std::min(total, static_cast<size_t>(c1) * cpu::huge_page_bytes);
    std::memset(p + b, 0, e - b);
  };
  if (pool != nullptr)
    pool->for_chunks(n_chunks, 1, 1, fill);
  else
    fill(0, n_chunks);
}

}  // namespace sy
