// The router's side of the Redis response cache (docs/cache.md): a few threads, each owning one
// Redis connection (docs/engineering.md, "Blocking I/O on its own thread"; hiredis is blocking, so
// it never runs on an HTTP I/O thread or inside an actor), fed by bounded job queues. Lookups
// answer through a callback on the cache thread; stores and analytics events are fire-and-forget.
// When Redis is slow or down the client's tight timeouts and circuit breaker make every job return
// at once, and a full queue makes lookups bypass the cache: the cache is never on the critical path
// when sick. Lookups — a request waits on each — have a queue of their own that the threads serve
// first, and a lookup that waited longer than its budget (`lookup_max_wait`) is answered `expired`
// without asking Redis: the request is served live. Stores and analytics events are writes no
// request waits on: they run on a thread and connection of their own, with `store_timeout`, so a
// write slower than the lookup budget is neither lost for it nor counted against the lookups'
// circuit breaker, and never holds a lookup up.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cache/response_cache.hpp"
#include "common/metrics.hpp"

namespace sy::router {

struct cache_service_config {
  cache::redis_config redis;  // command_timeout: the lookup budget (a few ms)
  cache::cache_policy policy;
  cache::analytics_config analytics;
  int threads = 2;
  size_t max_queue = 4096;  // jobs waiting; beyond it lookups bypass and events are dropped
  // A lookup queued longer than this is not sent to Redis (expired); 0: 4 x redis.command_timeout.
  std::chrono::milliseconds lookup_max_wait{0};
  std::chrono::milliseconds query_timeout{2000};  // GET /v1/cache/stats (its own connection)
  std::chrono::milliseconds store_timeout{100};   // stores and analytics events (their own connection)
};

struct cache_event {
  cache::event_kind kind = cache::event_kind::miss;
  std::string tenant, model, prompt_hash;
  uint32_t tokens_saved = 0;
  double device_s_saved = 0, entry_age_s = 0;
  std::optional<std::string> preview;
};

class cache_service {
 public:
  using lookup_done = std::function<void(std::optional<cache::stored_response>, cache::lookup_status)>;

  explicit cache_service(cache_service_config cfg);
  ~cache_service();
  cache_service(const cache_service&) = delete;
  cache_service& operator=(const cache_service&) = delete;

  // Queues a lookup; `done` runs on a cache thread. False (and `done` never runs) when the
  // queue is full: the caller serves the request uncached.
  bool lookup(std::string key, lookup_done done);
  void store(std::string key, cache::stored_response r);
  void record(cache_event e);
  // Runs `j` on a cache thread with that thread's Redis connection: the response store's calls
  // (router/http/responses_store.hpp). `urgent`: in the lookups' queue (a request waits on it). False,
  // and `j` never runs, when the queue is full.
  bool submit(std::function<void(cache::redis_client&)> j, bool urgent);
  // Runs on the query connection's thread; `done` gets the stats (complete = false on errors).
  void query(int64_t from_unix_s, int64_t to_unix_s, size_t top_k, std::function<void(cache::cache_stats)> done);

  const cache::cache_policy& policy() const { return cfg_.policy; }
  const cache::analytics_config& analytics() const { return cfg_.analytics; }
  std::string render_metrics() const;

 private:
  using job = std::function<void(cache::response_cache&)>;
  struct lane {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<job> urgent;  // lookups: taken before any other job
    std::deque<job> jobs;
  };
  bool push(lane& l, job j, size_t cap, bool urgent = false);
  void run(lane& l, cache::response_cache& rc);

  cache_service_config cfg_;
  std::atomic<bool> stop_{false};
  lane work_, writes_, queries_;
  std::vector<std::thread> threads_;
  // One per thread (index-aligned): the work threads', then the writes', then the queries'.
  std::vector<std::unique_ptr<cache::response_cache>> conns_;

  // Metrics (any thread).
  std::atomic<uint64_t> by_status_[cache::k_n_lookup_statuses] = {};
  std::atomic<uint64_t> queue_full_{0}, stores_{0}, store_failures_{0}, events_{0}, events_dropped_{0};
  mutable std::mutex hist_mu_;
  histogram lookup_s_{{100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 50e-3}};
};

}  // namespace sy::router
