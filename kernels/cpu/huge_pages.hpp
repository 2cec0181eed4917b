// An allocator for the large, long-lived buffers (KV arena, repacked weights) that asks the
// kernel for transparent huge pages (madvise(MADV_HUGEPAGE); Debian's default THP mode is
// "madvise", so nothing is huge unless asked). Attention walks KV blocks scattered over
// hundreds of MiB and the kernels stream every weight each step: with 4 KiB pages that is a TLB
// miss every few cache lines. Buffers are 2 MiB-aligned and rounded up to 2 MiB. A server that
// must be ready soon defers the advice and promotes the buffers once it is (below).
// SY_HUGE_PAGES=0 in the environment turns the advice off (for comparisons).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace sy::cpu {

class thread_pool;

// The transparent huge page size: huge_alloc's alignment and rounding.
constexpr size_t huge_page_bytes = size_t{2} << 20;
constexpr size_t huge_round_up(size_t n) { return (n + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes; }

// False when SY_HUGE_PAGES=0: no advice, and the weights stay in the model's memory map.
bool huge_pages_enabled();
// Allocates n bytes (2 MiB-aligned, zero-filled by the kernel on first touch) with huge-page advice,
// or, once defer_huge_pages() was called, on 4 KiB pages until promote_huge_pages() moves them.
void* huge_alloc(size_t n);
void huge_free(void* p) noexcept;

// Deferred promotion (docs/cpu-backend.md, "Start-up"). A fresh huge page can cost ten times what
// 512 small ones do to touch the first time (on VMs that return free memory to their host), so a
// process that must be ready soon allocates on small pages first: after defer_huge_pages(), every
// huge_alloc buffer starts on 4 KiB pages until the promotion advises it and collapses it 2 MiB at
// a time (MADV_COLLAPSE; where the kernel lacks it, the advice alone leaves it to khugepaged),
// never changing its contents. Buffers freed meanwhile are skipped. The first promotion step
// ends the deferral: what is allocated after it is advised at once.
void defer_huge_pages();
struct huge_promotion {
  size_t bytes = 0;      // collapsed onto huge pages
  size_t refused = 0;    // the kernel had no huge page to give: left on small pages
  bool advised = false;  // the kernel refused MADV_COLLAPSE as unknown: only the advice was given
};
// One step: the next 2 MiB of the first deferred buffer, counted into `r`. False when none is left.
// A caller can pause between steps (the worker does while it has requests) or stop for good.
bool promote_huge_page_step(huge_promotion& r);
// Bytes of deferred buffers not yet stepped over (0 when nothing waits for a promotion).
size_t deferred_huge_page_bytes();
// Every step until none is left or `stop` is set.
huge_promotion promote_huge_pages(const std::atomic<bool>* stop = nullptr);

// An owned huge_alloc buffer whose bytes are left as they come (no value-initialisation: the
// owner fills what it needs, e.g. over its thread pool).
struct huge_free_deleter {
  void operator()(uint8_t* p) const noexcept { huge_free(p); }
};
using huge_buffer = std::unique_ptr<uint8_t[], huge_free_deleter>;
inline huge_buffer make_huge_buffer(size_t n) { return huge_buffer(static_cast<uint8_t*>(huge_alloc(n))); }
// Sets n bytes at p to `value` a huge page at a time, spread over `pool` when given (the kernel
// zeroes each fresh page as it is first touched: over the pool, the thread whose pages come
// slower takes fewer of them).
void fill_huge(uint8_t* p, size_t n, uint8_t value, thread_pool* pool);

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
