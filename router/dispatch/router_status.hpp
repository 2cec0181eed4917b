// The router's readiness and counters as the dispatcher publishes them (its actor, each tick) and
// the HTTP threads read and add to them (/ready, /metrics).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "common/metrics.hpp"

namespace sy::router {

// What the dispatcher publishes for the HTTP threads (each tick), and what they add.
struct router_status {
  std::mutex mu;
  std::string dispatcher_metrics;  // Prometheus text
  bool ready = false;              // the dispatcher's: some worker ready, not draining
  bool draining = false;           // the dispatcher refuses new requests (503)
  // SIGTERM received (main): /ready answers 503 at once, while requests are still admitted for
  // --shutdown-delay-s so that load balancers stop sending before the router stops accepting.
  bool shutting_down = false;
  size_t active = 0;
  size_t workers_ready = 0, workers_ejected = 0;  // for /ready's body (worker_pool.hpp states)
  // Token frame received -> bytes written to the client (observed on I/O threads).
  histogram write_overhead_s{{25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3}};
  // Request read -> validated and tokenized (observed on I/O threads).
  histogram parse_s{{25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3}};
  std::map<std::string, uint64_t> edge_errors;  // 4xx answered by this layer, by code
  // More Prometheus text (the ZeroMQ link's counters); set by main before the server starts,
  // never changed after, so it is read without the mutex.
  std::function<std::string()> link_metrics;

  // Fresh counters for /metrics: a scrape numbers its request, asks the dispatcher to publish
  // (request_publish, set by main before the servers start) and waits until a publication made
  // after its request (that one, or a tick's) has landed, so every event the dispatcher handled
  // before the scrape is in it. The tick publishes anyway; `limit` bounds the wait if the
  // dispatcher is gone (shutdown), and the last publication is answered then.
  std::function<void()> request_publish;
  uint64_t publish_requests = 0;   // guarded by mu, as are the next two
  uint64_t published_through = 0;  // the dispatcher's: requests numbered up to this one are served
  std::condition_variable published;
  // With lk holding mu.
  void await_publication(std::unique_lock<std::mutex>& lk, std::chrono::milliseconds limit) {
    if (!request_publish) return;
    const uint64_t mine = ++publish_requests;
    lk.unlock();
    request_publish();
    lk.lock();
    published.wait_for(lk, limit, [&] { return published_through >= mine; });
  }
};

}  // namespace sy::router
