// The router's worker bookkeeping: liveness from heartbeats, slots, prefix-aware choice that
// still balances load.
#include <catch2/catch.hpp>

#include <vector>

#include "router/worker_pool.hpp"

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
  const size_t w = pool.add("tcp://a:1");
  CHECK(pool.add("tcp://a:1") == w);
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
  const size_t a = pool.add("tcp://a:1");
  const size_t b = pool.add("tcp://b:1");
  pool.on_welcome(a, welcome_of("a", 2, "m"), 0);
  pool.on_welcome(b, welcome_of("b", 2, "other"), 0);
  for (int i = 0; i < 3; ++i) {
    const auto c = pool.choose("m", {});
    REQUIRE(c.has_value());
    CHECK(*c == a);
    pool.on_dispatched(*c, {});
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

TEST_CASE("worker_pool: the worker holding the prompt's prefix wins unless it is much busier") {
  worker_pool pool({.heartbeat_timeout_s = 2.0, .local_queue = 16, .balance_threshold = 2});
  const size_t a = pool.add("tcp://a:1");
  const size_t b = pool.add("tcp://b:1");
  pool.on_welcome(a, welcome_of("a", 8), 0);
  pool.on_welcome(b, welcome_of("b", 8), 0);
  const auto sys1 = prefix_block_hashes(prompt_of(0, 64), 16);
  const auto sys2 = prefix_block_hashes(prompt_of(5000, 64), 16);
  // Equal load: ties go to the least loaded, then the prompt sticks to where it went.
  const auto first = pool.choose("m", sys1);
  REQUIRE(first.has_value());
  pool.on_dispatched(*first, sys1);
  const size_t other = *first == a ? b : a;
  CHECK(pool.choose("m", sys2) == other);  // new prefix: least loaded
  pool.on_dispatched(other, sys2);
  CHECK(pool.choose("m", sys1) == *first);
  pool.on_dispatched(*first, sys1);
  CHECK(pool.choose("m", sys1) == *first);
  pool.on_dispatched(*first, sys1);
  CHECK(pool.cached_blocks(*first, sys1) == 4);
  CHECK(pool.cached_blocks(other, sys1) == 0);
  CHECK(pool.at(*first).prefix_hit_blocks == 8);
  // Now `first` has 3 in flight, `other` 1: a difference of 2 keeps the affinity ...
  CHECK(pool.choose("m", sys1) == *first);
  pool.on_dispatched(*first, sys1);
  // ... 4 vs 1 exceeds the threshold: the least loaded takes it (no hot spot).
  CHECK(pool.choose("m", sys1) == other);
}

TEST_CASE("worker_pool: the prefix index is bounded by what the worker's KV cache holds") {
  worker_pool pool;
  const size_t a = pool.add("tcp://a:1");
  auto w = welcome_of("a", 64);
  w.kv_capacity_tokens = 16 * 32;  // 32 blocks -> index of max(64, 64) entries
  pool.on_welcome(a, w, 0);
  const auto old_prompt = prefix_block_hashes(prompt_of(0, 16 * 8), 16);
  pool.on_dispatched(a, old_prompt);
  for (int i = 1; i <= 10; ++i) {
    pool.on_dispatched(a, prefix_block_hashes(prompt_of(i * 100000, 16 * 8), 16));
    pool.on_finished(a);
  }
  CHECK(pool.cached_blocks(a, old_prompt) == 0);  // evicted, least recently used
  CHECK(pool.cached_blocks(a, prefix_block_hashes(prompt_of(10 * 100000, 16 * 8), 16)) == 8);
}

TEST_CASE(
    "worker_pool: a worker that refuses work as draining gets none until a heartbeat, retired ones are not ready") {
  worker_pool pool;
  const size_t a = pool.add("tcp://a:1");
  pool.on_welcome(a, welcome_of("a", 4), 0);
  CHECK(pool.choose("m", {}) == a);
  pool.mark_draining(a);
  CHECK_FALSE(pool.choose("m", {}).has_value());
  pool.on_heartbeat(a, {}, 0.5);  // not draining after all
  CHECK(pool.choose("m", {}) == a);
  CHECK(pool.n_ready() == 1);
  pool.retire(a);
  CHECK(pool.n_ready() == 0);
  CHECK_FALSE(pool.choose("m", {}).has_value());
}
