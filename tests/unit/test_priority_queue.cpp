// priority_queue: exact dispatch order (classes, aging, fair share, EDF, push_front), removal,
// counters and deadline expiry. Times are passed in; nothing sleeps.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "router/dispatch/priority_queue.hpp"

using namespace sy::router;

namespace {

constexpr int32_t k_interactive = -1, k_standard = 0, k_batch = 1;

queue_entry entry(uint64_t id, size_t tenant, int32_t priority, double enqueued_s, double deadline_s = 0,
                  int64_t tokens = 100) {
  queue_entry e;
  e.id = id;
  e.tenant = tenant;
  e.priority = priority;
  e.enqueued_s = enqueued_s;
  e.deadline_s = deadline_s;
  e.tokens = tokens;
  return e;
}

// Pops everything at now_s; the ids in pop order.
std::vector<uint64_t> drain(priority_queue& q, double now_s) {
  std::vector<uint64_t> ids;
  while (auto e = q.pop(now_s)) ids.push_back(e->id);
  return ids;
}

// Pops at most n entries at now_s; their ids in pop order.
std::vector<uint64_t> drain_n(priority_queue& q, double now_s, size_t n) {
  std::vector<uint64_t> ids;
  while (ids.size() < n) {
    auto e = q.pop(now_s);
    if (!e) break;
    ids.push_back(e->id);
  }
  return ids;
}

using ids = std::vector<uint64_t>;

}  // namespace

TEST_CASE("queue: an empty queue pops nothing", "[priority_queue]") {
  priority_queue q;
  CHECK(q.empty());
  CHECK(q.size() == 0);
  CHECK(q.peek(0) == nullptr);
  CHECK_FALSE(q.pop(0).has_value());
  CHECK(q.expired(1e9).empty());
}

TEST_CASE("queue: FIFO within a class and tenant", "[priority_queue]") {
  priority_queue q;
  q.push(entry(1, 0, k_standard, 0));
  q.push(entry(2, 0, k_standard, 1));
  q.push(entry(3, 0, k_standard, 2));
  q.push(entry(4, 0, k_standard, 2));  // same enqueue time: push order
  CHECK(drain(q, 3) == ids{1, 2, 3, 4});
  CHECK(q.empty());
}

TEST_CASE("queue: interactive before standard before batch", "[priority_queue]") {
  priority_queue q;
  q.push(entry(1, 0, k_batch, 0));
  q.push(entry(2, 0, k_standard, 0));
  q.push(entry(3, 0, k_interactive, 0));
  q.push(entry(4, 0, 7, 0));   // batch
  q.push(entry(5, 0, -9, 0));  // interactive
  q.push(entry(6, 0, k_standard, 0));
  CHECK(drain(q, 1) == ids{3, 5, 2, 6, 1, 4});
}

TEST_CASE("queue: aging promotes an old batch entry ahead of newer standard ones", "[priority_queue]") {
  priority_queue q(queue_config{10.0});
  q.push(entry(1, 0, k_batch, 0));
  q.push(entry(2, 0, k_standard, 5));
  q.push(entry(3, 0, k_standard, 6));

  CHECK(q.effective_class(priority_class::batch, 0, 9.9) == priority_class::batch);
  CHECK(q.effective_class(priority_class::batch, 0, 10) == priority_class::standard);
  CHECK(q.effective_class(priority_class::batch, 0, 20) == priority_class::interactive);
  CHECK(q.effective_class(priority_class::batch, 0, 1000) == priority_class::interactive);
  CHECK(q.effective_class(priority_class::interactive, 0, 1000) == priority_class::interactive);

  REQUIRE(q.peek(9.9) != nullptr);
  CHECK(q.peek(9.9)->id == 2);  // not yet aged
  REQUIRE(q.peek(10) != nullptr);
  CHECK(q.peek(10)->id == 1);  // promoted to standard and older than 2 and 3
  CHECK(drain(q, 10) == ids{1, 2, 3});
}

TEST_CASE("queue: two aging steps take batch past newer interactive entries", "[priority_queue]") {
  priority_queue q(queue_config{10.0});
  q.push(entry(1, 0, k_batch, 0));
  q.push(entry(2, 0, k_interactive, 15));
  q.push(entry(3, 0, k_standard, 12));
  REQUIRE(q.peek(19.5) != nullptr);
  CHECK(q.peek(19.5)->id == 2);  // batch is only standard yet
  // At t=20 the batch entry is interactive and the oldest; standard 3 has not aged yet.
  CHECK(drain(q, 20) == ids{1, 2, 3});
}

TEST_CASE("queue: aging disabled keeps classes strict", "[priority_queue]") {
  priority_queue q(queue_config{0});
  q.push(entry(1, 0, k_batch, 0));
  q.push(entry(2, 0, k_standard, 500));
  CHECK(drain(q, 1000) == ids{2, 1});
}

TEST_CASE("queue: a flooding tenant does not push another behind all its entries", "[priority_queue]") {
  priority_queue q;
  for (uint64_t i = 1; i <= 10; ++i) q.push(entry(i, 0, k_standard, 0));
  q.push(entry(101, 1, k_standard, 1));
  q.push(entry(102, 1, k_standard, 1));
  CHECK(drain(q, 2) == ids{1, 101, 2, 102, 3, 4, 5, 6, 7, 8, 9, 10});
}

TEST_CASE("queue: fair share is weighted by tokens", "[priority_queue]") {
  priority_queue q;
  for (uint64_t i = 1; i <= 3; ++i) q.push(entry(i, 0, k_standard, 0, 0, 300));
  for (uint64_t i = 101; i <= 105; ++i) q.push(entry(i, 1, k_standard, 0, 0, 100));
  CHECK(drain(q, 1) == ids{1, 101, 102, 103, 2, 104, 105, 3});
}

TEST_CASE("queue: a tenant returning from idle banks no credit", "[priority_queue]") {
  priority_queue q;
  for (uint64_t i = 1; i <= 6; ++i) q.push(entry(i, 0, k_standard, 0));
  CHECK(drain_n(q, 1, 4) == ids{1, 2, 3, 4});
  // Tenant 1 was idle while tenant 0 used 400 tokens; it starts level with tenant 0, not 400 behind.
  for (uint64_t i = 101; i <= 103; ++i) q.push(entry(i, 1, k_standard, 2));
  CHECK(drain(q, 3) == ids{5, 101, 6, 102, 103});
}

TEST_CASE("queue: fair share is per class", "[priority_queue]") {
  priority_queue q;
  // Tenant 0 is served 200 tokens of batch first; that does not count against its interactive share.
  for (uint64_t i = 1; i <= 3; ++i) q.push(entry(i, 0, k_batch, 0));
  CHECK(drain_n(q, 1, 2) == ids{1, 2});
  for (uint64_t i = 11; i <= 12; ++i) q.push(entry(i, 0, k_interactive, 1));
  for (uint64_t i = 21; i <= 22; ++i) q.push(entry(i, 1, k_interactive, 1));
  CHECK(drain(q, 2) == ids{11, 21, 12, 22, 3});
}

TEST_CASE("queue: earliest deadline first within a tenant, undated entries after, FIFO", "[priority_queue]") {
  priority_queue q;
  q.push(entry(1, 0, k_standard, 0));
  q.push(entry(2, 0, k_standard, 1, 50));
  q.push(entry(3, 0, k_standard, 2, 20));
  q.push(entry(4, 0, k_standard, 3));
  q.push(entry(5, 0, k_standard, 4, 20));
  CHECK(drain(q, 5) == ids{3, 5, 2, 1, 4});
}

TEST_CASE("queue: push_front puts a returning request ahead of its tenant's class", "[priority_queue]") {
  priority_queue q;
  q.push(entry(1, 0, k_standard, 0));
  q.push(entry(2, 0, k_standard, 1, 5));
  q.push(entry(3, 0, k_standard, 2));
  q.push(entry(9, 0, k_interactive, 3));
  auto first = q.pop(4);
  REQUIRE(first.has_value());
  CHECK(first->id == 9);
  auto second = q.pop(4);
  REQUIRE(second.has_value());
  CHECK(second->id == 2);  // earliest deadline

  // Its worker died before it started: back it goes, ahead of 1 and 3 (it keeps its deadline,
  // but push_front goes ahead of EDF order anyway).
  q.push_front(*second);
  q.push_front(entry(7, 0, k_standard, 0));  // a second returner: the most recent goes first
  q.push_front(entry(8, 0, k_batch, 0));     // a batch returner stays behind standard entries
  REQUIRE(q.peek(4) != nullptr);
  CHECK(q.peek(4)->id == 7);
  CHECK(drain(q, 4) == ids{7, 2, 1, 3, 8});
}

TEST_CASE("queue: a requeued entry keeps its enqueue time, so aging still counts", "[priority_queue]") {
  priority_queue q(queue_config{10.0});
  q.push(entry(1, 0, k_standard, 24));
  q.push_front(entry(2, 0, k_batch, 0));  // first queued at 0, back at 25
  CHECK(drain(q, 25) == ids{2, 1});       // batch aged twice: interactive
}

TEST_CASE("queue: remove a cancelled entry", "[priority_queue]") {
  priority_queue q;
  q.push(entry(1, 0, k_standard, 0, 0, 10));
  q.push(entry(2, 0, k_standard, 1, 30, 20));
  q.push(entry(3, 1, k_batch, 2, 0, 40));
  REQUIRE(q.find(2) != nullptr);
  CHECK(q.find(2)->tokens == 20);
  CHECK(q.remove(2));
  CHECK_FALSE(q.remove(2));
  CHECK_FALSE(q.remove(99));
  CHECK(q.find(2) == nullptr);
  CHECK(q.size() == 2);
  CHECK(q.tokens() == 50);
  CHECK(q.expired(100).empty());  // its deadline went with it
  CHECK(q.remove(3));
  CHECK(q.size(priority_class::batch) == 0);
  CHECK(drain(q, 3) == ids{1});
}

TEST_CASE("queue: sizes and tokens by class", "[priority_queue]") {
  priority_queue q(queue_config{10.0});
  q.push(entry(1, 0, k_interactive, 0, 0, 5));
  q.push(entry(2, 1, k_standard, 0, 0, 7));
  q.push(entry(3, 1, k_batch, 0, 0, 11));
  q.push(entry(4, 2, k_batch, 0, 0, 13));
  CHECK(q.size() == 4);
  CHECK_FALSE(q.empty());
  CHECK(q.tokens() == 36);
  CHECK(q.size(priority_class::interactive) == 1);
  CHECK(q.size(priority_class::standard) == 1);
  CHECK(q.size(priority_class::batch) == 2);

  // By original class, even when aging has promoted the entry.
  auto e = q.pop(100);
  REQUIRE(e.has_value());
  CHECK(q.size() == 3);
  CHECK(q.tokens() == 36 - e->tokens);
  CHECK(q.size(priority_class::interactive) + q.size(priority_class::standard) + q.size(priority_class::batch) == 3);
  drain(q, 100);
  CHECK(q.empty());
  CHECK(q.tokens() == 0);
  CHECK(q.size(priority_class::batch) == 0);
}

TEST_CASE("queue: peek shows what pop returns and changes nothing", "[priority_queue]") {
  priority_queue q;
  q.push(entry(1, 0, k_standard, 0));
  q.push(entry(2, 0, k_standard, 0));
  q.push(entry(3, 1, k_standard, 0));
  q.push(entry(4, 1, k_standard, 0));
  std::vector<uint64_t> peeked;
  for (int i = 0; i < 4; ++i) {
    const queue_entry* p = q.peek(1);
    REQUIRE(p != nullptr);
    const uint64_t id = p->id;
    REQUIRE(q.peek(1) != nullptr);
    CHECK(q.peek(1)->id == id);
    auto e = q.pop(1);
    REQUIRE(e.has_value());
    CHECK(e->id == id);
    peeked.push_back(id);
  }
  CHECK(peeked == ids{1, 3, 2, 4});
}

TEST_CASE("queue: expired lists entries whose deadline has passed, earliest first", "[priority_queue]") {
  priority_queue q;
  q.push(entry(1, 0, k_standard, 0, 10));
  q.push(entry(2, 0, k_standard, 0, 5));
  q.push(entry(3, 1, k_batch, 0));
  q.push(entry(4, 1, k_interactive, 0, 7));
  CHECK(q.expired(4).empty());
  CHECK(q.expired(5).empty());  // at the deadline is not past it
  CHECK(q.expired(7.5) == ids{2, 4});
  CHECK(q.expired(1e9) == ids{2, 4, 1});
  CHECK(q.size() == 4);  // expired() removes nothing
  for (uint64_t id : q.expired(7.5)) CHECK(q.remove(id));
  CHECK(drain(q, 8) == ids{1, 3});
}

TEST_CASE("queue: waited_too_long lists entries past their queue deadline, never a returning one", "[priority_queue]") {
  priority_queue q;
  auto with_queue_deadline = [](queue_entry e, double qd) {
    e.queue_deadline_s = qd;
    return e;
  };
  q.push(with_queue_deadline(entry(1, 0, k_standard, 0), 4));
  q.push(with_queue_deadline(entry(2, 0, k_standard, 1), 3));
  q.push(entry(3, 1, k_batch, 0));                                   // no queue timeout
  q.push_front(with_queue_deadline(entry(4, 1, k_standard, 0), 1));  // dispatched before: none
  q.push(with_queue_deadline(entry(5, 1, k_standard, 0, /*deadline_s=*/2), 9));
  CHECK(q.waited_too_long(3).empty());  // at the queue deadline is not past it
  CHECK(q.waited_too_long(3.5) == ids{2});
  CHECK(q.waited_too_long(1e9) == ids{2, 1, 5});
  CHECK(q.expired(2.5) == ids{5});  // the deadline is its own list
  CHECK(q.find(4)->queue_deadline_s == 0);
  CHECK(q.remove(2));
  CHECK(q.waited_too_long(1e9) == ids{1, 5});  // its queue deadline went with it
  CHECK(drain(q, 0).size() == 4);
  CHECK(q.waited_too_long(1e9).empty());  // popped entries take theirs along
}
