#include "kernels/cpu/huge_pages.hpp"

#include <sys/mman.h>

#include <cstring>

namespace sy::cpu {
namespace {

constexpr size_t k_huge = size_t{2} << 20;

}  // namespace

bool huge_pages_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("SY_HUGE_PAGES");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

void* huge_alloc(size_t n) {
  if (n == 0) n = 1;
  const size_t rounded = (n + k_huge - 1) / k_huge * k_huge;
  void* p = std::aligned_alloc(k_huge, rounded);
  if (!p) throw std::bad_alloc();
  if (huge_pages_enabled()) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
  return p;
}

void huge_free(void* p) noexcept { std::free(p); }

}  // namespace sy::cpu
