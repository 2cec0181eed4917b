#include "worker/service/link_actor.hpp"

#include <chrono>
#include <optional>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/wire/curve_keys.hpp"
#include "common/wire/link_loop.hpp"
#include "worker/service/actor_protocol.hpp"

namespace sy {
namespace {

// libzmq asks this endpoint (ZAP, RFC 27) whether a CURVE client may connect: one request per
// handshake. A refused client's connection closes before any of its frames reaches the ROUTER
// socket.
constexpr const char* k_zap_endpoint = "inproc://zeromq.zap.01";

}  // namespace

void link_actor(caf::blocking_actor* self, zmq::context_t* ctx, link_config cfg, caf::actor engine,
                std::shared_ptr<std::atomic<bool>> stop, std::shared_ptr<link_counters> counters) {
  zmq::socket_t router(*ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::router_mandatory, 1);  // unroutable sends fail loudly, never vanish
  router.set(zmq::sockopt::sndhwm, cfg.high_water_mark);
  router.set(zmq::sockopt::rcvhwm, cfg.high_water_mark);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::maxmsgsize, cfg.max_frame_bytes);
  link::set_keepalive(router);
  std::optional<zmq::socket_t> zap;  // bound before the ROUTER socket: no handshake goes unasked
  if (!cfg.curve_secret_z85.empty()) {
    if (!cfg.curve_allowed_clients.empty()) {
      zap.emplace(*ctx, zmq::socket_type::rep);
      zap->set(zmq::sockopt::linger, 0);
      zap->bind(k_zap_endpoint);
    }
    curve::make_server(router.handle(), cfg.curve_secret_z85);
  }
  router.bind(cfg.listen);
  counters->bound = true;
  zmq::socket_t outbox(*ctx, zmq::socket_type::pull);
  outbox.set(zmq::sockopt::linger, 0);
  outbox.bind(k_outbox_endpoint);

  worker_link state(cfg, *counters, std::chrono::steady_clock::now());
  // Frames the ROUTER refused because a peer's queue was full; retried in order, a lane per
  // router: one that stopped reading (paused, throttled) holds back only its own frames.
  link::send_backlog backlog(cfg.max_backlog, /*lane_per_peer=*/true, expendable_frame);
  const link::send_fn try_send = [&](link::frame& parts) -> bool {
    try {
      if (!zmq::send_multipart(router, parts, zmq::send_flags::dontwait)) {
        counters->hwm_blocked++;
        return false;
      }
      counters->frames_out++;
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) {
        counters->unreachable++;
        state.router_gone(parts[0].to_string());
        self->send(engine, gone_atom::value, parts[0].to_string());
      } else {
        counters->dropped++;
      }
    }
    return true;
  };
  const auto send = [&](link::frame&& f) {
    counters->dropped += backlog.send_or_queue(std::move(f), try_send, counters->backlog);
  };
  const auto from_router = [&](link::frame& parts) {
    link::frame reply;
    if (state.from_router(parts, reply)) {
      self->send(engine, frame_atom::value, parts[0].to_string(), parts[1].to_string(), parts[2].to_string());
    } else {
      try_send(reply);
    }
  };
  const auto from_engine = [&](link::frame& parts) {
    state.from_engine(parts, std::chrono::steady_clock::now());
    send(std::move(parts));
  };

  std::vector<link::poll_source> sources;
  if (zap)
    sources.push_back({zap->handle(), 1,
                       [&](link::frame& req) {
                         auto reply = zap_reply(req, cfg.curve_allowed_clients, *counters);
                         zmq::send_multipart(*zap, reply);
                       },
                       nullptr, nullptr});
  sources.push_back({router.handle(), 256, from_router, &backlog, try_send});
  sources.push_back({outbox.handle(), 1024, from_engine, nullptr, nullptr});
  while (!stop->load()) {
    link::poll_once(sources, std::chrono::milliseconds(100), std::chrono::milliseconds(100));
    for (auto& hb : state.heartbeats_due(std::chrono::steady_clock::now())) send(std::move(hb));
  }
}

}  // namespace sy
