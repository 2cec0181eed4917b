// What the worker's link does with its frames, without sockets or actors: the plain class under
// worker/service/link_actor.cpp (docs/engineering.md, "Actors are thin shells"). The actor owns
// the ZeroMQ sockets and the backlog, passes each frame and the current time here, and sends
// what comes back.
//
// Frames from routers are [identity][type][body]: they go to the engine as they are, and
// anything else is answered with a protocol `error` (bad_message). Frames from the engine go to
// routers as they are, except that the link keeps the engine's last heartbeat to each router:
// the engine writes them between steps, so a step longer than a router's heartbeat timeout (a
// long prefill of a big model on a loaded CPU) would make a busy worker look dead and its
// requests run again elsewhere. While the engine is silent the link repeats them, for at most
// `engine_silence`: silence past that means a dead process or an engine stuck in one step.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/wire/link_loop.hpp"

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

// The frames an over-full backlog lane drops first (link_loop.hpp's overflow rule): heartbeats
// and KV events, of frames [router identity][type][body].
bool expendable_frame(const link::frame& f);

// The answer to one ZAP request (RFC 27: [version][request id][domain][address][identity]
// [mechanism][public key]): 200 for a CURVE client whose key is in `allowed`, else 400.
link::frame zap_reply(const link::frame& req, const std::set<std::string>& allowed, link_counters& counters);

class worker_link {
 public:
  using clock = std::chrono::steady_clock;

  // `now`: when the link starts (the engine counts as heard then).
  worker_link(const link_config& cfg, link_counters& counters, clock::time_point now);

  // A frame from a router. True: it is [identity][type][body], for the engine. False: it is not,
  // and `reply` is the error to send back to its sender.
  bool from_router(const link::frame& parts, link::frame& reply);
  // A frame from the engine, about to be sent to a router (a heartbeat is kept to repeat).
  void from_engine(const link::frame& parts, clock::time_point now);
  // The kept heartbeats to send again at `now`, while the engine is inside a long step (none
  // once it has been silent longer than engine_silence).
  std::vector<link::frame> heartbeats_due(clock::time_point now);
  // A router became unreachable: its heartbeat is no longer repeated.
  void router_gone(const std::string& identity);

  size_t kept_heartbeats() const { return heartbeats_.size(); }

 private:
  struct kept_heartbeat {
    link::frame frame;
    clock::time_point sent;  // when it (or its last repeat) went out
  };
  link_config cfg_;
  link_counters& counters_;
  std::map<std::string, kept_heartbeat> heartbeats_;  // by router identity
  clock::time_point engine_heard_;
};

}  // namespace sy
