#include "kernels/cpu/huge_pages.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

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

namespace {

#ifndef MADV_COLLAPSE
constexpr int MADV_COLLAPSE = 25;  // Linux 6.1 and later; older C library headers lack the name
#endif

// The buffers allocated while deferred and not yet promoted (start -> bytes), and how far the
// promotion has gone into the one it is in.
struct deferred_registry {
  std::mutex mu;
  std::map<uintptr_t, size_t> pending;  // guarded by mu
  uintptr_t current = 0;                // guarded by mu: the buffer being stepped through (0: none)
  size_t done = 0;                      // guarded by mu: its bytes already stepped over
  bool on = false;                      // guarded by mu: huge_alloc defers
  bool no_collapse = false;             // guarded by mu: the kernel refused MADV_COLLAPSE as unknown
};
deferred_registry& deferred() {
  static auto* r = new deferred_registry;  // never destroyed: buffers may be freed during exit
  return *r;
}

}  // namespace

void defer_huge_pages() {
  std::lock_guard lock(deferred().mu);
  deferred().on = true;
}

void* huge_alloc(size_t n) {
  if (n == 0) n = 1;
  const size_t rounded = huge_round_up(n);
  void* p = std::aligned_alloc(huge_page_bytes, rounded);
  if (!p) throw std::bad_alloc();
  if (!huge_pages_enabled()) return p;
  {
    auto& d = deferred();
    std::lock_guard lock(d.mu);
    if (d.on) {
      d.pending[reinterpret_cast<uintptr_t>(p)] = rounded;
      return p;
    }
  }
  madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
  return p;
}

void huge_free(void* p) noexcept {
  if (p != nullptr) {
    auto& d = deferred();
    std::lock_guard lock(d.mu);
    if (d.pending.erase(reinterpret_cast<uintptr_t>(p)) > 0 && d.current == reinterpret_cast<uintptr_t>(p))
      d.current = d.done = 0;
  }
  std::free(p);
}

bool promote_huge_page_step(huge_promotion& r) {
  auto& d = deferred();
  uint8_t* start = nullptr;
  size_t bytes = 0, done = 0;
  bool collapse = false;
  {
    std::lock_guard lock(d.mu);
    d.on = false;  // what is allocated from now on is advised at once
    if (d.pending.empty()) return false;
    auto it = d.pending.find(d.current);
    if (it == d.pending.end()) {
      it = d.pending.begin();
      d.current = it->first;
      d.done = 0;
    }
    start = reinterpret_cast<uint8_t*>(it->first);
    bytes = it->second;
    done = d.done;
    collapse = !d.no_collapse;
  }
  // The system calls without the lock, which huge_alloc, huge_free and the gauge take: a collapse
  // can take milliseconds. A buffer freed meanwhile only makes them fail or apply to memory that
  // was reallocated, whose contents neither changes.
  if (done == 0) madvise(start, bytes, MADV_HUGEPAGE);
  if (collapse) {
    if (madvise(start + done, huge_page_bytes, MADV_COLLAPSE) == 0)
      r.bytes += huge_page_bytes;
    else if (errno == EINVAL)
      collapse = false;  // a kernel before 6.1, or huge pages turned off for the process
    else
      r.refused += huge_page_bytes;  // no huge page to be had now (EAGAIN, ENOMEM): stays small
  }
  std::lock_guard lock(d.mu);
  if (!collapse) d.no_collapse = r.advised = true;  // the advice stands: khugepaged collapses in its time
  const auto it = d.pending.find(reinterpret_cast<uintptr_t>(start));
  if (it == d.pending.end() || d.current != it->first || d.done != done) return true;  // freed meanwhile
  d.done += collapse ? huge_page_bytes : bytes - done;
  if (d.done >= bytes) {
    d.pending.erase(it);
    d.current = d.done = 0;
  }
  return true;
}

size_t deferred_huge_page_bytes() {
  auto& d = deferred();
  std::lock_guard lock(d.mu);
  size_t n = 0;
  for (const auto& [start, bytes] : d.pending) n += bytes;
  return n - (d.pending.count(d.current) > 0 ? d.done : 0);
}

huge_promotion promote_huge_pages(const std::atomic<bool>* stop) {
  huge_promotion r;
  while ((stop == nullptr || !stop->load()) && promote_huge_page_step(r)) {
  }
  return r;
}

}  // namespace sy::cpu
