#include "router/fleet/link_actor.hpp"

#include <caf/all.hpp>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/metrics.hpp"
#include "common/wire/link_loop.hpp"
#include "router/fleet/link_protocol.hpp"

namespace sy::router {

namespace {

// This thread's sockets: one DEALER per worker, keyed by its ref.
struct peer {
  zmq::socket_t sock;
  link::send_backlog backlog;
};

zmq::socket_t open_peer(zmq::context_t& ctx, const link_config& cfg, const std::string& endpoint) {
  zmq::socket_t sock(ctx, zmq::socket_type::dealer);
  sock.set(zmq::sockopt::immediate, 1);
  sock.set(zmq::sockopt::sndhwm, cfg.high_water_mark);
  sock.set(zmq::sockopt::rcvhwm, cfg.high_water_mark);
  sock.set(zmq::sockopt::linger, 0);
  sock.set(zmq::sockopt::reconnect_ivl, 100);
  sock.set(zmq::sockopt::reconnect_ivl_max, 2000);
  sock.set(zmq::sockopt::maxmsgsize, cfg.max_frame_bytes);
  link::set_keepalive(sock);
  if (!cfg.curve_server_public_z85.empty())
    curve::make_client(sock.handle(), cfg.curve_own, cfg.curve_server_public_z85);
  sock.connect(endpoint);
  return sock;
}

}  // namespace

void link_actor(caf::blocking_actor* self, zmq::context_t* ctx, link_config cfg, caf::actor dispatcher,
                std::shared_ptr<std::atomic<bool>> stop, std::shared_ptr<link_counters> counters) {
  zmq::socket_t inbox(*ctx, zmq::socket_type::pull);
  inbox.set(zmq::sockopt::linger, 0);
  inbox.bind(k_link_inbox);
  std::map<worker_ref, peer> peers;  // this thread only; a peer's socket closes when it is erased

  const auto send_to = [&counters](peer& p) {
    return [&p, &counters](link::frame& parts) -> bool {
      try {
        if (!zmq::send_multipart(p.sock, parts, zmq::send_flags::dontwait)) return false;
        counters->frames_out++;
      } catch (const zmq::error_t&) {
        counters->dropped++;
      }
      return true;
    };
  };
  // A frame from worker w: [type][body] to the dispatcher, stamped with its arrival.
  const auto from_worker = [&](worker_ref w, link::frame& parts) {
    counters->frames_in++;
    if (parts.size() != 2) return;  // not [type][body]: the dispatcher could not use it
    const int64_t t_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    self->send(dispatcher, frame_atom::value, w, parts[0].to_string(), parts[1].to_string(), t_ns);
  };
  // A frame from the dispatcher: [worker ref][type][body], or a control type for this thread.
  const auto from_dispatcher = [&](link::frame& parts) {
    if (parts.size() != 3 || parts[0].size() != 4) return;
    worker_ref w = 0;
    std::memcpy(&w, parts[0].data(), 4);
    const std::string type = parts[1].to_string();
    if (type == "_connect") {
      if (peers.count(w)) return;  // refs are never reused: a second connect is a mistake
      peers.emplace(w, peer{open_peer(*ctx, cfg, parts[2].to_string()), link::send_backlog(cfg.max_backlog)});
      return;
    }
    auto it = peers.find(w);
    if (it == peers.end()) {  // closed (or never opened): nothing can reach that worker
      counters->dropped++;
      return;
    }
    peer& p = it->second;
    if (type == "_flush" || type == "_close") {
      counters->dropped += p.backlog.clear();
      if (type == "_close") {
        peers.erase(it);  // closes the socket (linger 0) and its connection to the worker
        counters->closed++;
      }
      return;
    }
    link::frame out;
    out.push_back(std::move(parts[1]));
    out.push_back(std::move(parts[2]));
    counters->dropped += p.backlog.send_or_queue(std::move(out), send_to(p), counters->backlog);
  };

  std::vector<link::poll_source> sources;
  while (!stop->load()) {
    sources.clear();
    for (auto& [w, p] : peers)
      sources.push_back(
          {p.sock.handle(), 256, [&, w = w](link::frame& f) { from_worker(w, f); }, &p.backlog, send_to(p)});
    // The inbox last: its frames may open or close peers, which no later source of this turn sees.
    sources.push_back({inbox.handle(), 1024, from_dispatcher, nullptr, nullptr});
    // With backlogs a short timeout also retries sends that ZMQ_IMMEDIATE refused.
    link::poll_once(sources, std::chrono::milliseconds(100), std::chrono::milliseconds(10));
  }
}

std::string render_link_metrics(const link_counters& c) {
  std::string out;
  counter(out, "switchyard_router_link_frames_in_total", "Frames received from workers.", c.frames_in);
  counter(out, "switchyard_router_link_frames_out_total", "Frames sent to workers.", c.frames_out);
  counter(out, "switchyard_router_link_backlogged_total",
          "Sends a worker's socket could not take at once (queued in the router's backlog, retried).",
          c.backlog.backlogged);
  counter(out, "switchyard_router_link_dropped_total",
          "Frames for workers given up: backlog overflow, flushed for a dead worker, or for a closed worker.",
          c.dropped);
  counter(out, "switchyard_router_link_backlog_overflow_total",
          "Of the dropped frames: the oldest of a full per-worker backlog (its request ends at its deadline).",
          c.backlog.overflow);
  counter(out, "switchyard_router_link_closed_total", "Worker connections closed (worker retired or removed).",
          c.closed);
  return out;
}

}  // namespace sy::router
