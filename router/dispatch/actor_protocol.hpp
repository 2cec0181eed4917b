// The messages between the router's actors, declared once (docs/engineering.md, "Declared once").
//
//   http thread -> dispatcher  (submit_atom, shared_ptr<routed_request>)  a validated request
//   http thread -> dispatcher  (gone_atom, uint64 id)                      its client went away
//   link -> dispatcher         (frame_atom, worker_ref, type, body, int64 t_recv_ns)
//   main -> dispatcher         (add_atom, endpoint) / (retire_atom, endpoint)  listed / no longer
//   main -> dispatcher         (drain_atom)                                stop admitting
//   http thread -> dispatcher  (publish_atom)                              publish counters now (/metrics)
//   dispatcher -> self         (tick_atom)                                 every 100 ms
// The link's half (frame_atom, k_link_inbox) is router/fleet/link_protocol.hpp.
#pragma once

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <memory>

#include "router/dispatch/routed_request.hpp"
#include "router/fleet/link_protocol.hpp"

namespace sy::router {

using submit_atom = caf::atom_constant<caf::atom("submit")>;
using gone_atom = caf::atom_constant<caf::atom("gone")>;
using add_atom = caf::atom_constant<caf::atom("add")>;
using retire_atom = caf::atom_constant<caf::atom("retire")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using publish_atom = caf::atom_constant<caf::atom("publish")>;

}  // namespace sy::router

// Local-only message (never serialized): the request travels between threads of one process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<sy::router::routed_request>)
