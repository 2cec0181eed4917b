#include "kernels/cpu/huge_pages.hpp"

#include <sys/mman.h>

#include <cstring>

namespace sy::cpu {

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
