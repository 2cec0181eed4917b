// Bad-worker bookkeeping (docs/reliability.md, "Bad workers"): the worker pool's outlier ejection
// (consecutive failures, back-off, re-admission, the cap on how many of a model's workers may be
// out) and the cluster's retry budget. Times are arguments: no clock, no sleeps.
#include <catch2/catch.hpp>

#include <string>

#include "router/dispatch/retry_budget.hpp"
#include "router/fleet/worker_pool.hpp"

using namespace sy::router;

namespace {

sy::proto::welcome welcome_of(const std::string& id, const std::string& model = "m") {
  sy::proto::welcome w;
  w.worker_id = id;
  w.model_id = model;
  w.context_length = 2048;
  w.kv_capacity_tokens = 16 * 64;
  w.kv_block_size = 16;
  w.max_running = 4;
  return w;
}

worker_pool_config ejecting(int32_t after, double base_s, double max_s = 300, int32_t max_percent = 50) {
  worker_pool_config c;
  c.heartbeat_timeout_s = 1000;  // liveness is not under test here
  c.eject_after_failures = after;
  c.eject_base_s = base_s;
  c.eject_max_s = max_s;
  c.max_ejected_percent = max_percent;
  return c;
}

}  // namespace

TEST_CASE("outlier ejection: K failures in a row eject a worker, a success in between resets the count") {
  worker_pool pool(ejecting(3, 10.0));
  const worker_ref bad = pool.add("tcp://bad:1").ref;
  const worker_ref good = pool.add("tcp://good:1").ref;
  pool.on_welcome(bad, welcome_of("bad"), 0.0);
  pool.on_welcome(good, welcome_of("good"), 0.0);

  CHECK_FALSE(pool.on_request_failed(bad, 1.0));
  CHECK_FALSE(pool.on_request_failed(bad, 1.0));
  pool.on_request_succeeded(bad);  // not in a row: start again
  CHECK_FALSE(pool.on_request_failed(bad, 1.0));
  CHECK_FALSE(pool.on_request_failed(bad, 1.0));
  CHECK(pool.at(bad).state == worker_state::ready);
  CHECK(pool.on_request_failed(bad, 2.0));
  CHECK(pool.at(bad).state == worker_state::ejected);
  CHECK(pool.count(worker_state::ejected) == 1);
  CHECK(pool.ejections_total() == 1);
  CHECK(pool.n_ready() == 1);
  // It gets nothing new while ejected, however idle it is.
  for (int i = 0; i < 3; ++i) {
    const auto w = pool.choose("m", {});
    REQUIRE(w.has_value());
    CHECK(*w == good);
    pool.on_dispatched(*w, {}, 2.0);
  }
  const auto changes = pool.take_changes();
  REQUIRE_FALSE(changes.empty());
  CHECK(changes.back().ref == bad);
  CHECK(changes.back().to == worker_state::ejected);
}

TEST_CASE("outlier ejection: re-admitted after its time, ejected for longer if it keeps failing") {
  worker_pool pool(ejecting(2, 10.0, /*max_s=*/25.0));
  const worker_ref bad = pool.add("tcp://bad:1").ref;
  const worker_ref good = pool.add("tcp://good:1").ref;
  pool.on_welcome(bad, welcome_of("bad"), 0.0);
  pool.on_welcome(good, welcome_of("good"), 0.0);

  pool.on_request_failed(bad, 1.0);
  REQUIRE(pool.on_request_failed(bad, 1.0));
  CHECK(pool.at(bad).ejected_until_s == Approx(11.0));  // base
  CHECK(pool.readmit(10.9).empty());
  auto back = pool.readmit(11.0);
  REQUIRE(back.size() == 1);
  CHECK(back[0] == bad);
  CHECK(pool.at(bad).state == worker_state::ready);

  pool.on_request_failed(bad, 12.0);
  REQUIRE(pool.on_request_failed(bad, 12.0));
  CHECK(pool.at(bad).ejected_until_s == Approx(32.0));  // 2 x base
  pool.readmit(32.0);
  pool.on_request_failed(bad, 33.0);
  REQUIRE(pool.on_request_failed(bad, 33.0));
  CHECK(pool.at(bad).ejected_until_s == Approx(58.0));  // 3 x base = 30, capped at 25
  pool.readmit(58.0);

  // Healthy again: a success clears the record, the next ejection is short again.
  pool.on_request_succeeded(bad);
  pool.on_request_failed(bad, 60.0);
  REQUIRE(pool.on_request_failed(bad, 60.0));
  CHECK(pool.at(bad).ejected_until_s == Approx(70.0));
  CHECK(pool.at(bad).ejections == 4);
}

TEST_CASE("outlier ejection: never more than the allowed share of a model's workers, never its only one") {
  SECTION("a model's only worker stays in: its failures reach clients fast") {
    worker_pool pool(ejecting(1, 10.0));
    const worker_ref w = pool.add("tcp://only:1").ref;
    pool.on_welcome(w, welcome_of("only"), 0.0);
    for (int i = 0; i < 5; ++i) CHECK_FALSE(pool.on_request_failed(w, 1.0));
    CHECK(pool.at(w).state == worker_state::ready);
  }
  SECTION("two of four at 50 %, then no more; another model's workers do not count") {
    worker_pool pool(ejecting(1, 10.0, 300, 50));
    std::vector<worker_ref> ws;
    for (int i = 0; i < 4; ++i) {
      ws.push_back(pool.add("tcp://w" + std::to_string(i) + ":1").ref);
      pool.on_welcome(ws.back(), welcome_of("w" + std::to_string(i)), 0.0);
    }
    const worker_ref other = pool.add("tcp://other:1").ref;
    pool.on_welcome(other, welcome_of("other", "another-model"), 0.0);
    CHECK(pool.on_request_failed(ws[0], 1.0));
    CHECK(pool.on_request_failed(ws[1], 1.0));
    CHECK_FALSE(pool.on_request_failed(ws[2], 1.0));
    CHECK(pool.count(worker_state::ejected) == 2);
    CHECK(pool.on_request_failed(other, 1.0) == false);  // alone in its model
    // Once one is back, another may go.
    pool.readmit(11.0);
    CHECK(pool.on_request_failed(ws[2], 12.0));
  }
}

TEST_CASE("outlier ejection: a restarted process (new worker id) starts with a clean record") {
  worker_pool pool(ejecting(1, 10.0));
  const worker_ref bad = pool.add("tcp://bad:1").ref;
  const worker_ref good = pool.add("tcp://good:1").ref;
  pool.on_welcome(bad, welcome_of("bad-1"), 0.0);
  pool.on_welcome(good, welcome_of("good"), 0.0);
  REQUIRE(pool.on_request_failed(bad, 1.0));
  pool.on_welcome(bad, welcome_of("bad-2"), 2.0);
  CHECK(pool.at(bad).state == worker_state::ready);
  CHECK(pool.at(bad).consecutive_failures == 0);
}

TEST_CASE("retry budget: a floor per window plus a share of first attempts, refusals counted") {
  retry_budget b({.ratio = 0.5, .min_retries = 2, .window_s = 10.0});
  CHECK(b.try_retry(0.0));
  CHECK(b.try_retry(0.1));
  CHECK_FALSE(b.try_retry(0.2));  // the floor is spent, no requests yet
  for (int i = 0; i < 4; ++i) b.on_request(0.3);
  CHECK(b.try_retry(0.4));  // 2 + 0.5 x 4 = 4 allowed
  CHECK(b.try_retry(0.4));
  CHECK_FALSE(b.try_retry(0.5));
  CHECK(b.granted() == 4);
  CHECK(b.refused() == 2);
  // The window moves on: old retries and requests no longer count.
  CHECK(b.try_retry(10.5));
  CHECK(b.try_retry(10.6));
  CHECK_FALSE(b.try_retry(10.7));
}
