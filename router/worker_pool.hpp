// The router's view of its workers (DESIGN.md §3, §4 step 7): who is up, what each serves,
// how loaded it is, and which prompt prefixes it has probably cached. Pure bookkeeping — no
// sockets, no clock (times are passed in) — owned by the dispatcher's thread.
//
// Liveness: a worker is `ready` after its welcome and stays so while heartbeats arrive; one
// silent for `heartbeat_timeout_s` is `dead` (its requests are the dispatcher's to rescue) until
// it says welcome again.
//
// Choice (prefix-aware, without hot spots): among ready workers of the model with a free slot
// (in flight < max_running + local_queue), if their loads differ by more than
// `balance_threshold` requests the least loaded wins; otherwise the one whose prefix index
// holds the longest run of the prompt's leading blocks wins, ties to the least loaded. The
// prefix index remembers the block hashes of prompts dispatched to a worker (LRU, bounded by
// what its KV cache can hold), so it approximates the worker's prefix cache.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/protocol.hpp"

namespace sy::router {

enum class worker_state : uint8_t { connecting, ready, dead };
std::string_view name(worker_state s);

struct worker_pool_config {
  double heartbeat_timeout_s = 2.0;
  int32_t local_queue = 2;        // requests per worker beyond its max_running
  int32_t balance_threshold = 4;  // in-flight difference that overrides prefix affinity
};

// Chained hashes of a prompt's full blocks: hash[i] covers tokens [0, (i+1) * block_size).
std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> prompt, uint32_t block_size);

struct worker_view {
  std::string endpoint;
  worker_state state = worker_state::connecting;
  proto::welcome info;  // valid once welcomed (tokenizer dropped after the first copy is taken)
  proto::heartbeat load;
  double last_seen_s = 0;  // last welcome or heartbeat
  int32_t in_flight = 0;   // requests this router has dispatched there and not seen end
  uint64_t dispatched = 0;
  uint64_t prefix_hit_blocks = 0;  // blocks of dispatched prompts found in the index
  bool retired = false;            // dropped from the worker list: no new dispatch
};

class worker_pool {
 public:
  explicit worker_pool(worker_pool_config cfg = {}) : cfg_(cfg) {}

  // Index of the worker at `endpoint`, added as `connecting` when new (un-retiring it).
  size_t add(const std::string& endpoint);
  void retire(size_t w) { workers_[w].retired = true; }
  // Returns true when this makes the worker ready (it was connecting or dead).
  bool on_welcome(size_t w, proto::welcome info, double now_s);
  void on_heartbeat(size_t w, const proto::heartbeat& hb, double now_s);
  // Workers that have just been declared dead (ready and silent too long).
  std::vector<size_t> check_liveness(double now_s);

  // Where to send a request for `model` whose prompt has these block hashes; nullopt when no
  // ready worker of that model has a free slot.
  std::optional<size_t> choose(const std::string& model, std::span<const uint64_t> block_hashes) const;
  void on_dispatched(size_t w, std::span<const uint64_t> block_hashes);
  void on_finished(size_t w);
  // The worker refused work as draining: treat it so until its next heartbeat.
  void mark_draining(size_t w) { workers_[w].load.draining = true; }

  size_t size() const { return workers_.size(); }
  const worker_view& at(size_t w) const { return workers_[w]; }
  size_t n_ready() const;
  // Leading blocks of `block_hashes` found in worker w's prefix index.
  size_t cached_blocks(size_t w, std::span<const uint64_t> block_hashes) const;

 private:
  struct prefix_index {
    std::list<uint64_t> lru;  // most recent first
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
    size_t capacity = 0;
  };
  bool has_slot(const worker_view& v) const;

  worker_pool_config cfg_;
  std::vector<worker_view> workers_;
  std::vector<prefix_index> prefixes_;  // parallel to workers_
};

}  // namespace sy::router
