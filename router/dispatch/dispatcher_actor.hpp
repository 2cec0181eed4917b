// The dispatcher actor: a thin shell (docs/engineering.md, "Actors are thin shells") over
// `dispatcher`, detached on its own thread because it owns a ZeroMQ socket (the PUSH end of the
// link's inbox). Each tick it publishes readiness and metrics for the HTTP threads.
#pragma once

#include <caf/event_based_actor.hpp>
#include <memory>

#include "router/dispatch/dispatcher.hpp"
#include "router/dispatch/router_status.hpp"

namespace zmq {
class context_t;
}

namespace sy::router {

caf::behavior dispatcher_actor(caf::event_based_actor* self, zmq::context_t* ctx, std::shared_ptr<dispatcher> d,
                               std::shared_ptr<router_status> status);

}  // namespace sy::router
