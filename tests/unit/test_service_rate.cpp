// The per-model service rate behind the queue wait estimate (docs/router.md, "Queue wait
// estimate"). Times are arguments: no clock, no sleeps.
#include <catch2/catch.hpp>

#include "router/dispatch/service_rate.hpp"

using sy::router::service_rate;

namespace {

// `seconds` of 100 ms ticks from `t`, `per_s` queue tokens done each second; returns the end time.
double run(service_rate& r, double t, double seconds, double per_s, bool saturated) {
  const int ticks = static_cast<int>(seconds * 10 + 0.5);
  for (int i = 0; i < ticks; ++i) {
    r.done(per_s / 10);
    t += 0.1;
    r.tick(t, saturated);
  }
  return t;
}

}  // namespace

TEST_CASE("service rate: unknown until two saturated windows, then queued work over the measured rate") {
  service_rate r;
  CHECK_FALSE(r.wait_s(1000));
  r.tick(0.0, true);
  double t = run(r, 0.0, 1.0, 50, /*saturated=*/true);  // the first window
  CHECK_FALSE(r.wait_s(1000));
  CHECK(r.tokens_per_s() == 0);
  t = run(r, t, 1.0, 50, true);
  REQUIRE(r.wait_s(1000));
  CHECK(*r.wait_s(1000) == Approx(20.0).epsilon(0.02));
  CHECK(r.tokens_per_s() == Approx(50).epsilon(0.02));
  CHECK(*r.wait_s(0) == 0);
  // A faster cluster (more workers) moves it there within a few windows.
  t = run(r, t, 12.0, 200, true);
  CHECK(r.tokens_per_s() == Approx(200).epsilon(0.05));
}

TEST_CASE("service rate: idle time and windows where nothing finished leave the estimate as it was") {
  service_rate r;
  r.tick(0.0, true);
  double t = run(r, 0.0, 3.0, 100, true);
  const double before = r.tokens_per_s();
  REQUIRE(before == Approx(100).epsilon(0.02));
  // An hour idle: nothing queued, nothing done. The estimate does not decay towards zero (a
  // burst after a lull would read a tiny rate and be refused on deadline).
  t = run(r, t, 3600.0, 0, false);
  CHECK(r.tokens_per_s() == before);
  // Requests queued and nothing finishing (no worker for them yet, a long prefill): no sample.
  t = run(r, t, 30.0, 0, true);
  CHECK(r.tokens_per_s() == before);
  // Light load (queue empty between requests) says only that the capacity is at least that much.
  t = run(r, t, 5.0, 10, false);
  CHECK(r.tokens_per_s() == before);
  run(r, t, 2.0, 300, false);
  CHECK(r.tokens_per_s() == Approx(300).epsilon(0.02));
}

TEST_CASE("service rate: a burst on a cluster that never measured one is never estimated from its start") {
  service_rate r;
  r.tick(0.0, false);
  double t = run(r, 0.0, 60.0, 0, false);  // idle since start
  // The burst arrives mid-window: that window is not saturated throughout and sets nothing.
  t = run(r, t, 0.5, 0, false);
  t = run(r, t, 0.6, 2, true);
  CHECK_FALSE(r.wait_s(500));
  // Only light work before any saturated window: still unknown (a lower bound is no estimate).
  t = run(r, t, 3.0, 1, false);
  CHECK_FALSE(r.wait_s(500));
  t = run(r, t, 1.5, 40, true);
  CHECK_FALSE(r.wait_s(500));  // one saturated window at most (the first was partly light)
  run(r, t, 3.0, 40, true);
  REQUIRE(r.wait_s(500));
  CHECK(*r.wait_s(500) == Approx(12.5).epsilon(0.05));
}
