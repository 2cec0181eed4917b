// The engine actor: a thin CAF shell over worker_service (protocol + engine). Detached, so its
// step loop runs on its own thread and never blocks the shared scheduler. While there is work
// it sends itself step_atom after each step, so frames from routers interleave with steps at
// step granularity (a cancel takes effect at the next step). Replies go out through the outbox.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <caf/behavior.hpp>
#include <caf/stateful_actor.hpp>

#include "common/metrics.hpp"
#include "worker/service/worker_service.hpp"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace sy {

// What /metrics shows, copied out of the engine thread after every step and tick.
struct metrics_snapshot {
  engine_stats engine;
  service_counters service;
  histogram step_seconds{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  histogram batch_tokens{{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}};
  histogram batch_seqs{{1, 2, 4, 8, 16, 32, 64}};
  bool draining = false;
};

struct shared_metrics {
  std::mutex mu;
  metrics_snapshot snap;
};

struct engine_actor_state {
  std::unique_ptr<worker_service> service;
  std::unique_ptr<zmq::socket_t> outbox;  // created on the actor's own thread
  bool stepping = false;                  // a step_atom is in the mailbox
  std::vector<out_frame> out;
  metrics_snapshot local;  // histograms live here; copied to `shared`
  std::shared_ptr<shared_metrics> shared;
  static inline const char* name = "engine";
};

caf::behavior engine_actor(caf::stateful_actor<engine_actor_state>* self, zmq::context_t* ctx, engine* eng,
                           service_config cfg, std::shared_ptr<shared_metrics> metrics);

std::string render_metrics(const metrics_snapshot& m);

}  // namespace sy
