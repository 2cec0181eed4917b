#include "router/fleet/kv_view.hpp"

#include <algorithm>

namespace sy::router {

void kv_view::set_capacity(size_t blocks) { capacity_ = std::min(blocks, k_max_view_blocks); }

void kv_view::clear() {
  cached_.clear();
  hints_.clear();
  hint_at_.clear();
  synced_ = false;
  stale_ = false;
  next_seq_ = 0;
}

kv_view::outcome kv_view::apply(const proto::kv_events& m, kv_view_counters& c) {
  outcome o = outcome::applied;
  if (m.reset) {
    cached_.clear();
    synced_ = true;
    stale_ = false;
    o = outcome::snapshot;
    c.snapshots++;
  } else if (!synced_ || m.seq != next_seq_) {
    // Facts are still facts: applied, but something before them is missing.
    stale_ = true;
    o = outcome::gap;
    c.gaps++;
  }
  next_seq_ = m.seq + 1;
  for (const uint64_t h : m.evicted) {
    c.evicted += cached_.erase(h);
    unhint(h);
  }
  for (const uint64_t h : m.stored) {
    unhint(h);
    if (cached_.count(h)) continue;
    if (cached_.size() >= capacity_) {
      // More than the worker can hold: something was missed (or the worker is broken).
      stale_ = true;
      c.overflows++;
      break;
    }
    cached_.insert(h);
    c.stored++;
  }
  return o;
}

void kv_view::check_last_seq(uint64_t kv_seq, kv_view_counters& c) {
  if (kv_seq == 0 || stale_) return;
  if (!synced_ || kv_seq >= next_seq_) {  // frames are in order: everything up to kv_seq came before
    stale_ = true;
    c.gaps++;
  }
}

void kv_view::unhint(uint64_t hash) {
  auto it = hint_at_.find(hash);
  if (it == hint_at_.end()) return;
  hints_.erase(it->second);
  hint_at_.erase(it);
}

void kv_view::hint(std::span<const uint64_t> hashes, double now_s) {
  for (const uint64_t h : hashes) {
    if (cached_.count(h)) continue;  // confirmed already
    if (auto it = hint_at_.find(h); it != hint_at_.end()) {
      hints_.splice(hints_.begin(), hints_, it->second);
      it->second->second = now_s;
    } else {
      hints_.emplace_front(h, now_s);
      hint_at_.emplace(h, hints_.begin());
    }
  }
  const size_t bound = std::max<size_t>(64, 2 * capacity_);
  while (hints_.size() > bound) {
    hint_at_.erase(hints_.back().first);
    hints_.pop_back();
  }
}

void kv_view::expire_hints(double now_s, double ttl_s) {
  while (!hints_.empty() && now_s - hints_.back().second > ttl_s) {
    hint_at_.erase(hints_.back().first);
    hints_.pop_back();
  }
}

size_t kv_view::leading(std::span<const uint64_t> hashes) const {
  size_t n = 0;
  while (n < hashes.size() && (cached_.count(hashes[n]) || hint_at_.count(hashes[n]))) ++n;
  return n;
}

}  // namespace sy::router
