// One worker's prefix cache as a router sees it (docs/kv-events.md): the exact set of block
// hashes the worker holds, mirrored from its kv_events (stored / evicted, per engine step, or a
// snapshot), plus short-lived hints for blocks this router has just sent it and the worker has
// not confirmed yet. Pure bookkeeping, no clock (times are passed in); owned by the dispatcher's
// thread through worker_pool.
//
// Exactness. The view is exact from a snapshot (`reset`) on, as long as every later message
// arrives: each carries the link's next sequence number. A gap (a lost frame), events before any
// snapshot, or more blocks than the worker's KV cache has room for mark the view `stale`: it is
// still used (what it holds is mostly right) and still updated, and the router asks the worker
// for a snapshot (kv_resync) until one arrives.
//
// Hints (why keep them): between a dispatch and the step that registers the prompt's blocks —
// a prefill, tens to hundreds of ms — the worker has not said anything yet, and without the hint
// a second request with the same prefix arriving at *this* router in that window would go
// anywhere. A hint lives `hint_ttl_s` (longer than a prefill), or until an event about its hash
// replaces it; for a worker that sends no events (an older build) hints are all there is and
// live until pushed out of their LRU (bounded by twice the worker's block count).
//
// Memory: at most the worker's block count of hashes, plus the hints' bound.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "common/wire/protocol.hpp"

namespace sy::router {

// Counts over every worker's view (monotonic), for /metrics.
struct kv_view_counters {
  uint64_t stored = 0;     // hashes applied as stored (snapshots included)
  uint64_t evicted = 0;    // hashes applied as evicted
  uint64_t snapshots = 0;  // reset messages applied
  uint64_t gaps = 0;       // sequence gaps (lost messages, also seen from heartbeats) and events before any snapshot
  uint64_t ignored = 0;    // messages about another model, or from a worker that never welcomed us
  uint64_t overflows = 0;  // stores beyond the worker's block count (refused: the view goes stale)
};

class kv_view {
 public:
  // Whatever a welcome claims (64 Mi tokens of 16-token blocks): the most one view holds.
  static constexpr size_t k_max_view_blocks = size_t{1} << 22;

  enum class outcome : uint8_t { applied, snapshot, gap };

  // The worker's KV block count (at most k_max_view_blocks): the view never holds more.
  void set_capacity(size_t blocks);
  outcome apply(const proto::kv_events& m, kv_view_counters& c);
  // A heartbeat's kv_seq (the last seq the worker sent on this link, 0: none): a later one than
  // applied means the last messages were lost (nothing after them would show the gap).
  void check_last_seq(uint64_t kv_seq, kv_view_counters& c);
  // Forget everything (the worker restarted): stale until its next snapshot.
  void clear();

  // Records that a prompt with these block hashes was sent to the worker at `now_s`.
  void hint(std::span<const uint64_t> hashes, double now_s);
  // Drops hints older than `ttl_s`.
  void expire_hints(double now_s, double ttl_s);

  // Leading blocks of `hashes` the worker holds (or was just sent).
  size_t leading(std::span<const uint64_t> hashes) const;
  bool holds(uint64_t hash) const { return cached_.count(hash) != 0; }
  size_t size() const { return cached_.size(); }
  size_t n_hints() const { return hints_.size(); }
  // Exact: a snapshot arrived and nothing was missed since.
  bool exact() const { return synced_ && !stale_; }
  // A snapshot is needed (stale after a gap, an overflow, or events before any snapshot).
  bool wants_snapshot() const { return stale_; }

 private:
  void unhint(uint64_t hash);

  std::unordered_set<uint64_t> cached_;
  size_t capacity_ = 0;
  bool synced_ = false;  // a snapshot arrived since the last clear
  bool stale_ = false;
  uint64_t next_seq_ = 0;
  // Hints, most recent first, with the time each was last sent.
  std::list<std::pair<uint64_t, double>> hints_;
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, double>>::iterator> hint_at_;
};

}  // namespace sy::router
