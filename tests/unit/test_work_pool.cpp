// The HTTP edge's prep pool (router/http/work_pool.hpp): every accepted job runs, a full backlog
// refuses at once, stop() runs what was accepted.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "router/http/work_pool.hpp"

using namespace std::chrono_literals;
using sy::router::work_pool;
using sy::router::work_pool_config;

namespace {

// A latch the jobs wait on, opened by the test.
struct gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

template <class Pred>
bool eventually(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace

TEST_CASE("work_pool: every accepted job runs, on the pool's threads") {
  std::atomic<int> ran{0};
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> on_caller{false};
  {
    work_pool pool({3, 1000, 1u << 30});
    CHECK(pool.threads() == 3);
    for (int i = 0; i < 500; ++i)
      REQUIRE(pool.try_post(10, [&] {
        if (std::this_thread::get_id() == caller) on_caller = true;
        ++ran;
      }));
  }  // the destructor runs what is queued
  CHECK(ran.load() == 500);
  CHECK_FALSE(on_caller.load());
}

TEST_CASE("work_pool: a full backlog refuses at once, and takes jobs again once it drains") {
  gate g;
  std::atomic<int> ran{0};
  work_pool pool({1, 2, 1u << 30});
  REQUIRE(pool.try_post(1, [&] {
    g.wait();
    ++ran;
  }));
  REQUIRE(eventually([&] { return pool.running() == 1; }));
  CHECK(pool.try_post(1, [&] { ++ran; }));
  CHECK(pool.try_post(1, [&] { ++ran; }));
  CHECK(pool.waiting() == 2);
  CHECK_FALSE(pool.try_post(1, [&] { ++ran; }));  // two waiting: no room for a third
  CHECK(pool.refused() == 1);
  g.release();
  REQUIRE(eventually([&] { return ran.load() == 3; }));
  CHECK(pool.try_post(1, [&] { ++ran; }));
  REQUIRE(eventually([&] { return ran.load() == 4; }));
}

TEST_CASE("work_pool: the byte budget counts bodies waiting and running, and one big body fits an idle pool") {
  gate g;
  std::atomic<int> ran{0};
  work_pool pool({1, 100, 1000});
  REQUIRE(pool.try_post(600, [&] {
    g.wait();
    ++ran;
  }));
  REQUIRE(eventually([&] { return pool.running() == 1; }));
  CHECK_FALSE(pool.try_post(500, [&] { ++ran; }));  // 600 running + 500 > 1000
  CHECK(pool.try_post(400, [&] { ++ran; }));
  CHECK_FALSE(pool.try_post(1, [&] { ++ran; }));
  g.release();
  REQUIRE(eventually([&] { return ran.load() == 2 && pool.running() == 0; }));
  CHECK(pool.try_post(5000, [&] { ++ran; }));  // larger than the budget, into an idle pool
  REQUIRE(eventually([&] { return ran.load() == 3; }));
  CHECK(pool.refused() == 2);
}

TEST_CASE("work_pool: a job that throws is counted and the pool goes on") {
  std::atomic<int> ran{0};
  work_pool pool({2, 10, 1u << 20});
  REQUIRE(pool.try_post(1, [] { throw std::runtime_error("boom"); }));
  REQUIRE(pool.try_post(1, [&] { ++ran; }));
  REQUIRE(eventually([&] { return ran.load() == 1 && pool.failed() == 1; }));
}

TEST_CASE("work_pool: stop runs what was accepted, then refuses") {
  gate g;
  std::atomic<int> ran{0};
  work_pool pool({1, 10, 1u << 20});
  REQUIRE(pool.try_post(1, [&] {
    g.wait();
    ++ran;
  }));
  for (int i = 0; i < 5; ++i) REQUIRE(pool.try_post(1, [&] { ++ran; }));
  std::thread stopper([&] { pool.stop(); });
  std::this_thread::sleep_for(20ms);
  g.release();
  stopper.join();
  CHECK(ran.load() == 6);
  CHECK_FALSE(pool.try_post(1, [&] { ++ran; }));
  pool.stop();  // idempotent
}
