// The router's view of its workers (docs/architecture.md, "The router-worker link" and the
// dispatch step of "The path of a request"): who is up, what each serves, how loaded it is, and
// which prompt prefixes it has probably cached. Pure bookkeeping — no sockets, no clock (times
// are passed in) — owned by the dispatcher's thread.
//
// Lifecycle. Each worker is in exactly one `worker_state` (the router's
// `switchyard_router_workers{state}` gauge counts them so):
//   connecting  listed (static list, DNS answer, workers file), greeted, no welcome yet;
//   ready       welcomed, heartbeats arriving, takes new requests;
//   draining    welcomed and alive, but refusing new work (its heartbeat says so, or it refused
//               a submit as overloaded) — until a heartbeat says otherwise;
//   ejected     alive but failing: it ended `eject_after_failures` requests in a row with a
//               worker error (a "black hole": heartbeats fine, every step throwing). No new
//               requests until its ejection time is up (outlier detection, as Envoy's
//               consecutive-5xx): then ready again, on probation — a success clears its record,
//               another run of failures ejects it for longer (base x times ejected in a row).
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
// (in flight < max_running + local_queue) — less those whose last heartbeat gives fewer free KV
// blocks in their binding pool (the smaller of the main and the sliding-window pool's) than the
// prompt's blocks + 1, while some other such worker has them — if their loads differ by more than
// `balance_threshold` requests the least loaded wins; otherwise the one whose prefix index
// holds the longest run of the prompt's leading blocks wins, ties to the least loaded. Workers
// still tied are taken in turn (the first after the last one dispatched to, in ref order), so
// requests that trickle in spread over idle workers instead of all landing on the first. That
// view (router/fleet/kv_view.hpp) is the exact set of block hashes the worker holds, mirrored from
// its kv_events, plus short-lived hints for prompts just sent there; every router replica keeps
// the same exact view, so affinity holds whichever replica a request reaches.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/wire/protocol.hpp"
#include "router/fleet/kv_view.hpp"
#include "router/fleet/worker_ref.hpp"

namespace sy::router {

enum class worker_state : uint8_t { connecting, ready, draining, retired, dead, ejected };
inline constexpr worker_state k_worker_states[] = {worker_state::connecting, worker_state::ready,
                                                   worker_state::draining,   worker_state::retired,
                                                   worker_state::dead,       worker_state::ejected};
std::string_view name(worker_state s);

struct worker_pool_config {
  double heartbeat_timeout_s = 2.0;
  double dead_grace_s = 4.0;      // dead this long: removed (the router uses 2 x the heartbeat timeout)
  int32_t local_queue = 2;        // requests per worker beyond its max_running
  int32_t balance_threshold = 4;  // in-flight difference that overrides prefix affinity
  // Outlier ejection (see `ejected` above). Never takes out more than max_ejected_percent of a
  // model's live workers (rounded down: never a model's only worker, whose failures then reach
  // the clients as fast errors rather than as a queue that waits for nothing).
  int32_t eject_after_failures = 5;  // consecutive worker errors; 0: never eject
  double eject_base_s = 30.0;        // first ejection; x2, x3, ... while it keeps failing
  double eject_max_s = 300.0;
  int32_t max_ejected_percent = 50;
  double kv_hint_ttl_s = 2.0;         // a dispatch-time hint not confirmed by the worker's events by then goes
  double kv_resync_interval_s = 1.0;  // between kv_resync requests to a worker whose view is stale
};

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
  // Outlier ejection (this router's view; a restarted process starts with a clean record).
  int32_t consecutive_failures = 0;  // requests it ended with a worker error since its last success
  uint32_t ejections_in_a_row = 0;   // ejections since its last success: the next one lasts longer
  double ejected_until_s = 0;        // > 0: ejected until then
  uint64_t last_failure = 0;         // the last failed step it reported (proto::error::failure)
  uint64_t ejections = 0;            // times ejected, ever
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
  // This router could not listen for `stalled_s` (its own loop stalled: a SIGSTOP, CPU throttling,
  // a VM pause): that time is not the workers' silence. Each up worker's last_seen_s moves forward
  // by it (never past now_s), so a worker is judged on the time this router was awake to hear it.
  void forgive_silence(double stalled_s, double now_s);
  // Whether some worker of `model` takes new requests now or will again by itself (ready, or
  // ejected for a while); draining, retired, connecting and dead ones do not count.
  bool serves(const std::string& model) const;
  // Workers to take out now: unlisted with nothing in flight, or dead for dead_grace_s.
  std::vector<worker_ref> removable(double now_s) const;
  void remove(worker_ref w);

  // Where to send a request for `model` whose prompt has these block hashes; nullopt when no
  // ready worker of that model has a free slot.
  // `avoid` (a retry: the worker that failed it) is passed over while the model has another ready
  // worker, busy or not.
  std::optional<worker_ref> choose(const std::string& model, std::span<const uint64_t> block_hashes,
                                   std::optional<worker_ref> avoid = std::nullopt) const;
  void on_dispatched(worker_ref w, std::span<const uint64_t> block_hashes, double now_s);
  // A worker's kv_events: applied to its view (ignored from a worker that is not up, or about
  // another model than it serves).
  void on_kv_events(worker_ref w, const proto::kv_events& m);
  // Workers whose view is stale and that were not asked for a snapshot in the last
  // kv_resync_interval_s (now marked asked): send each a kv_resync.
  std::vector<worker_ref> kv_resyncs_due(double now_s);
  // Drops dispatch-time hints older than kv_hint_ttl_s (of workers that send kv_events).
  void expire_kv_hints(double now_s);
  const kv_view* kv_view_of(worker_ref w) const;
  const kv_view_counters& kv_counters() const { return kv_counters_; }
  uint64_t kv_resyncs() const { return kv_resyncs_; }
  void on_finished(worker_ref w);
  // The worker refused work as draining: treat it so until its next heartbeat.
  void mark_draining(worker_ref w);
  // A request the worker ended with a worker error (its step failed, say): true when this
  // ejects it. A request that completed: its failure record is cleared.
  bool on_request_failed(worker_ref w, double now_s);
  // Whether an error numbered `failure` (proto::error::failure) reports a failure of the worker
  // not seen before: true for 0 (the request's own) and for the first error of each failed step.
  bool new_failure(worker_ref w, uint64_t failure);
  void on_request_succeeded(worker_ref w);
  // Ejected workers whose time is up are ready again; returns them.
  std::vector<worker_ref> readmit(double now_s);
  uint64_t ejections_total() const { return ejections_total_; }

  size_t size() const { return workers_.size(); }
  const worker_view* find(worker_ref w) const;
  const worker_view& at(worker_ref w) const;                                 // w must be in the pool
  const std::map<worker_ref, worker_view>& all() const { return workers_; }  // by ref: join order
  size_t n_ready() const { return count(worker_state::ready); }
  // Some worker is ready and, as of now_s, not silent past the heartbeat timeout (between the
  // check_liveness calls that would declare it dead).
  bool any_ready(double now_s) const;
  size_t count(worker_state s) const;
  // Leading blocks of `block_hashes` found in worker w's view of its prefix cache.
  size_t cached_blocks(worker_ref w, std::span<const uint64_t> block_hashes) const;
  // Joins, state changes and removals since the last call, in order.
  std::vector<worker_change> take_changes();

 private:
  bool has_slot(const worker_view& v) const;
  bool turn_before(worker_ref a, worker_ref b) const;  // a's turn comes before b's (ties in choose)
  bool silent(const worker_view& v, double now_s) const { return now_s - v.last_seen_s > cfg_.heartbeat_timeout_s; }
  worker_view& get(worker_ref w);
  void update_state(worker_view& v);  // recomputes v.state from its inputs, recording a change

  worker_pool_config cfg_;
  std::map<worker_ref, worker_view> workers_;
  struct kv_state {
    kv_view view;
    double resync_asked_s = -1e9;
  };
  std::map<worker_ref, kv_state> views_;  // same keys as workers_
  kv_view_counters kv_counters_;
  uint64_t kv_resyncs_ = 0;
  worker_ref next_ref_ = 0;
  worker_ref last_dispatched_ = ~worker_ref{0};  // none yet: the first tie goes to the lowest ref
  std::vector<worker_change> changes_;
  uint64_t ejections_total_ = 0;
};

// The prefix views' metrics (switchyard_router_kv_*), appended to `out` in Prometheus text.
void render_kv_metrics(const worker_pool& pool, std::string& out);
// Each worker's KV blocks as its last heartbeat gives them (switchyard_router_worker_kv_*): free
// and total per pool ("main"; "window" where it has one) and the binding pool's free blocks the
// choice goes by; appended to `out` in Prometheus text.
void render_worker_kv_metrics(const worker_pool& pool, std::string& out);

}  // namespace sy::router
