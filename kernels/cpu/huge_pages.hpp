// An allocator for the large, long-lived buffers (KV arena, repacked weights) that asks the
// kernel for transparent huge pages (madvise(MADV_HUGEPAGE); Debian's default THP mode is
// "madvise", so nothing is huge unless asked). Attention walks KV blocks scattered over
// hundreds of MiB and the kernels stream every weight each step: with 4 KiB pages that is a TLB
// miss every few cache lines. Buffers are 2 MiB-aligned and rounded up to 2 MiB.
// SY_HUGE_PAGES=0 in the environment turns the advice off (for comparisons).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace sy::cpu {

// False when SY_HUGE_PAGES=0: no advice, and the weights stay in the model's memory map.
bool huge_pages_enabled();
// Allocates n bytes (2 MiB-aligned, zero-filled by the kernel on first touch) with huge-page advice.
void* huge_alloc(size_t n);
void huge_free(void* p) noexcept;

template <class T>
struct huge_page_allocator {
  using value_type = T;
  huge_page_allocator() = default;
  template <class U>
  huge_page_allocator(const huge_page_allocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(huge_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t) noexcept { huge_free(p); }
  template <class U>
  bool operator==(const huge_page_allocator<U>&) const {
    return true;
  }
};

}  // namespace sy::cpu
