#include "worker/link_actor.hpp"

#include <chrono>
#include <deque>
#include <optional>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/curve_keys.hpp"
#include "worker/actor_protocol.hpp"

namespace sy {
namespace {

// libzmq asks this endpoint (ZAP, RFC 27) whether a CURVE client may connect: one request per
// handshake, [version][request id][domain][address][identity][mechanism][public key]. A
// refused client's connection closes before any of its frames reaches the ROUTER socket.
constexpr const char* k_zap_endpoint = "inproc://zeromq.zap.01";

void answer_zap(zmq::socket_t& zap, const std::set<std::string>& allowed, link_counters& counters) {
  std::vector<zmq::message_t> req;
  if (!zmq::recv_multipart(zap, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
  const bool ok = req.size() >= 7 && req[5].to_string_view() == "CURVE" &&
                  allowed.count(curve::z85_of(req[6].data(), req[6].size())) != 0;
  if (!ok) counters.auth_refused++;
  std::vector<zmq::message_t> reply;
  reply.emplace_back(std::string("1.0"));
  reply.emplace_back(req.size() >= 2 ? req[1].to_string() : std::string());
  reply.emplace_back(std::string(ok ? "200" : "400"));
  reply.emplace_back(std::string(ok ? "OK" : "client key not allowed"));
  reply.emplace_back(std::string(ok ? "router" : ""));
  reply.emplace_back(std::string());
  zmq::send_multipart(zap, reply);
}

}  // namespace

void link_actor(caf::blocking_actor* self, zmq::context_t* ctx, link_config cfg, caf::actor engine,
                std::shared_ptr<std::atomic<bool>> stop, std::shared_ptr<link_counters> counters) {
  zmq::socket_t router(*ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::router_mandatory, 1);  // unroutable sends fail loudly, never vanish
  router.set(zmq::sockopt::sndhwm, cfg.high_water_mark);
  router.set(zmq::sockopt::rcvhwm, cfg.high_water_mark);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::maxmsgsize, cfg.max_frame_bytes);
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

  // Frames the ROUTER refused because a peer's queue was full; retried in order.
  std::deque<std::vector<zmq::message_t>> backlog;
  auto try_send = [&](std::vector<zmq::message_t>& parts) -> bool {
    try {
      if (!zmq::send_multipart(router, parts, zmq::send_flags::dontwait)) {
        counters->hwm_blocked++;
        return false;
      }
      counters->frames_out++;
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) {
        counters->unreachable++;
        self->send(engine, gone_atom::value, parts[0].to_string());
      } else {
        counters->dropped++;
      }
    }
    return true;
  };

  std::vector<zmq::message_t> parts;
  while (!stop->load()) {
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0},
                               {outbox.handle(), 0, ZMQ_POLLIN, 0},
                               {zap ? zap->handle() : nullptr, 0, ZMQ_POLLIN, 0}};
    if (!backlog.empty()) items[0].events |= ZMQ_POLLOUT;
    zmq::poll(items, zap ? 3 : 2, std::chrono::milliseconds(100));
    if (zap && (items[2].revents & ZMQ_POLLIN)) answer_zap(*zap, cfg.curve_allowed_clients, *counters);
    if (items[0].revents & ZMQ_POLLIN) {
      for (int burst = 0; burst < 256; ++burst) {
        parts.clear();
        if (!zmq::recv_multipart(router, std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
        counters->frames_in++;
        if (parts.size() != 3) {
          counters->malformed_envelopes++;
          std::vector<zmq::message_t> reply;
          reply.emplace_back(parts[0].data(), parts[0].size());
          reply.emplace_back(std::string("error"));
          // A valid msgpack error body, built by hand so the link needs no protocol code:
          // {"code": "bad_message", "message": "expected [type][body] frames"}
          static const unsigned char body[] = {
              0x82, 0xa4, 'c', 'o', 'd', 'e', 0xab, 'b',  'a', 'd', '_', 'm', 'e', 's', 's', 'a', 'g', 'e', 0xa7,
              'm',  'e',  's', 's', 'a', 'g', 'e',  0xbc, 'e', 'x', 'p', 'e', 'c', 't', 'e', 'd', ' ', '[', 't',
              'y',  'p',  'e', ']', '[', 'b', 'o',  'd',  'y', ']', ' ', 'f', 'r', 'a', 'm', 'e', 's'};
          reply.emplace_back(body, sizeof body);
          try_send(reply);
          continue;
        }
        self->send(engine, frame_atom::value, parts[0].to_string(), parts[1].to_string(), parts[2].to_string());
      }
    }
    while (!backlog.empty()) {
      if (!try_send(backlog.front())) break;
      backlog.pop_front();
    }
    if (items[1].revents & ZMQ_POLLIN) {
      for (int burst = 0; burst < 1024; ++burst) {
        parts.clear();
        if (!zmq::recv_multipart(outbox, std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
        if (!backlog.empty() || !try_send(parts)) {
          if (backlog.size() >= 100000) {
            counters->dropped++;
            continue;
          }
          backlog.push_back(std::move(parts));
          parts.clear();
        }
      }
    }
  }
}

}  // namespace sy
