// The router's ZeroMQ side: one DEALER socket per worker (routers connect, workers bind),
// owned by this blocking actor on its own thread (docs/engineering.md, "Blocking I/O on its own
// thread"). Frames from workers go to the dispatcher; frames for workers come from the
// dispatcher through the inproc inbox.
//
// Sockets are keyed by worker ref ("_connect" opens one, "_close" closes it: only this thread
// touches them, so the dispatcher asks by message). They use ZMQ_IMMEDIATE (nothing is queued
// for a worker that is not connected) and a bounded high-water mark; a frame the socket refuses
// waits in a per-worker backlog and is retried when the socket can take it (the loop and its
// overflow rule, drop-oldest and counted: common/wire/link_loop.hpp). "_flush" empties a worker's backlog (it was
// declared dead).
#pragma once

#include <atomic>
#include <caf/blocking_actor.hpp>
#include <memory>
#include <string>

#include "common/wire/curve_keys.hpp"
#include "common/wire/link_loop.hpp"
#include "router/fleet/worker_ref.hpp"

namespace zmq {
class context_t;
}

namespace sy::router {

struct link_counters {
  std::atomic<uint64_t> frames_in{0};
  std::atomic<uint64_t> frames_out{0};
  std::atomic<uint64_t> dropped{0};  // given up (backlog overflow, flushed, or for a closed worker)
  link::backlog_counters backlog;    // sends that had to wait; overflow: of `dropped`, the oldest of a full backlog
  std::atomic<uint64_t> closed{0};   // worker connections closed ("_close")
};

struct link_config {
  int high_water_mark = 10000;
  size_t max_backlog = 100000;   // frames per worker waiting for its socket (common/wire/link_loop.hpp's rule)
  int64_t max_frame_bytes = -1;  // ZMQ_MAXMSGSIZE: a bigger frame drops its connection; -1: none
  // CURVE (common/wire/curve_keys.hpp): the workers' public key as Z85; empty: no authentication.
  std::string curve_server_public_z85;
  curve::key_pair curve_own;  // this router's pair (from --curve-secret-key, or made at start)
};

void link_actor(caf::blocking_actor* self, zmq::context_t* ctx, link_config cfg, caf::actor dispatcher,
                std::shared_ptr<std::atomic<bool>> stop, std::shared_ptr<link_counters> counters);

// The counters as Prometheus text (switchyard_router_link_*).
std::string render_link_metrics(const link_counters& c);

}  // namespace sy::router
