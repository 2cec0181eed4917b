// The router's view of its workers (DESIGN.md §3, §4 step 7): who is up, what each serves,
// how loaded it is, and which prompt prefixes it has probably cached. Pure bookkeeping — no
// sockets, no clock (times are passed in) — owned by the dispatcher's thread.
//
// Lifecycle. Each worker is in exactly one `worker_state` (the router's
// `switchyard_router_workers{state}` gauge counts them so):
//   connecting  listed (static list, DNS answer, workers file), greeted, no welcome yet;
//   ready       welcomed, heartbeats arriving, takes new requests;
//   draining    welcomed and alive, but refusing new work (its heartbeat says so, or it refused
//               a submit as overloaded) — until a heartbeat says otherwise;
//   retired     no longer listed: no new requests, finishing what it runs;
//   dead        silent for `heartbeat_timeout_s` (its requests are the dispatcher's to rescue),
//               until it says welcome again.
// A worker leaves the pool (`removable`, then `remove`) when it is unlisted and nothing this
// router sent it is still running — a retired worker once drained, an unlisted connecting or
// dead one at once — or when it has been dead for `dead_grace_s` (the dispatcher then lists it
// afresh under a new ref if it is still listed, so a worker that restarts there rejoins).
// Every change — joined, each state change, removed — is recorded once for the dispatcher to
// log (`take_changes`).
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
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/protocol.hpp"
#include "router/worker_ref.hpp"

namespace sy::router {

enum class worker_state : uint8_t { connecting, ready, draining, retired, dead };
inline constexpr worker_state k_worker_states[] = {worker_state::connecting, worker_state::ready,
                                                   worker_state::draining, worker_state::retired, worker_state::dead};
std::string_view name(worker_state s);

struct worker_pool_config {
  double heartbeat_timeout_s = 2.0;
  double dead_grace_s = 4.0;      // dead this long: removed (the router uses 2 x the heartbeat timeout)
  int32_t local_queue = 2;        // requests per worker beyond its max_running
  int32_t balance_threshold = 4;  // in-flight difference that overrides prefix affinity
};

// Chained hashes of a prompt's full blocks: hash[i] covers tokens [0, (i+1) * block_size).
std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> prompt, uint32_t block_size);

// Whether the worker's process answers, as heartbeats tell (one input of worker_state).
enum class worker_liveness : uint8_t { connecting, up, dead };

struct worker_view {
  worker_ref ref = 0;
  std::string endpoint;
  worker_state state = worker_state::connecting;  // from liveness, listed, load.draining; kept current
  worker_liveness liveness = worker_liveness::connecting;
  bool listed = true;      // named by the worker list or the latest discovery answer
  proto::heartbeat load;   // load.draining: the worker refuses new work
  proto::welcome info;     // valid once welcomed (tokenizer dropped after the first copy is taken)
  double last_seen_s = 0;  // last welcome or heartbeat
  double dead_since_s = 0;
  int32_t in_flight = 0;  // choices this router has dispatched there and not seen end
  uint64_t dispatched = 0;
  uint64_t prefix_hit_blocks = 0;  // blocks of dispatched prompts found in the index
};

// One line of a worker's history: joined (no `from`), a state change, or removed (no `to`).
struct worker_change {
  worker_ref ref = 0;
  std::string endpoint;
  std::optional<worker_state> from, to;
};

class worker_pool {
 public:
  explicit worker_pool(worker_pool_config cfg = {}) : cfg_(cfg) {}

  struct added {
    worker_ref ref = 0;
    bool joined = false;  // a new entry (connect to it); else the endpoint was known (and is listed again)
  };
  // Lists `endpoint`: a new entry in `connecting` under a new ref, or the known one listed again.
  added add(const std::string& endpoint);
  // No longer listed: no new requests; removable once nothing runs there. False when unknown.
  bool retire(const std::string& endpoint);
  // Returns true when this makes the worker up (it was connecting or dead).
  bool on_welcome(worker_ref w, proto::welcome info, double now_s);
  void on_heartbeat(worker_ref w, const proto::heartbeat& hb, double now_s);
  // Workers that have just been declared dead (up and silent too long).
  std::vector<worker_ref> check_liveness(double now_s);
  // Workers to take out now: unlisted with nothing in flight, or dead for dead_grace_s.
  std::vector<worker_ref> removable(double now_s) const;
  void remove(worker_ref w);

  // Where to send a request for `model` whose prompt has these block hashes; nullopt when no
  // ready worker of that model has a free slot.
  std::optional<worker_ref> choose(const std::string& model, std::span<const uint64_t> block_hashes) const;
  void on_dispatched(worker_ref w, std::span<const uint64_t> block_hashes);
  void on_finished(worker_ref w);
  // The worker refused work as draining: treat it so until its next heartbeat.
  void mark_draining(worker_ref w);

  size_t size() const { return workers_.size(); }
  const worker_view* find(worker_ref w) const;
  const worker_view& at(worker_ref w) const;                                 // w must be in the pool
  const std::map<worker_ref, worker_view>& all() const { return workers_; }  // by ref: join order
  size_t n_ready() const { return count(worker_state::ready); }
  size_t count(worker_state s) const;
  // Leading blocks of `block_hashes` found in worker w's prefix index.
  size_t cached_blocks(worker_ref w, std::span<const uint64_t> block_hashes) const;
  // Joins, state changes and removals since the last call, in order.
  std::vector<worker_change> take_changes();

 private:
  struct prefix_index {
    std::list<uint64_t> lru;  // most recent first
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
    size_t capacity = 0;
  };
  bool has_slot(const worker_view& v) const;
  worker_view& get(worker_ref w);
  void update_state(worker_view& v);  // recomputes v.state from its inputs, recording a change

  worker_pool_config cfg_;
  std::map<worker_ref, worker_view> workers_;
  std::map<worker_ref, prefix_index> prefixes_;  // same keys as workers_
  worker_ref next_ref_ = 0;
  std::vector<worker_change> changes_;
};

}  // namespace sy::router
