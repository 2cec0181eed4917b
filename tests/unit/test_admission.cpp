// admission_controller: each shed point with its status, Retry-After and counter; token buckets
// refilling with the (passed-in) clock; RAII permits; shed order between classes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "router/dispatch/admission.hpp"
#include "router/dispatch/tenants.hpp"

using namespace sy::router;

namespace {

const char* const k_config = R"({ "tenants": [
  { "name": "free", "keys": ["k-free"] },
  { "name": "rate", "keys": ["k-rate"], "requests_per_s": 2, "burst": 2 },
  { "name": "tok", "keys": ["k-tok"], "tokens_per_min": 600 },
  { "name": "conc", "keys": ["k-conc"], "max_concurrent": 2 },
  { "name": "acme", "keys": ["k-acme"], "max_concurrent": 1, "priority": {"default": 0, "min": -1, "max": 5} },
  { "name": "slow", "keys": ["k-slow"], "requests_per_s": 0.1 } ] })";

struct fixture {
  tenant_registry reg = tenant_registry::parse(k_config);
  admission_config cfg = [] {
    admission_config c;
    c.max_queued_requests = 100;
    c.max_queued_tokens = 1000;
    return c;
  }();
  admission_controller ac{cfg, reg};

  const tenant& t(const char* name) const { return *reg.find(name); }
};

bool admitted(const std::variant<admission_permit, rejection>& v) {
  return std::holds_alternative<admission_permit>(v);
}

// The rejection in `v`; fails the test if the request was admitted.
rejection rejected(std::variant<admission_permit, rejection> v) {
  REQUIRE(std::holds_alternative<rejection>(v));
  return std::get<rejection>(std::move(v));
}

const queue_load k_empty{};

}  // namespace

TEST_CASE("reject reasons have metric names", "[admission]") {
  CHECK(name(reject_reason::tenant_rate) == "tenant_rate");
  CHECK(name(reject_reason::tenant_tokens) == "tenant_tokens");
  CHECK(name(reject_reason::tenant_concurrency) == "tenant_concurrency");
  CHECK(name(reject_reason::priority_not_allowed) == "priority_not_allowed");
  CHECK(name(reject_reason::queue_full) == "queue_full");
  CHECK(name(reject_reason::queue_tokens) == "queue_tokens");
  CHECK(name(reject_reason::deadline) == "deadline");
}

TEST_CASE("admission: an unlimited tenant on an empty queue is admitted and counted", "[admission]") {
  fixture f;
  for (int i = 0; i < 50; ++i) {
    CHECK(admitted(f.ac.admit(f.t("free"), 0, 100, 0, 0.0, k_empty)));
  }
  CHECK(f.ac.admitted() == 50);
  for (size_t r = 0; r < k_n_reject_reasons; ++r) CHECK(f.ac.rejected(static_cast<reject_reason>(r)) == 0);
  CHECK(f.ac.in_flight(f.t("free")) == 0);  // every permit above was dropped at once
}

TEST_CASE("admission: priority outside the tenant's range is 403", "[admission]") {
  fixture f;
  rejection r = rejected(f.ac.admit(f.t("acme"), 6, 10, 0, 0.0, k_empty));
  CHECK(r.reason == reject_reason::priority_not_allowed);
  CHECK(r.status == 403);
  CHECK(r.retry_after_s >= 1);
  CHECK_THAT(r.message, Catch::Contains("'acme'") && Catch::Contains("priority 6"));
  CHECK(rejected(f.ac.admit(f.t("acme"), -2, 10, 0, 0.0, k_empty)).reason == reject_reason::priority_not_allowed);
  CHECK(f.ac.rejected(reject_reason::priority_not_allowed) == 2);
  CHECK(f.ac.in_flight(f.t("acme")) == 0);

  auto ok = f.ac.admit(f.t("acme"), 5, 10, 0, 0.0, k_empty);
  CHECK(admitted(ok));
  // Priority is checked before concurrency: acme's one slot is taken, yet the reason is priority.
  CHECK(rejected(f.ac.admit(f.t("acme"), 7, 10, 0, 0.0, k_empty)).reason == reject_reason::priority_not_allowed);
  CHECK(rejected(f.ac.admit(f.t("acme"), 0, 10, 0, 0.0, k_empty)).reason == reject_reason::tenant_concurrency);
}

TEST_CASE("admission: concurrency limit is 429 and a dropped permit frees the slot", "[admission]") {
  fixture f;
  const tenant& conc = f.t("conc");
  auto a = f.ac.admit(conc, 0, 10, 0, 0.0, k_empty);
  auto b = f.ac.admit(conc, 0, 10, 0, 0.0, k_empty);
  REQUIRE(admitted(a));
  REQUIRE(admitted(b));
  CHECK(f.ac.in_flight(conc) == 2);

  rejection r = rejected(f.ac.admit(conc, 0, 10, 0, 0.0, k_empty));
  CHECK(r.reason == reject_reason::tenant_concurrency);
  CHECK(r.status == 429);
  CHECK(r.retry_after_s == 1);
  CHECK_THAT(r.message, Catch::Contains("'conc'") && Catch::Contains("limit of 2 concurrent"));
  CHECK(f.ac.rejected(reject_reason::tenant_concurrency) == 1);
  CHECK(f.ac.in_flight(conc) == 2);  // the rejection took no slot

  { auto dropped = std::get<admission_permit>(std::move(a)); }
  CHECK(f.ac.in_flight(conc) == 1);
  auto c = f.ac.admit(conc, 0, 10, 0, 0.0, k_empty);
  CHECK(admitted(c));
  CHECK(f.ac.in_flight(conc) == 2);
  CHECK(f.ac.admitted() == 3);
}

TEST_CASE("admission: moved-from permits hold nothing and never free twice", "[admission]") {
  fixture f;
  const tenant& conc = f.t("conc");
  admission_permit p1 = std::get<admission_permit>(f.ac.admit(conc, 0, 1, 0, 0.0, k_empty));
  CHECK(p1.held());
  CHECK(p1.tenant_index() == conc.index);

  admission_permit p2(std::move(p1));
  CHECK_FALSE(p1.held());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  CHECK(p2.held());
  CHECK(f.ac.in_flight(conc) == 1);

  {
    admission_permit p3 = std::move(p2);
    CHECK(f.ac.in_flight(conc) == 1);
  }
  CHECK(f.ac.in_flight(conc) == 0);
  p1.release();
  p2.release();
  CHECK(f.ac.in_flight(conc) == 0);

  // Move-assigning onto a held permit returns the slot it held.
  admission_permit a = std::get<admission_permit>(f.ac.admit(conc, 0, 1, 0, 0.0, k_empty));
  admission_permit b = std::get<admission_permit>(f.ac.admit(conc, 0, 1, 0, 0.0, k_empty));
  CHECK(f.ac.in_flight(conc) == 2);
  a = std::move(b);
  CHECK(f.ac.in_flight(conc) == 1);
  CHECK(a.held());
  a.release();
  a.release();
  CHECK(f.ac.in_flight(conc) == 0);
}

TEST_CASE("admission: the requests/s bucket empties, is 429, and refills with time", "[admission]") {
  fixture f;
  const tenant& rate = f.t("rate");  // 2/s, burst 2
  CHECK(admitted(f.ac.admit(rate, 0, 1, 0, 100.0, k_empty)));
  CHECK(admitted(f.ac.admit(rate, 0, 1, 0, 100.0, k_empty)));
  rejection r = rejected(f.ac.admit(rate, 0, 1, 0, 100.0, k_empty));
  CHECK(r.reason == reject_reason::tenant_rate);
  CHECK(r.status == 429);
  CHECK(r.retry_after_s == 1);  // 0.5 s to refill one request, rounded up
  CHECK_THAT(r.message, Catch::Contains("tenant 'rate' is over its limit of 2 requests/s"));

  CHECK(rejected(f.ac.admit(rate, 0, 1, 0, 100.4, k_empty)).reason == reject_reason::tenant_rate);
  CHECK(admitted(f.ac.admit(rate, 0, 1, 0, 100.5, k_empty)));
  CHECK(rejected(f.ac.admit(rate, 0, 1, 0, 100.5, k_empty)).reason == reject_reason::tenant_rate);
  // A long idle refills only up to the burst.
  CHECK(admitted(f.ac.admit(rate, 0, 1, 0, 200.0, k_empty)));
  CHECK(admitted(f.ac.admit(rate, 0, 1, 0, 200.0, k_empty)));
  CHECK(rejected(f.ac.admit(rate, 0, 1, 0, 200.0, k_empty)).reason == reject_reason::tenant_rate);
  CHECK(f.ac.rejected(reject_reason::tenant_rate) == 4);
  CHECK(f.ac.admitted() == 5);
}

TEST_CASE("admission: the HTTP edge takes from the same requests/s bucket, and admit skips what it took",
          "[admission]") {
  fixture f;
  const tenant& rate = f.t("rate");  // 2/s, burst 2
  CHECK_FALSE(f.ac.take_rate(rate, 100.0));
  // Charged at the edge: admit() does not charge it again.
  CHECK(admitted(f.ac.admit(rate, 0, 1, 0, 100.0, k_empty, /*rate_taken=*/true)));
  CHECK_FALSE(f.ac.take_rate(rate, 100.0));
  auto no = f.ac.take_rate(rate, 100.0);  // the bucket is empty
  REQUIRE(no);
  CHECK(no->reason == reject_reason::tenant_rate);
  CHECK(no->status == 429);
  CHECK(no->retry_after_s == 1);
  // A request that did not pass the edge still meets the bucket in admit().
  CHECK(rejected(f.ac.admit(rate, 0, 1, 0, 100.2, k_empty)).reason == reject_reason::tenant_rate);
  CHECK(f.ac.rejected(reject_reason::tenant_rate) == 2);  // one at the edge, one in admit()
  CHECK_FALSE(f.ac.take_rate(rate, 100.5));               // refilled by time alone
  // A tenant without a rate limit always passes.
  for (int i = 0; i < 100; ++i) CHECK_FALSE(f.ac.take_rate(f.t("free"), 100.0));
}

TEST_CASE("admission: Retry-After for a slow rate is the time to refill one request", "[admission]") {
  fixture f;
  const tenant& slow = f.t("slow");  // 0.1/s, burst max(1, 0.1) = 1
  CHECK(admitted(f.ac.admit(slow, 0, 1, 0, 0.0, k_empty)));
  rejection r = rejected(f.ac.admit(slow, 0, 1, 0, 0.0, k_empty));
  CHECK(r.retry_after_s == 10);
  r = rejected(f.ac.admit(slow, 0, 1, 0, 7.5, k_empty));
  CHECK(r.retry_after_s == 3);  // 2.5 s left, rounded up
  CHECK(admitted(f.ac.admit(slow, 0, 1, 0, 10.0, k_empty)));
}

TEST_CASE("admission: the tokens/min bucket charges prompt + max_tokens", "[admission]") {
  fixture f;
  const tenant& tok = f.t("tok");  // 600/min = 10/s
  CHECK(admitted(f.ac.admit(tok, 0, 500, 0, 0.0, k_empty)));
  rejection r = rejected(f.ac.admit(tok, 0, 200, 0, 0.0, k_empty));
  CHECK(r.reason == reject_reason::tenant_tokens);
  CHECK(r.status == 429);
  CHECK(r.retry_after_s == 10);  // 100 tokens missing at 10 tokens/s
  CHECK_THAT(r.message, Catch::Contains("tenant 'tok' is over its limit of 600 tokens/min"));
  CHECK(admitted(f.ac.admit(tok, 0, 100, 0, 0.0, k_empty)));  // a smaller one still fits
  CHECK(rejected(f.ac.admit(tok, 0, 200, 0, 15.0, k_empty)).reason == reject_reason::tenant_tokens);
  CHECK(admitted(f.ac.admit(tok, 0, 200, 0, 20.0, k_empty)));

  // More than a whole minute's worth can never fit.
  r = rejected(f.ac.admit(tok, 0, 601, 0, 1000.0, k_empty));
  CHECK(r.reason == reject_reason::tenant_tokens);
  CHECK(r.retry_after_s >= 1);
  CHECK_THAT(r.message, Catch::Contains("601 tokens exceeds"));
  CHECK(f.ac.rejected(reject_reason::tenant_tokens) == 3);
}

TEST_CASE("admission: a rejected request costs no bucket tokens and no slot", "[admission]") {
  fixture f;
  const queue_load full{100, 0, 0};
  const tenant& rate = f.t("rate");
  const tenant& tok = f.t("tok");
  for (int i = 0; i < 5; ++i) {
    CHECK(rejected(f.ac.admit(rate, 0, 1, 0, 0.0, full)).reason == reject_reason::queue_full);
    CHECK(rejected(f.ac.admit(tok, 0, 600, 0, 0.0, full)).reason == reject_reason::queue_full);
  }
  CHECK(f.ac.in_flight(rate) == 0);
  CHECK(f.ac.in_flight(tok) == 0);
  // Both buckets are still full.
  CHECK(admitted(f.ac.admit(rate, 0, 1, 0, 0.0, k_empty)));
  CHECK(admitted(f.ac.admit(rate, 0, 1, 0, 0.0, k_empty)));
  CHECK(admitted(f.ac.admit(tok, 0, 600, 0, 0.0, k_empty)));
  CHECK(f.ac.rejected(reject_reason::queue_full) == 10);
  CHECK(f.ac.admitted() == 3);
}

TEST_CASE("admission: the request cap sheds batch, then standard, then interactive", "[admission]") {
  fixture f;  // 100 requests; fractions 1.0 / 0.85 / 0.6
  const tenant& free = f.t("free");
  auto at = [&](size_t queued, int32_t priority) {
    return f.ac.admit(free, priority, 1, 0, 0.0, queue_load{queued, 0, 2.3});
  };
  CHECK(admitted(at(59, 1)));
  rejection r = rejected(at(60, 1));
  CHECK(r.reason == reject_reason::queue_full);
  CHECK(r.status == 429);       // a full queue: SGLang's gateway's status
  CHECK(r.retry_after_s == 3);  // est_wait_s 2.3, rounded up
  CHECK_THAT(r.message, Catch::Contains("batch") && Catch::Contains("limit 60"));
  CHECK(admitted(at(60, 0)));
  CHECK(admitted(at(60, -1)));

  CHECK(rejected(at(85, 0)).reason == reject_reason::queue_full);
  CHECK(admitted(at(85, -1)));
  CHECK(rejected(at(100, -1)).reason == reject_reason::queue_full);
  CHECK(f.ac.rejected(reject_reason::queue_full) == 3);
}

TEST_CASE("admission: the token cap sheds by class too", "[admission]") {
  fixture f;  // 1000 tokens
  const tenant& free = f.t("free");
  auto at = [&](int64_t queued_tokens, int32_t priority) {
    return f.ac.admit(free, priority, 50, 0, 0.0, queue_load{3, queued_tokens, 0});
  };
  CHECK(admitted(at(599, 1)));
  rejection r = rejected(at(600, 1));
  CHECK(r.reason == reject_reason::queue_tokens);
  CHECK(r.status == 429);
  CHECK(r.retry_after_s == 1);  // no wait estimate: at least 1
  CHECK(admitted(at(600, 0)));
  CHECK(rejected(at(900, 0)).reason == reject_reason::queue_tokens);
  CHECK(admitted(at(900, -3)));
  CHECK(rejected(at(1000, -3)).reason == reject_reason::queue_tokens);
  CHECK(f.ac.rejected(reject_reason::queue_tokens) == 3);
  CHECK(f.ac.rejected(reject_reason::queue_full) == 0);
}

TEST_CASE("admission: a deadline the queue wait already passes is 503", "[admission]") {
  fixture f;
  const tenant& free = f.t("free");
  const queue_load busy{10, 100, 5.0};
  rejection r = rejected(f.ac.admit(free, 0, 1, 14.0, 10.0, busy));
  CHECK(r.reason == reject_reason::deadline);
  CHECK(r.status == 503);
  CHECK(r.retry_after_s == 5);
  CHECK_THAT(r.message, Catch::Contains("deadline"));
  CHECK(admitted(f.ac.admit(free, 0, 1, 15.0, 10.0, busy)));  // exactly on time
  CHECK(admitted(f.ac.admit(free, 0, 1, 0, 10.0, busy)));     // no deadline
  CHECK(f.ac.rejected(reject_reason::deadline) == 1);
  CHECK(f.ac.admitted() == 2);
}

TEST_CASE("admission: checks run in the documented order", "[admission]") {
  fixture f;
  const tenant& conc = f.t("conc");
  auto a = f.ac.admit(conc, 0, 1, 0, 0.0, k_empty);
  auto b = f.ac.admit(conc, 0, 1, 0, 0.0, k_empty);
  REQUIRE(admitted(a));
  REQUIRE(admitted(b));
  // Concurrency before the queue caps and the deadline.
  const queue_load full{1000, 100000, 100};
  CHECK(rejected(f.ac.admit(conc, 0, 1, 1.0, 0.0, full)).reason == reject_reason::tenant_concurrency);
  // Queue caps before the deadline.
  CHECK(rejected(f.ac.admit(f.t("free"), 0, 1, 1.0, 0.0, full)).reason == reject_reason::queue_full);
  const queue_load tokens_full{0, 100000, 100};
  CHECK(rejected(f.ac.admit(f.t("free"), 0, 1, 1.0, 0.0, tokens_full)).reason == reject_reason::queue_tokens);
}

TEST_CASE("admission: a tiny queue cap still lets every class queue one request") {
  const auto reg = sy::router::tenant_registry::open_access();
  sy::router::admission_config cfg;
  cfg.max_queued_requests = 1;  // standard's and batch's shares round up to 1, not down to 0
  sy::router::admission_controller ac(cfg, reg);
  const auto& t = reg.tenants()[0];
  for (const int32_t priority : {-1, 0, 5}) {
    auto empty = ac.admit(t, priority, 10, 0, 0.0, {0, 0, 0});
    CHECK(std::holds_alternative<sy::router::admission_permit>(empty));
    auto full = ac.admit(t, priority, 10, 0, 0.0, {1, 10, 0});
    REQUIRE(std::holds_alternative<sy::router::rejection>(full));
    CHECK(std::get<sy::router::rejection>(full).reason == sy::router::reject_reason::queue_full);
  }
}

// The router's threads as they share the controller: I/O threads charge the requests/s bucket at
// the edge (take_rate) while the dispatcher thread admits, charging the same bucket itself for
// requests that did not pass the edge, and reads the counters. Under ThreadSanitizer
// (tests/sanitize.sh, build-tsan) this shows that the bucket's mutex covers every access; in any
// build, with the clock held still, that the burst is handed out exactly once, never twice.
TEST_CASE("admission: the edge's take_rate on two threads and admit on a third hand out the burst exactly once",
          "[admission]") {
  const auto reg = tenant_registry::parse(R"({ "tenants": [
    { "name": "edge", "keys": ["k-edge"], "requests_per_s": 1, "burst": 3000 } ] })");
  admission_controller ac(admission_config{}, reg);
  const tenant& t = *reg.find("edge");
  constexpr int k_attempts = 2000;  // per thread: 6000 in all against a burst of 3000
  std::vector<int> edge_passed(2, 0);
  std::vector<std::thread> edge;
  for (size_t i = 0; i < edge_passed.size(); ++i) {
    edge.emplace_back([&ac, &t, &passed = edge_passed[i]] {
      for (int k = 0; k < k_attempts; ++k) passed += !ac.take_rate(t, 100.0);
    });
  }
  int admit_passed = 0;
  uint64_t rejected_seen = 0;
  for (int k = 0; k < k_attempts; ++k) {
    admit_passed += admitted(ac.admit(t, 0, 1, 0, 100.0, k_empty));  // the permit drops at once
    rejected_seen = std::max(rejected_seen, ac.rejected(reject_reason::tenant_rate));
  }
  for (std::thread& th : edge) th.join();
  CHECK(edge_passed[0] + edge_passed[1] + admit_passed == 3000);
  CHECK(ac.rejected(reject_reason::tenant_rate) == 3 * k_attempts - 3000);
  CHECK(rejected_seen <= ac.rejected(reject_reason::tenant_rate));
}
