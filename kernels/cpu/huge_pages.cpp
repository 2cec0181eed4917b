#include "kernels/cpu/huge_pages.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

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

// The buffers allocated while deferred and not yet promoted (start -> bytes).
struct deferred_registry {
  std::mutex mu;
  std::map<uintptr_t, size_t> pending;  // guarded by mu
  bool on = false;                      // guarded by mu: huge_alloc defers
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
    d.pending.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}

huge_promotion promote_huge_pages(const std::atomic<bool>* stop) {
  huge_promotion r;
  auto& d = deferred();
  std::vector<std::pair<uintptr_t, size_t>> todo;
  {
    std::lock_guard lock(d.mu);
    d.on = false;  // what is allocated from now on is advised at once
    todo.assign(d.pending.begin(), d.pending.end());
  }
  bool collapse = true;  // until the kernel says it has no MADV_COLLAPSE
  for (const auto& [start, bytes] : todo) {
    for (size_t off = 0; off < bytes; off += huge_page_bytes) {
      // Under the lock, so the buffer cannot be freed (and its range reused) mid-step.
      std::lock_guard lock(d.mu);
      const auto it = d.pending.find(start);
      if (it == d.pending.end()) break;  // freed meanwhile
      if (off == 0) madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);
      if ((stop != nullptr && stop->load()) || !collapse) {
        r.left += bytes - off;
        break;
      }
      if (madvise(reinterpret_cast<void*>(start + off), huge_page_bytes, MADV_COLLAPSE) == 0) {
        r.bytes += huge_page_bytes;
      } else if (errno == EINVAL) {
        collapse = false;  // an older kernel: the advice stands, khugepaged collapses in its time
        r.advised = true;
        r.left += bytes - off;
        break;
      } else {
        r.left += huge_page_bytes;  // no huge page to be had now (EAGAIN, ENOMEM): stays small
      }
    }
    std::lock_guard lock(d.mu);
    d.pending.erase(start);
  }
  return r;
}

}  // namespace sy::cpu
