#include "worker/service/worker_link.hpp"

#include "common/metrics.hpp"
#include "common/wire/curve_keys.hpp"
#include "common/wire/protocol.hpp"

namespace sy {
namespace {

link::frame copy_of(const link::frame& f) {
  link::frame c;
  for (const auto& part : f) c.emplace_back(part.data(), part.size());
  return c;
}

bool is_type(const link::frame& f, proto::msg_type t) {
  return f.size() == 3 && proto::parse_msg_type(f[1].to_string_view()) == t;
}

}  // namespace

bool expendable_frame(const link::frame& f) {
  if (f.size() < 2) return false;
  const auto t = proto::parse_msg_type(f[1].to_string_view());
  return t == proto::msg_type::heartbeat || t == proto::msg_type::kv_events;
}

link::frame zap_reply(const link::frame& req, const std::set<std::string>& allowed, link_counters& counters) {
  const bool ok = req.size() >= 7 && req[5].to_string_view() == "CURVE" &&
                  allowed.count(curve::z85_of(req[6].data(), req[6].size())) != 0;
  if (!ok) counters.auth_refused++;
  link::frame reply;
  reply.emplace_back(std::string("1.0"));
  reply.emplace_back(req.size() >= 2 ? req[1].to_string() : std::string());
  reply.emplace_back(std::string(ok ? "200" : "400"));
  reply.emplace_back(std::string(ok ? "OK" : "client key not allowed"));
  reply.emplace_back(std::string(ok ? "router" : ""));
  reply.emplace_back(std::string());
  return reply;
}

worker_link::worker_link(const link_config& cfg, link_counters& counters, clock::time_point now)
    : cfg_(cfg), counters_(counters), engine_heard_(now) {}

bool worker_link::from_router(const link::frame& parts, link::frame& reply) {
  counters_.frames_in++;
  if (parts.size() == 3) return true;
  counters_.malformed_envelopes++;
  reply.clear();
  reply.emplace_back(parts.empty() ? std::string() : parts[0].to_string());
  proto::error e;
  e.code = proto::error_code::bad_message;
  e.message = "expected [type][body] frames";
  reply.emplace_back(std::string(proto::name(proto::msg_type::error)));
  reply.emplace_back(proto::encode(e));
  return false;
}

void worker_link::from_engine(const link::frame& parts, clock::time_point now) {
  if (!is_type(parts, proto::msg_type::heartbeat)) return;
  engine_heard_ = now;
  heartbeats_[parts[0].to_string()] = {copy_of(parts), now};
}

std::vector<link::frame> worker_link::heartbeats_due(clock::time_point now) {
  std::vector<link::frame> due;
  if (cfg_.engine_silence.count() <= 0 || now - engine_heard_ < cfg_.heartbeat_repeat ||
      now - engine_heard_ > cfg_.engine_silence)
    return due;
  for (auto& [identity, kept] : heartbeats_) {
    if (now - kept.sent < cfg_.heartbeat_repeat) continue;
    due.push_back(copy_of(kept.frame));
    kept.sent = now;
    counters_.heartbeats_repeated++;
  }
  return due;
}

void worker_link::router_gone(const std::string& identity) { heartbeats_.erase(identity); }

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
