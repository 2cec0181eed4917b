#include "worker/service/link_actor.hpp"

#include <chrono>
#include <optional>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/metrics.hpp"
#include "common/wire/curve_keys.hpp"
#include "common/wire/link_loop.hpp"
#include "common/wire/protocol.hpp"
#include "worker/service/actor_protocol.hpp"

namespace sy {
namespace {

// libzmq asks this endpoint (ZAP, RFC 27) whether a CURVE client may connect: one request per
// handshake, [version][request id][domain][address][identity][mechanism][public key]. A
// refused client's connection closes before any of its frames reaches the ROUTER socket.
constexpr const char* k_zap_endpoint = "inproc://zeromq.zap.01";

void answer_zap(zmq::socket_t& zap, const link::frame& req, const std::set<std::string>& allowed,
                link_counters& counters) {
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

  // Frames the ROUTER refused because a peer's queue was full; retried in order, a lane per
  // router: one that stopped reading (paused, throttled) holds back only its own frames.
  // Over-full, a lane drops heartbeats and KV events first (link_loop.hpp: the overflow rule):
  // frames here are [router identity][type][body].
  const auto expendable = [](const link::frame& f) {
    if (f.size() < 2) return false;
    const auto t = proto::parse_msg_type(f[1].to_string_view());
    return t == proto::msg_type::heartbeat || t == proto::msg_type::kv_events;
  };
  link::send_backlog backlog(cfg.max_backlog, /*lane_per_peer=*/true, expendable);
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
        self->send(engine, gone_atom::value, parts[0].to_string());
      } else {
        counters->dropped++;
      }
    }
    return true;
  };
  // [identity][type][body] from a router to the engine; anything else is answered with an error.
  const auto from_router = [&](link::frame& parts) {
    counters->frames_in++;
    if (parts.size() == 3) {
      self->send(engine, frame_atom::value, parts[0].to_string(), parts[1].to_string(), parts[2].to_string());
      return;
    }
    counters->malformed_envelopes++;
    link::frame reply;
    reply.emplace_back(parts[0].data(), parts[0].size());
    reply.emplace_back(std::string("error"));
    // A valid msgpack error body, built by hand so the link needs no protocol code:
    // {"code": "bad_message", "message": "expected [type][body] frames"}
    static const unsigned char body[] = {0x82, 0xa4, 'c', 'o', 'd',  'e', 0xab, 'b', 'a', 'd', '_', 'm', 'e',  's',
                                         's',  'a',  'g', 'e', 0xa7, 'm', 'e',  's', 's', 'a', 'g', 'e', 0xbc, 'e',
                                         'x',  'p',  'e', 'c', 't',  'e', 'd',  ' ', '[', 't', 'y', 'p', 'e',  ']',
                                         '[',  'b',  'o', 'd', 'y',  ']', ' ',  'f', 'r', 'a', 'm', 'e', 's'};
    reply.emplace_back(body, sizeof body);
    try_send(reply);
  };
  // The engine's last heartbeat to each router, and when it (or a repeat) went out.
  struct kept_heartbeat {
    link::frame frame;
    std::chrono::steady_clock::time_point sent;
  };
  std::map<std::string, kept_heartbeat> heartbeats;  // by router identity
  auto engine_heard = std::chrono::steady_clock::now();
  const auto copy_of = [](const link::frame& f) {
    link::frame c;
    for (const auto& part : f) c.emplace_back(part.data(), part.size());
    return c;
  };
  // [identity][type][body] from the engine to a router.
  const auto from_engine = [&](link::frame& parts) {
    if (parts.size() == 3 && parts[1].to_string_view() == "heartbeat") {
      const auto now = std::chrono::steady_clock::now();
      engine_heard = now;
      heartbeats[parts[0].to_string()] = {copy_of(parts), now};
    }
    counters->dropped += backlog.send_or_queue(std::move(parts), try_send, counters->backlog);
  };
  // While the engine is inside a long step: its last heartbeats again (see link_actor.hpp).
  const auto cover_for_engine = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (cfg.engine_silence.count() <= 0 || now - engine_heard < cfg.heartbeat_repeat ||
        now - engine_heard > cfg.engine_silence)
      return;
    for (auto it = heartbeats.begin(); it != heartbeats.end();) {
      if (now - it->second.sent < cfg.heartbeat_repeat) {
        ++it;
        continue;
      }
      const uint64_t gone_before = counters->unreachable.load();
      link::frame again = copy_of(it->second.frame);
      counters->dropped += backlog.send_or_queue(std::move(again), try_send, counters->backlog);
      counters->heartbeats_repeated++;
      it->second.sent = now;
      if (counters->unreachable.load() != gone_before) {
        it = heartbeats.erase(it);  // that router is gone
      } else {
        ++it;
      }
    }
  };

  std::vector<link::poll_source> sources;
  if (zap)
    sources.push_back({zap->handle(), 1,
                       [&](link::frame& req) { answer_zap(*zap, req, cfg.curve_allowed_clients, *counters); }, nullptr,
                       nullptr});
  sources.push_back({router.handle(), 256, from_router, &backlog, try_send});
  sources.push_back({outbox.handle(), 1024, from_engine, nullptr, nullptr});
  while (!stop->load()) {
    link::poll_once(sources, std::chrono::milliseconds(100), std::chrono::milliseconds(100));
    cover_for_engine();
  }
}

std::string render_link_metrics(const link_counters& c) {
  std::string out;
  counter(out, "switchyard_worker_link_frames_in_total", "Frames received from routers.", c.frames_in);
  counter(out, "switchyard_worker_link_frames_out_total", "Frames sent to routers.", c.frames_out);
  counter(out, "switchyard_worker_link_unreachable_total",
          "Sends to a router that is gone (its requests are cancelled).", c.unreachable);
  counter(out, "switchyard_worker_link_hwm_blocked_total",
          "Sends refused by a full peer queue (high-water mark), retried.", c.hwm_blocked);
  counter(out, "switchyard_worker_link_backlogged_total",
          "Frames for routers that had to wait in the link's backlog (a full peer queue), retried.",
          c.backlog.backlogged);
  counter(out, "switchyard_worker_link_dropped_total",
          "Frames for routers given up: backlog overflow, or a send that failed for good.", c.dropped);
  counter(out, "switchyard_worker_link_backlog_overflow_total",
          "Of the dropped frames: the oldest of a full backlog (--link-backlog; its request ends at its deadline).",
          c.backlog.overflow);
  counter(out, "switchyard_worker_link_malformed_envelopes_total", "Frames that were not [type][body].",
          c.malformed_envelopes);
  counter(out, "switchyard_worker_link_auth_refused_total",
          "CURVE handshakes refused: the router's key is not in --curve-allowed-clients.", c.auth_refused);
  counter(out, "switchyard_worker_link_heartbeats_repeated_total",
          "Heartbeats the link repeated while the engine was inside a long step (--engine-silence-s).",
          c.heartbeats_repeated);
  return out;
}

}  // namespace sy
