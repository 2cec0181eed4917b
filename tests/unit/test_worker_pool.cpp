// The router's worker bookkeeping: liveness from heartbeats, the lifecycle (states, retirement,
// removal), slots, prefix-aware choice that still balances load.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "common/kv_hash.hpp"
#include "router/fleet/worker_pool.hpp"

using namespace sy::router;

namespace {

sy::proto::welcome welcome_of(const std::string& id, uint32_t max_running = 2, const std::string& model = "m") {
  sy::proto::welcome w;
  w.worker_id = id;
  w.model_id = model;
  w.context_length = 2048;
  w.kv_capacity_tokens = 16 * 64;
  w.kv_block_size = 16;
  w.max_running = max_running;
  return w;
}

std::vector<uint64_t> prefix_block_hashes(const std::vector<int32_t>& prompt, uint32_t block_size) {
  return sy::kv_block_hashes(prompt, block_size, 0);
}

std::vector<int32_t> prompt_of(int32_t first, size_t n) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = first + static_cast<int32_t>(i);
  return p;
}

}  // namespace

TEST_CASE("worker_pool: block hashes are chained and cover only full blocks") {
  const auto a = prefix_block_hashes(prompt_of(0, 40), 16);
  REQUIRE(a.size() == 2);
  auto p = prompt_of(0, 40);
  p[3] = 999;  // a change in block 0 changes every later hash too
  const auto b = prefix_block_hashes(p, 16);
  CHECK(a[0] != b[0]);
  CHECK(a[1] != b[1]);
  p = prompt_of(0, 40);
  p[20] = 999;  // a change in block 1 keeps block 0
  const auto c = prefix_block_hashes(p, 16);
  CHECK(a[0] == c[0]);
  CHECK(a[1] != c[1]);
  CHECK(prefix_block_hashes(prompt_of(0, 15), 16).empty());
}

TEST_CASE("worker_pool: ready on welcome, dead after silent heartbeats, back on a new welcome") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .local_queue = 0, .balance_threshold = 4});
  const worker_ref w = pool.add("tcp://a:1").ref;
  CHECK(pool.add("tcp://a:1").ref == w);
  CHECK(pool.at(w).state == worker_state::connecting);
  CHECK_FALSE(pool.choose("m", {}).has_value());
  CHECK(pool.on_welcome(w, welcome_of("a"), 10.0));
  CHECK(pool.at(w).state == worker_state::ready);
  CHECK(pool.at(w).info.tokenizer.tokens.empty());  // the copy is not kept per worker
  pool.on_heartbeat(w, {}, 11.5);
  CHECK(pool.check_liveness(13.0).empty());
  const auto died = pool.check_liveness(13.6);
  REQUIRE(died.size() == 1);
  CHECK(died[0] == w);
  CHECK(pool.at(w).state == worker_state::dead);
  CHECK(pool.check_liveness(20.0).empty());  // reported once
  pool.on_heartbeat(w, {}, 21.0);            // a heartbeat alone does not revive it
  CHECK(pool.at(w).state == worker_state::dead);
  CHECK(pool.on_welcome(w, welcome_of("a"), 22.0));
  CHECK(pool.n_ready() == 1);
}

TEST_CASE("worker_pool: slots are max_running plus the local queue, per model") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .local_queue = 1, .balance_threshold = 4});
  const worker_ref a = pool.add("tcp://a:1").ref;
  const worker_ref b = pool.add("tcp://b:1").ref;
  pool.on_welcome(a, welcome_of("a", 2, "m"), 0);
  pool.on_welcome(b, welcome_of("b", 2, "other"), 0);
  for (int i = 0; i < 3; ++i) {
    const auto c = pool.choose("m", {});
    REQUIRE(c.has_value());
    CHECK(*c == a);
    pool.on_dispatched(*c, {}, 0);
  }
  CHECK_FALSE(pool.choose("m", {}).has_value());  // 2 running + 1 queued
  CHECK(pool.choose("other", {}) == b);
  CHECK_FALSE(pool.choose("nope", {}).has_value());
  pool.on_finished(a);
  CHECK(pool.choose("m", {}) == a);
  sy::proto::heartbeat hb;
  hb.draining = true;
  pool.on_heartbeat(a, hb, 0.5);
  CHECK_FALSE(pool.choose("m", {}).has_value());  // a draining worker takes nothing new
}

TEST_CASE("worker_pool: idle workers tied on load and prefix take requests in turn") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .local_queue = 1, .balance_threshold = 4});
  std::vector<worker_ref> refs;
  for (const char* e : {"tcp://a:1", "tcp://b:1", "tcp://c:1"}) {
    refs.push_back(pool.add(e).ref);
    pool.on_welcome(refs.back(), welcome_of(e, 2), 0);
  }
  // One request at a time, each finished before the next arrives: all three are idle at each
  // choice, and each gets its turn (the first goes to the first joined), then round again.
  std::vector<worker_ref> order;
  for (int i = 0; i < 6; ++i) {
    const auto c = pool.choose("m", {});
    REQUIRE(c.has_value());
    order.push_back(*c);
    pool.on_dispatched(*c, {}, 0);
    pool.on_finished(*c);
  }
  CHECK(order == std::vector<worker_ref>{refs[0], refs[1], refs[2], refs[0], refs[1], refs[2]});
  // Load still comes first: a busy worker is passed over even when it is its turn.
  pool.on_dispatched(refs[0], {}, 0);  // refs[0] busy; the last dispatched is refs[0]
  CHECK(pool.choose("m", {}) == refs[1]);
  pool.on_dispatched(refs[1], {}, 0);
  CHECK(pool.choose("m", {}) == refs[2]);
  pool.on_dispatched(refs[2], {}, 0);
  pool.on_finished(refs[1]);
  CHECK(pool.choose("m", {}) == refs[1]);  // the only idle one, though refs[0] is next in turn
}

TEST_CASE("worker_pool: the worker holding the prompt's prefix wins unless it is much busier") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .local_queue = 16, .balance_threshold = 2});
  const worker_ref a = pool.add("tcp://a:1").ref;
  const worker_ref b = pool.add("tcp://b:1").ref;
  pool.on_welcome(a, welcome_of("a", 8), 0);
  pool.on_welcome(b, welcome_of("b", 8), 0);
  const auto sys1 = prefix_block_hashes(prompt_of(0, 64), 16);
  const auto sys2 = prefix_block_hashes(prompt_of(5000, 64), 16);
  // Equal load: ties go to the least loaded, then the prompt sticks to where it went.
  const auto first = pool.choose("m", sys1);
  REQUIRE(first.has_value());
  pool.on_dispatched(*first, sys1, 0);
  const worker_ref other = *first == a ? b : a;
  CHECK(pool.choose("m", sys2) == other);  // new prefix: least loaded
  pool.on_dispatched(other, sys2, 0);
  CHECK(pool.choose("m", sys1) == *first);
  pool.on_dispatched(*first, sys1, 0);
  CHECK(pool.choose("m", sys1) == *first);
  pool.on_dispatched(*first, sys1, 0);
  CHECK(pool.cached_blocks(*first, sys1) == 4);
  CHECK(pool.cached_blocks(other, sys1) == 0);
  CHECK(pool.at(*first).prefix_hit_blocks == 8);
  // Now `first` has 3 in flight, `other` 1: a difference of 2 keeps the affinity ...
  CHECK(pool.choose("m", sys1) == *first);
  pool.on_dispatched(*first, sys1, 0);
  // ... 4 vs 1 exceeds the threshold: the least loaded takes it (no hot spot).
  CHECK(pool.choose("m", sys1) == other);
}

TEST_CASE("worker_pool: a worker short of KV blocks in its binding pool is passed over while another has them") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .local_queue = 16, .balance_threshold = 4});
  const worker_ref a = pool.add("tcp://a:1").ref;
  const worker_ref b = pool.add("tcp://b:1").ref;
  pool.on_welcome(a, welcome_of("a", 8), 0);
  pool.on_welcome(b, welcome_of("b", 8), 0);
  const auto sys = prefix_block_hashes(prompt_of(0, 64), 16);  // 4 full blocks: 5 needed
  pool.on_dispatched(a, sys, 0);
  pool.on_finished(a);
  REQUIRE(pool.choose("m", sys) == a);  // a holds the prefix
  // A Gemma 3 worker: main blocks free, its sliding-window pool out of blocks. The window pool
  // binds, so b, with room in both, takes the prompt despite a's prefix.
  const sy::proto::heartbeat window_full{
      .free_kv_blocks = 1500, .total_kv_blocks = 2081, .free_window_kv_blocks = 0, .total_window_kv_blocks = 659};
  const sy::proto::heartbeat roomy{
      .free_kv_blocks = 2000, .total_kv_blocks = 2081, .free_window_kv_blocks = 600, .total_window_kv_blocks = 659};
  pool.on_heartbeat(a, window_full, 0.5);
  pool.on_heartbeat(b, roomy, 0.5);
  CHECK(pool.choose("m", sys) == b);
  // 4 free window blocks are short of the prompt's 5; 5 are enough.
  sy::proto::heartbeat almost = window_full;
  almost.free_window_kv_blocks = 4;
  pool.on_heartbeat(a, almost, 1.0);
  CHECK(pool.choose("m", sys) == b);
  almost.free_window_kv_blocks = 5;
  pool.on_heartbeat(a, almost, 1.0);
  CHECK(pool.choose("m", sys) == a);
  // The main pool binds just the same.
  pool.on_heartbeat(a, {.free_kv_blocks = 2, .total_kv_blocks = 2081}, 1.0);
  CHECK(pool.choose("m", sys) == b);
  // Short everywhere: the choice is as without the check (the worker queues the request).
  pool.on_heartbeat(b, window_full, 1.0);
  CHECK(pool.choose("m", sys) == a);
  // A worker without a window pool (or older than its fields) reports only the main pool.
  pool.on_heartbeat(a, {.free_kv_blocks = 100, .total_kv_blocks = 2081}, 1.5);
  CHECK(pool.choose("m", sys) == a);
  // A worker not heard from since its welcome is not short: nothing is known.
  const worker_ref c = pool.add("tcp://c:1").ref;
  pool.on_welcome(c, welcome_of("c", 8), 1.5);
  pool.on_heartbeat(a, window_full, 1.5);
  CHECK(pool.choose("m", prefix_block_hashes(prompt_of(9000, 64), 16)) == c);

  std::string metrics;
  render_worker_kv_metrics(pool, metrics);
  CHECK(metrics.find("switchyard_router_worker_kv_free_blocks{worker=\"tcp://a:1\"} 0\n") != std::string::npos);
  CHECK(metrics.find("switchyard_router_worker_kv_pool_free_blocks{worker=\"tcp://a:1\",pool=\"main\"} 1500\n") !=
        std::string::npos);
  CHECK(metrics.find("switchyard_router_worker_kv_pool_free_blocks{worker=\"tcp://a:1\",pool=\"window\"} 0\n") !=
        std::string::npos);
  CHECK(metrics.find("switchyard_router_worker_kv_pool_total_blocks{worker=\"tcp://a:1\",pool=\"window\"} 659\n") !=
        std::string::npos);
  CHECK(metrics.find("switchyard_router_worker_kv_free_blocks{worker=\"tcp://c:1\"} 0\n") != std::string::npos);
  CHECK(metrics.find("{worker=\"tcp://c:1\",pool=\"window\"}") == std::string::npos);  // it has none
}

TEST_CASE("worker_pool: the prefix index is bounded by what the worker's KV cache holds") {
  worker_pool pool;
  const worker_ref a = pool.add("tcp://a:1").ref;
  auto w = welcome_of("a", 64);
  w.kv_capacity_tokens = 16 * 32;  // 32 blocks -> index of max(64, 64) entries
  pool.on_welcome(a, w, 0);
  const auto old_prompt = prefix_block_hashes(prompt_of(0, 16 * 8), 16);
  pool.on_dispatched(a, old_prompt, 0);
  for (int i = 1; i <= 10; ++i) {
    pool.on_dispatched(a, prefix_block_hashes(prompt_of(i * 100000, 16 * 8), 16), 0);
    pool.on_finished(a);
  }
  CHECK(pool.cached_blocks(a, old_prompt) == 0);  // evicted, least recently used
  CHECK(pool.cached_blocks(a, prefix_block_hashes(prompt_of(10 * 100000, 16 * 8), 16)) == 8);
}

TEST_CASE(
    "worker_pool: a worker that refuses work as draining gets none until a heartbeat, retired ones are not ready") {
  worker_pool pool;
  const worker_ref a = pool.add("tcp://a:1").ref;
  pool.on_welcome(a, welcome_of("a", 4), 0);
  CHECK(pool.choose("m", {}) == a);
  pool.mark_draining(a);
  CHECK_FALSE(pool.choose("m", {}).has_value());
  pool.on_heartbeat(a, {}, 0.5);  // not draining after all
  CHECK(pool.choose("m", {}) == a);
  CHECK(pool.n_ready() == 1);
  pool.retire("tcp://a:1");
  CHECK(pool.n_ready() == 0);
  CHECK_FALSE(pool.choose("m", {}).has_value());
}

namespace {

// Every worker counted in exactly one state.
void check_states_partition(const worker_pool& pool) {
  size_t n = 0;
  for (const auto s : k_worker_states) n += pool.count(s);
  CHECK(n == pool.size());
}

std::string describe(const worker_change& c) {
  return c.endpoint + ": " + (c.from ? std::string(name(*c.from)) : "joined") + " -> " +
         (c.to ? std::string(name(*c.to)) : "removed");
}

std::vector<std::string> changes(worker_pool& pool) {
  std::vector<std::string> out;
  for (const auto& c : pool.take_changes()) out.push_back(describe(c));
  return out;
}

}  // namespace

TEST_CASE("worker_pool: each worker is in exactly one state, and each change is recorded once") {
  worker_pool pool;
  const worker_ref a = pool.add("tcp://a:1").ref;
  CHECK(changes(pool) == std::vector<std::string>{"tcp://a:1: joined -> connecting"});
  pool.add("tcp://a:1");  // listed again: nothing new
  CHECK(changes(pool).empty());
  pool.on_welcome(a, welcome_of("a", 4), 0);
  pool.on_heartbeat(a, {}, 0.5);  // no change: recorded nothing
  sy::proto::heartbeat draining;
  draining.draining = true;
  pool.on_heartbeat(a, draining, 1.0);
  check_states_partition(pool);
  CHECK(pool.count(worker_state::draining) == 1);
  CHECK(pool.n_ready() == 0);
  pool.on_heartbeat(a, draining, 1.5);
  pool.on_heartbeat(a, {}, 2.0);
  pool.retire("tcp://a:1");
  check_states_partition(pool);
  CHECK(pool.count(worker_state::retired) == 1);
  pool.check_liveness(4.1);
  check_states_partition(pool);
  CHECK(pool.count(worker_state::dead) == 1);
  CHECK(pool.count(worker_state::retired) == 0);
  CHECK(changes(pool) == std::vector<std::string>{
                             "tcp://a:1: connecting -> ready",
                             "tcp://a:1: ready -> draining",
                             "tcp://a:1: draining -> ready",
                             "tcp://a:1: ready -> retired",
                             "tcp://a:1: retired -> dead",
                         });
  CHECK_FALSE(pool.retire("tcp://unknown:1"));
}

TEST_CASE("worker_pool: a retired worker gets no new work, finishes what it runs, then is removable") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .dead_grace_s = 4.0, .local_queue = 0, .balance_threshold = 4});
  const worker_ref a = pool.add("tcp://a:1").ref;
  const worker_ref b = pool.add("tcp://b:1").ref;
  pool.on_welcome(a, welcome_of("a", 4), 0);
  pool.on_welcome(b, welcome_of("b", 4), 0);
  pool.on_dispatched(a, {}, 0);
  pool.on_dispatched(a, {}, 0);
  pool.take_changes();

  pool.retire("tcp://a:1");
  CHECK(pool.at(a).state == worker_state::retired);
  for (int i = 0; i < 4; ++i) {  // everything new goes to b
    const auto c = pool.choose("m", {});
    REQUIRE(c.has_value());
    CHECK(*c == b);
    pool.on_dispatched(*c, {}, 0);
  }
  CHECK_FALSE(pool.choose("m", {}).has_value());
  CHECK(pool.removable(1.0).empty());  // two still running there
  pool.on_heartbeat(a, {}, 1.0);       // still beating: still retired, not ready
  CHECK(pool.at(a).state == worker_state::retired);
  pool.on_finished(a);
  CHECK(pool.removable(1.0).empty());
  pool.on_finished(a);
  CHECK(pool.removable(1.0) == std::vector<worker_ref>{a});
  pool.remove(a);
  CHECK(pool.find(a) == nullptr);
  CHECK(pool.size() == 1);
  check_states_partition(pool);
  CHECK(changes(pool) == std::vector<std::string>{"tcp://a:1: ready -> retired", "tcp://a:1: retired -> removed"});
  pool.on_finished(a);  // a late end for a removed worker is ignored
  CHECK(pool.cached_blocks(a, {}) == 0);

  // Listed again later: a new entry under a new ref.
  const auto again = pool.add("tcp://a:1");
  CHECK(again.joined);
  CHECK(again.ref != a);
  CHECK(again.ref != b);
  CHECK(pool.at(again.ref).state == worker_state::connecting);
}

TEST_CASE("worker_pool: a retired worker listed again before it drained takes work again under its ref") {
  worker_pool pool;
  const worker_ref a = pool.add("tcp://a:1").ref;
  pool.on_welcome(a, welcome_of("a", 4), 0);
  pool.on_dispatched(a, {}, 0);
  pool.retire("tcp://a:1");
  CHECK_FALSE(pool.choose("m", {}).has_value());
  const auto again = pool.add("tcp://a:1");
  CHECK_FALSE(again.joined);
  CHECK(again.ref == a);
  CHECK(pool.at(a).state == worker_state::ready);
  CHECK(pool.at(a).in_flight == 1);
  CHECK(pool.choose("m", {}) == a);
  CHECK(pool.removable(10.0).empty());
}

TEST_CASE("worker_pool: unlisted workers that run nothing go at once - connecting ones included") {
  worker_pool pool;
  const worker_ref a = pool.add("tcp://a:1").ref;  // never welcomed
  const worker_ref b = pool.add("tcp://b:1").ref;
  pool.on_welcome(b, welcome_of("b", 4), 0);  // idle
  CHECK(pool.removable(0.1).empty());
  pool.retire("tcp://a:1");
  pool.retire("tcp://b:1");
  CHECK(pool.removable(0.1) == std::vector<worker_ref>{a, b});
}

TEST_CASE(
    "worker_pool: a dead worker is removable after the grace, or at once when unlisted - one that returns is "
    "ready") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .dead_grace_s = 4.0, .local_queue = 0, .balance_threshold = 4});
  const worker_ref a = pool.add("tcp://a:1").ref;
  const worker_ref b = pool.add("tcp://b:1").ref;
  pool.on_welcome(a, welcome_of("a", 4), 0);
  pool.on_welcome(b, welcome_of("b", 4), 0);
  pool.on_dispatched(a, {}, 0);
  CHECK(pool.check_liveness(2.5) == std::vector<worker_ref>{a, b});
  CHECK(pool.at(a).in_flight == 0);  // its requests are the dispatcher's to re-send or end
  CHECK(pool.count(worker_state::dead) == 2);

  // b comes back within the grace: ready again, never removable.
  CHECK(pool.on_welcome(b, welcome_of("b2", 4), 3.0));
  CHECK(pool.at(b).state == worker_state::ready);
  CHECK(pool.removable(6.4).empty());  // a: dead for 3.9 s
  CHECK(pool.removable(6.5) == std::vector<worker_ref>{a});
  pool.remove(a);
  check_states_partition(pool);

  // Dead and no longer listed: removable at once.
  pool.on_heartbeat(b, {}, 4.0);
  CHECK(pool.check_liveness(6.1) == std::vector<worker_ref>{b});
  CHECK(pool.removable(6.1).empty());
  pool.retire("tcp://b:1");
  CHECK(pool.at(b).state == worker_state::dead);
  CHECK(pool.removable(6.1) == std::vector<worker_ref>{b});
}

TEST_CASE("worker_pool: refs are never reused") {
  worker_pool pool;
  std::vector<worker_ref> seen;
  for (int round = 0; round < 3; ++round) {
    const auto r = pool.add("tcp://a:1");
    REQUIRE(r.joined);
    CHECK(std::find(seen.begin(), seen.end(), r.ref) == seen.end());
    seen.push_back(r.ref);
    pool.retire("tcp://a:1");
    pool.remove(r.ref);
  }
  CHECK(pool.size() == 0);
}

namespace {

sy::proto::welcome publishing(const std::string& id, uint32_t n_blocks = 64) {
  auto w = welcome_of(id, 8);
  w.kv_capacity_tokens = 16 * n_blocks;
  w.kv_events = true;
  return w;
}

sy::proto::kv_events events(uint64_t seq, std::vector<uint64_t> stored, std::vector<uint64_t> evicted = {},
                            bool reset = false) {
  return {.seq = seq, .reset = reset, .model_id = "m", .stored = std::move(stored), .evicted = std::move(evicted)};
}

}  // namespace

TEST_CASE("kv view: a worker's events make the view exact and steer the choice") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .local_queue = 16, .balance_threshold = 4});
  const worker_ref a = pool.add("tcp://a:1").ref;
  const worker_ref b = pool.add("tcp://b:1").ref;
  pool.on_welcome(a, publishing("a"), 0);
  pool.on_welcome(b, publishing("b"), 0);
  const auto sys = prefix_block_hashes(prompt_of(0, 64), 16);
  REQUIRE(sys.size() == 4);
  pool.on_kv_events(a, events(1, {}, {}, true));  // snapshots on hello: both empty
  pool.on_kv_events(b, events(1, {}, {}, true));
  CHECK(pool.kv_view_of(a)->exact());
  // b stored the first three blocks of the prompt (another router sent it there).
  pool.on_kv_events(b, events(2, {sys[0], sys[1], sys[2]}));
  CHECK(pool.cached_blocks(b, sys) == 3);
  CHECK(pool.cached_blocks(a, sys) == 0);
  CHECK(pool.choose("m", sys) == b);
  // b evicts the second block: only the first still leads.
  pool.on_kv_events(b, events(3, {}, {sys[1]}));
  CHECK(pool.cached_blocks(b, sys) == 1);
  CHECK(pool.kv_view_of(b)->size() == 2);
  CHECK(pool.kv_view_of(b)->exact());
  const auto& c = pool.kv_counters();
  CHECK(c.stored == 3);
  CHECK(c.evicted == 1);
  CHECK(c.snapshots == 2);
  CHECK(c.gaps == 0);
  // Events about another model, or from a worker not up, change nothing.
  auto other = events(4, {sys[3]});
  other.model_id = "other";
  pool.on_kv_events(b, other);
  const worker_ref late = pool.add("tcp://c:1").ref;  // connecting: never welcomed
  pool.on_kv_events(late, events(1, {sys[3]}, {}, true));
  CHECK(pool.kv_counters().ignored == 2);
  CHECK(pool.cached_blocks(b, sys) == 1);
}

TEST_CASE("kv view: a gap makes it stale, a snapshot is asked for (rate-limited) and restores it") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .kv_resync_interval_s = 1.0});
  const worker_ref a = pool.add("tcp://a:1").ref;
  pool.on_welcome(a, publishing("a"), 0);
  CHECK(pool.kv_resyncs_due(0.0).empty());
  pool.on_kv_events(a, events(1, {11, 12}, {}, true));
  pool.on_kv_events(a, events(2, {13}));
  CHECK(pool.kv_view_of(a)->exact());
  // Message 3 (evicting 11) is lost: 4 arrives.
  pool.on_kv_events(a, events(4, {14}));
  CHECK_FALSE(pool.kv_view_of(a)->exact());
  CHECK(pool.kv_counters().gaps == 1);
  CHECK(pool.kv_view_of(a)->holds(14));  // later facts still count
  CHECK(pool.kv_resyncs_due(10.0) == std::vector<worker_ref>{a});
  CHECK(pool.kv_resyncs_due(10.5).empty());                        // asked already
  CHECK(pool.kv_resyncs_due(11.0) == std::vector<worker_ref>{a});  // the snapshot did not come: again
  CHECK(pool.kv_resyncs() == 2);
  // The snapshot: exactly what the worker holds.
  pool.on_kv_events(a, events(5, {12, 13, 14}, {}, true));
  CHECK(pool.kv_view_of(a)->exact());
  CHECK_FALSE(pool.kv_view_of(a)->holds(11));
  CHECK(pool.kv_view_of(a)->size() == 3);
  CHECK(pool.kv_resyncs_due(20.0).empty());
  // Events after a clear and before any snapshot: stale too (the snapshot was missed).
  pool.on_welcome(a, publishing("a-restarted"), 21.0);
  CHECK(pool.kv_view_of(a)->size() == 0);
  pool.on_kv_events(a, events(9, {15}));
  CHECK_FALSE(pool.kv_view_of(a)->exact());
  CHECK(pool.kv_resyncs_due(21.0) == std::vector<worker_ref>{a});
}

TEST_CASE("kv view: cleared when the worker restarts, gone when it is removed") {
  worker_pool pool({.heartbeat_timeout_s = 2.0});
  const worker_ref a = pool.add("tcp://a:1").ref;
  pool.on_welcome(a, publishing("a"), 0);
  pool.on_kv_events(a, events(1, {1, 2, 3}, {}, true));
  REQUIRE(pool.kv_view_of(a)->size() == 3);
  pool.on_welcome(a, publishing("a"), 0.5);  // the same process again (a repeated hello): kept
  CHECK(pool.kv_view_of(a)->size() == 3);
  pool.on_welcome(a, publishing("a2"), 1.0);  // another process behind the address
  CHECK(pool.kv_view_of(a)->size() == 0);
  pool.on_kv_events(a, events(1, {4}, {}, true));
  CHECK(pool.check_liveness(10.0) == std::vector<worker_ref>{a});  // dead: its view is kept ...
  pool.on_welcome(a, publishing("a2"), 11.0);                      // ... until it is back up (a fresh process)
  CHECK(pool.kv_view_of(a)->size() == 0);
  pool.retire("tcp://a:1");
  REQUIRE(pool.removable(12.0) == std::vector<worker_ref>{a});
  pool.remove(a);
  CHECK(pool.kv_view_of(a) == nullptr);
  std::string metrics;
  render_kv_metrics(pool, metrics);
  CHECK(metrics.find("tcp://a:1") == std::string::npos);  // its label went with it
}

TEST_CASE("kv view: never holds more than the worker's block count") {
  worker_pool pool;
  const worker_ref a = pool.add("tcp://a:1").ref;
  pool.on_welcome(a, publishing("a", 4), 0);
  pool.on_kv_events(a, events(1, {1, 2, 3, 4, 5, 6}, {}, true));  // a broken (or hostile) worker
  CHECK(pool.kv_view_of(a)->size() == 4);
  CHECK(pool.kv_counters().overflows == 1);
  CHECK(pool.kv_resyncs_due(0) == std::vector<worker_ref>{a});
  pool.on_kv_events(a, events(2, {7}, {1, 2}));
  CHECK(pool.kv_view_of(a)->size() == 3);
  // Whatever a welcome claims, one view stays bounded.
  kv_view huge;
  huge.set_capacity(size_t{1} << 40);
  kv_view_counters c;
  sy::proto::kv_events m = events(1, {}, {}, true);
  for (uint64_t h = 1; h <= kv_view::k_max_view_blocks + 10; ++h) m.stored.push_back(h);
  huge.apply(m, c);
  CHECK(huge.size() == kv_view::k_max_view_blocks);
  CHECK(c.overflows == 1);
}

TEST_CASE("kv view: dispatch-time hints bridge the prefill and expire unless confirmed") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .local_queue = 16, .balance_threshold = 4, .kv_hint_ttl_s = 2.0});
  const worker_ref a = pool.add("tcp://a:1").ref;
  const worker_ref b = pool.add("tcp://b:1").ref;
  pool.on_welcome(a, publishing("a"), 0);
  pool.on_welcome(b, publishing("b"), 0);
  pool.on_kv_events(a, events(1, {}, {}, true));
  pool.on_kv_events(b, events(1, {}, {}, true));
  const auto p1 = prefix_block_hashes(prompt_of(0, 64), 16);
  const auto p2 = prefix_block_hashes(prompt_of(9000, 64), 16);
  const auto first = pool.choose("m", p1);
  REQUIRE(first);
  pool.on_dispatched(*first, p1, 10.0);
  CHECK(pool.cached_blocks(*first, p1) == 4);  // the hint, before the worker said anything
  CHECK(pool.kv_view_of(*first)->n_hints() == 4);
  // The worker confirms two blocks (the prompt was cut short by a cancel, say): hints go.
  pool.on_kv_events(*first, events(2, {p1[0], p1[1]}));
  CHECK(pool.kv_view_of(*first)->n_hints() == 2);
  pool.expire_kv_hints(11.0);
  CHECK(pool.cached_blocks(*first, p1) == 4);
  pool.expire_kv_hints(12.5);  // unconfirmed for longer than the TTL
  CHECK(pool.cached_blocks(*first, p1) == 2);
  CHECK(pool.kv_view_of(*first)->n_hints() == 0);
  // A worker that sends no events keeps its hints until they are pushed out (LRU).
  const worker_ref old = pool.add("tcp://old:1").ref;
  pool.on_welcome(old, welcome_of("old", 8), 0);
  pool.on_dispatched(old, p2, 10.0);
  pool.expire_kv_hints(100.0);
  CHECK(pool.cached_blocks(old, p2) == 4);
}

TEST_CASE("kv view: two routers fed the same events send a shared prefix to the same worker") {
  // Router 1 dispatched the prompt; router 2 never saw it, only the workers' events.
  worker_pool r1({.heartbeat_timeout_s = 2.0, .local_queue = 16, .balance_threshold = 4}),
      r2({.heartbeat_timeout_s = 2.0, .local_queue = 16, .balance_threshold = 4});
  const auto sys = prefix_block_hashes(prompt_of(0, 128), 16);
  for (worker_pool* p : {&r1, &r2}) {
    const worker_ref a = p->add("tcp://a:1").ref, b = p->add("tcp://b:1").ref;
    p->on_welcome(a, publishing("a"), 0);
    p->on_welcome(b, publishing("b"), 0);
    p->on_kv_events(a, events(1, {}, {}, true));
    p->on_kv_events(b, events(1, {}, {}, true));
  }
  const auto chosen = r1.choose("m", sys);
  REQUIRE(chosen);
  r1.on_dispatched(*chosen, sys, 0);
  // The worker ran the prefill; its events reach both routers.
  for (worker_pool* p : {&r1, &r2}) p->on_kv_events(*chosen, events(2, std::vector<uint64_t>(sys.begin(), sys.end())));
  // Router 2's other worker is less loaded from its own point of view, within the threshold.
  CHECK(r2.choose("m", sys) == chosen);
  CHECK(r2.cached_blocks(*chosen, sys) == sys.size());
}

TEST_CASE("kv view: a heartbeat naming a later seq reveals a lost last message") {
  worker_pool pool({.heartbeat_timeout_s = 2.0});
  const worker_ref a = pool.add("tcp://a:1").ref;
  pool.on_welcome(a, publishing("a"), 0);
  pool.on_kv_events(a, events(1, {1}, {}, true));
  sy::proto::heartbeat hb;
  hb.kv_seq = 1;
  pool.on_heartbeat(a, hb, 0.5);
  CHECK(pool.kv_view_of(a)->exact());
  hb.kv_seq = 2;  // message 2 never came, and nothing after it
  pool.on_heartbeat(a, hb, 1.0);
  CHECK_FALSE(pool.kv_view_of(a)->exact());
  CHECK(pool.kv_resyncs_due(1.0) == std::vector<worker_ref>{a});
  pool.on_kv_events(a, events(3, {1, 2}, {}, true));
  hb.kv_seq = 3;
  pool.on_heartbeat(a, hb, 1.5);
  CHECK(pool.kv_view_of(a)->exact());
  // A worker that does not publish: its heartbeats' kv_seq means nothing.
  const worker_ref old = pool.add("tcp://old:1").ref;
  pool.on_welcome(old, welcome_of("old"), 0);
  pool.on_heartbeat(old, hb, 1.5);
  CHECK(pool.kv_resyncs_due(5.0).empty());
}

TEST_CASE("worker_pool: time this router could not listen is not its workers' silence") {
  worker_pool_config cfg;
  cfg.heartbeat_timeout_s = 2.0;
  worker_pool pool(cfg);
  const worker_ref a = pool.add("tcp://a:1").ref, b = pool.add("tcp://b:1").ref;
  pool.on_welcome(a, welcome_of("wa"), 0.0);
  pool.on_welcome(b, welcome_of("wb"), 0.0);
  pool.on_heartbeat(a, {}, 1.0);
  pool.on_heartbeat(b, {}, 0.5);
  // The router stalls from 1.2 to 21.2 (SIGSTOP): 20 s nobody could hear.
  pool.forgive_silence(20.0, 21.2);
  CHECK(pool.check_liveness(21.2).empty());
  CHECK(pool.at(a).last_seen_s == Approx(21.0));
  CHECK(pool.at(b).last_seen_s == Approx(20.5));
  // Awake again, b stays silent: dead once 2 s of awake silence add up; a beats on.
  pool.on_heartbeat(a, {}, 21.6);
  CHECK(pool.check_liveness(22.4).empty());
  CHECK(pool.check_liveness(22.6) == std::vector<worker_ref>{b});
  // Never moved past now: a worker heard during the gap keeps its fresh time.
  pool.forgive_silence(5.0, 23.0);
  CHECK(pool.at(a).last_seen_s == Approx(23.0));
}

TEST_CASE("worker_pool: a model is served by ready or ejected workers, not by draining, connecting or dead ones") {
  worker_pool_config cfg;
  cfg.heartbeat_timeout_s = 2.0;
  worker_pool pool(cfg);
  CHECK_FALSE(pool.serves("m"));
  const worker_ref a = pool.add("tcp://a:1").ref;
  CHECK_FALSE(pool.serves("m"));  // connecting
  pool.on_welcome(a, welcome_of("wa"), 0.0);
  CHECK(pool.serves("m"));
  CHECK_FALSE(pool.serves("other"));
  sy::proto::heartbeat draining;
  draining.draining = true;
  pool.on_heartbeat(a, draining, 0.5);
  CHECK_FALSE(pool.serves("m"));
  pool.on_heartbeat(a, {}, 1.0);
  CHECK(pool.serves("m"));
  pool.check_liveness(3.5);
  CHECK_FALSE(pool.serves("m"));  // dead
}
