// The link actor: owns the worker's ZeroMQ ROUTER socket (routers connect to it) and the
// inproc PULL end of the engine's outbox. A blocking actor on its own thread — zmq::poll never
// runs inside a scheduled actor. A thin shell (docs/engineering.md, "Actors are thin shells")
// over worker_link (worker/service/worker_link.hpp: what becomes of each frame, and the
// heartbeats it repeats for an engine inside a long step) and the link loop
// (common/wire/link_loop.hpp: polling, the backlog and its overflow rule).
#pragma once

#include <atomic>
#include <memory>

#include <caf/actor.hpp>
#include <caf/blocking_actor.hpp>

#include "worker/service/worker_link.hpp"

namespace zmq {
class context_t;
}

namespace sy {

// Runs until *stop becomes true. Throws (ending the actor) if the socket cannot bind.
void link_actor(caf::blocking_actor* self, zmq::context_t* ctx, link_config cfg, caf::actor engine,
                std::shared_ptr<std::atomic<bool>> stop, std::shared_ptr<link_counters> counters);

}  // namespace sy
