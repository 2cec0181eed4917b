// The messages between the router's link actor and the dispatcher (the rest of the actors'
// messages: router/dispatch/actor_protocol.hpp).
//
//   link -> dispatcher         (frame_atom, worker_ref, type, body, int64 t_recv_ns)
// The dispatcher sends frames to workers through an inproc ZeroMQ PUSH socket the link polls
// (k_link_inbox): [worker_ref, 4 bytes little-endian][type][body].
#pragma once

#include <caf/atom.hpp>

#include "router/fleet/worker_ref.hpp"

namespace sy::router {

using frame_atom = caf::atom_constant<caf::atom("frame")>;

inline constexpr const char* k_link_inbox = "inproc://switchyard-router-link";

}  // namespace sy::router
