// The link actor: owns the worker's ZeroMQ ROUTER socket (routers connect to it) and the
// inproc PULL end of the engine's outbox. A blocking actor on its own thread — zmq::poll never
// runs inside a scheduled actor. Pure transport: frames in go to the engine actor as they are;
// frames out come from the outbox (the loop and its overflow rule: common/wire/link_loop.hpp).
//
// One exception to "pure transport": heartbeats. The engine writes them between steps, so a step
// longer than a router's heartbeat timeout (a long prefill of a big model on a loaded CPU) would
// make a busy worker look dead and its requests run again elsewhere. The link keeps the engine's
// last heartbeat to each router and repeats it while the engine is silent, for at most
// `engine_silence`: silence past that means a dead process or an engine stuck in one step.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <caf/actor.hpp>
#include <caf/blocking_actor.hpp>

#include "common/wire/link_loop.hpp"

namespace zmq {
class context_t;
}

namespace sy {

struct link_config {
  std::string listen;            // e.g. tcp://*:5555
  int high_water_mark = 10000;   // messages queued per peer, each direction
  int64_t max_frame_bytes = -1;  // ZMQ_MAXMSGSIZE: a bigger frame drops its connection; -1: none
  size_t max_backlog = 100000;   // frames waiting per router whose queue is full (common/wire/link_loop.hpp)
  // CURVE (common/wire/curve_keys.hpp): the worker's secret key as Z85; empty: no authentication.
  std::string curve_secret_z85;
  // Routers' public keys (Z85) admitted through a ZAP handler; empty: any router that knows
  // the worker's public key.
  std::set<std::string> curve_allowed_clients;
  // Repeat the engine's last heartbeat to a router once it is this old (the engine sends one
  // every 500 ms between steps) ...
  std::chrono::milliseconds heartbeat_repeat{750};
  // ... for at most this long after the engine's last one (0: never repeat).
  std::chrono::milliseconds engine_silence{60000};
};

struct link_counters {
  std::atomic<uint64_t> frames_in{0};
  std::atomic<uint64_t> frames_out{0};
  std::atomic<uint64_t> malformed_envelopes{0};  // not [identity][type][body]
  std::atomic<uint64_t> unreachable{0};          // sends to a peer that is gone
  std::atomic<uint64_t> hwm_blocked{0};          // sends refused by a full queue (retried)
  std::atomic<uint64_t> dropped{0};              // given up: backlog overflow, or a send that failed
  link::backlog_counters backlog;                // waited in the backlog; overflow: of `dropped`, the oldest
  std::atomic<uint64_t> auth_refused{0};         // CURVE handshakes whose key is not allowed (ZAP)
  std::atomic<uint64_t> heartbeats_repeated{0};  // sent by the link for an engine inside a long step
  std::atomic<bool> bound{false};                // the ROUTER socket is bound: routers can connect
};

// The counters as Prometheus text (switchyard_worker_link_*).
std::string render_link_metrics(const link_counters& c);

// Runs until *stop becomes true. Throws (ending the actor) if the socket cannot bind.
void link_actor(caf::blocking_actor* self, zmq::context_t* ctx, link_config cfg, caf::actor engine,
                std::shared_ptr<std::atomic<bool>> stop, std::shared_ptr<link_counters> counters);

}  // namespace sy
