// The router's readiness and counters as the dispatcher publishes them (its actor, each tick) and
// the HTTP threads read and add to them (/ready, /metrics).
#pragma once

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
};

}  // namespace sy::router
