#include "router/link_actor.hpp"

#include <caf/all.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/metrics.hpp"
#include "router/actor_protocol.hpp"

namespace sy::router {

void link_actor(caf::blocking_actor* self, zmq::context_t* ctx, link_config cfg, caf::actor dispatcher,
                std::shared_ptr<std::atomic<bool>> stop, std::shared_ptr<link_counters> counters) {
  zmq::socket_t inbox(*ctx, zmq::socket_type::pull);
  inbox.set(zmq::sockopt::linger, 0);
  inbox.bind(k_link_inbox);

  struct peer {
    zmq::socket_t sock;
    std::deque<std::vector<zmq::message_t>> backlog;
  };
  std::map<worker_ref, peer> peers;  // this thread only; a peer's socket closes when it is erased
  std::vector<zmq::pollitem_t> items;
  std::vector<worker_ref> polled;  // items[i + 1] is peers[polled[i]]

  auto try_send = [&](peer& p, std::vector<zmq::message_t>& parts) -> bool {
    try {
      if (!zmq::send_multipart(p.sock, parts, zmq::send_flags::dontwait)) return false;
      counters->frames_out++;
    } catch (const zmq::error_t&) {
      counters->dropped++;
    }
    return true;
  };

  std::vector<zmq::message_t> parts;
  while (!stop->load()) {
    items.clear();
    polled.clear();
    items.push_back({inbox.handle(), 0, ZMQ_POLLIN, 0});
    bool any_backlog = false;
    for (auto& [w, p] : peers) {
      short ev = ZMQ_POLLIN;
      if (!p.backlog.empty()) ev |= ZMQ_POLLOUT;
      any_backlog |= !p.backlog.empty();
      items.push_back({p.sock.handle(), 0, ev, 0});
      polled.push_back(w);
    }
    // With backlogs a short timeout also retries sends that ZMQ_IMMEDIATE refused.
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(any_backlog ? 10 : 100));

    for (size_t i = 0; i < polled.size(); ++i) {
      const worker_ref w = polled[i];
      peer& p = peers.at(w);
      if (items[i + 1].revents & ZMQ_POLLIN) {
        for (int burst = 0; burst < 256; ++burst) {
          parts.clear();
          if (!zmq::recv_multipart(p.sock, std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
          counters->frames_in++;
          if (parts.size() != 2) continue;  // not [type][body]: the dispatcher could not use it
          const int64_t t_ns =
              std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
                  .count();
          self->send(dispatcher, frame_atom::value, w, parts[0].to_string(), parts[1].to_string(), t_ns);
        }
      }
      while (!p.backlog.empty() && try_send(p, p.backlog.front())) p.backlog.pop_front();
    }

    if (items[0].revents & ZMQ_POLLIN) {
      for (int burst = 0; burst < 1024; ++burst) {
        parts.clear();
        if (!zmq::recv_multipart(inbox, std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
        if (parts.size() != 3 || parts[0].size() != 4) continue;
        worker_ref w = 0;
        std::memcpy(&w, parts[0].data(), 4);
        const std::string type = parts[1].to_string();
        if (type == "_connect") {
          if (peers.count(w)) continue;  // refs are never reused: a second connect is a mistake
          peer p{zmq::socket_t(*ctx, zmq::socket_type::dealer), {}};
          p.sock.set(zmq::sockopt::immediate, 1);
          p.sock.set(zmq::sockopt::sndhwm, cfg.high_water_mark);
          p.sock.set(zmq::sockopt::rcvhwm, cfg.high_water_mark);
          p.sock.set(zmq::sockopt::linger, 0);
          p.sock.set(zmq::sockopt::reconnect_ivl, 100);
          p.sock.set(zmq::sockopt::reconnect_ivl_max, 2000);
          p.sock.set(zmq::sockopt::maxmsgsize, cfg.max_frame_bytes);
          if (!cfg.curve_server_public_z85.empty())
            curve::make_client(p.sock.handle(), cfg.curve_own, cfg.curve_server_public_z85);
          p.sock.connect(parts[2].to_string());
          peers.emplace(w, std::move(p));
          continue;
        }
        auto it = peers.find(w);
        if (it == peers.end()) {  // closed (or never opened): nothing can reach that worker
          counters->dropped++;
          continue;
        }
        peer& p = it->second;
        if (type == "_flush" || type == "_close") {
          counters->dropped += p.backlog.size();
          p.backlog.clear();
          if (type == "_close") {
            peers.erase(it);  // closes the socket (linger 0) and its connection to the worker
            counters->closed++;
          }
          continue;
        }
        std::vector<zmq::message_t> out;
        out.push_back(std::move(parts[1]));
        out.push_back(std::move(parts[2]));
        if (!p.backlog.empty() || !try_send(p, out)) {
          counters->backlogged++;
          p.backlog.push_back(std::move(out));
          if (p.backlog.size() > cfg.max_backlog) {
            p.backlog.pop_front();
            counters->dropped++;
            counters->backlog_overflow++;
          }
        }
      }
    }
  }
}

std::string render_link_metrics(const link_counters& c) {
  std::string out;
  const auto put = [&out](const char* name, const char* help, const std::atomic<uint64_t>& v) {
    metric(out, name, "counter", help, static_cast<double>(v.load()));
  };
  put("switchyard_router_link_frames_in_total", "Frames received from workers.", c.frames_in);
  put("switchyard_router_link_frames_out_total", "Frames sent to workers.", c.frames_out);
  put("switchyard_router_link_backlogged_total",
      "Sends a worker's socket could not take at once (queued in the router's backlog, retried).", c.backlogged);
  put("switchyard_router_link_dropped_total",
      "Frames for workers given up: backlog overflow, flushed for a dead worker, or for a closed worker.", c.dropped);
  put("switchyard_router_link_backlog_overflow_total",
      "Of the dropped frames: the oldest of a full per-worker backlog (its request ends at its deadline).",
      c.backlog_overflow);
  put("switchyard_router_link_closed_total", "Worker connections closed (worker retired or removed).", c.closed);
  return out;
}

}  // namespace sy::router
