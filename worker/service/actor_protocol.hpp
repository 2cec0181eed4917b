// The messages between the worker's actors, declared once (docs/engineering.md, "Declared
// once"). Only atoms and strings travel, so no custom type needs registering with CAF.
//
//   link -> engine   (frame_atom, peer, type, body)   a frame from a router
//   link -> engine   (gone_atom, peer)                a router became unreachable
//   engine -> self   (step_atom)                      run one engine step (re-sent while busy)
//   engine -> self   (tick_atom)                      heartbeats + metrics snapshot, every 500 ms
//   anyone -> engine (drain_atom)                     stop accepting, finish what runs
// The engine answers routers through an inproc ZeroMQ PUSH socket the link polls
// (k_outbox_endpoint): [peer][type][body].
#pragma once

#include <caf/atom.hpp>

namespace sy {

using frame_atom = caf::atom_constant<caf::atom("frame")>;
using gone_atom = caf::atom_constant<caf::atom("gone")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;

inline constexpr const char* k_outbox_endpoint = "inproc://switchyard-worker-outbox";

}  // namespace sy
