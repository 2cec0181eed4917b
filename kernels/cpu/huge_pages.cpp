#include "kernels/cpu/huge_pages.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/thread_pool.hpp"

namespace sy::cpu {

void fill_huge(uint8_t* p, size_t n, uint8_t value, thread_pool* pool) {
  const auto pages = static_cast<int64_t>(huge_round_up(n) / huge_page_bytes);
  auto fill = [&](int64_t c0, int64_t c1) {
    const size_t b = static_cast<size_t>(c0) * huge_page_bytes,
                 e = std::min(n, static_cast<size_t>(c1) * huge_page_bytes);
    std::memset(p + b, value, e - b);
  };
  if (pool != nullptr)
    pool->for_chunks(pages, 1, 1, fill);
  else
    fill(0, pages);
}

bool huge_pages_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("SY_HUGE_PAGES");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

void* huge_alloc(size_t n) {
  if (n == 0) n = 1;
  const size_t rounded = huge_round_up(n);
  void* p = std::aligned_alloc(huge_page_bytes, rounded);
  if (!p) throw std::bad_alloc();
  if (huge_pages_enabled()) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
  return p;
}

void huge_free(void* p) noexcept { std::free(p); }

}  // namespace sy::cpu
