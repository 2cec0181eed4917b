// The link loop (see link_loop.hpp).
#include "common/wire/link_loop.hpp"

#include <algorithm>

#include <zmq_addon.hpp>

namespace sy::link {

std::string send_backlog::lane_of(const frame& f) const {
  return lane_per_peer_ && !f.empty() ? f[0].to_string() : std::string();
}

size_t send_backlog::send_or_queue(frame&& f, const send_fn& send, backlog_counters& counters) {
  std::string lane = lane_of(f);
  auto it = lanes_.find(lane);
  if (it == lanes_.end() && send(f)) return 0;
  counters.backlogged++;
  if (it == lanes_.end()) it = lanes_.emplace(std::move(lane), std::deque<frame>{}).first;
  it->second.push_back(std::move(f));
  std::deque<frame>& q = it->second;
  if (q.size() <= max_frames_) return 0;
  auto victim = q.begin();  // the oldest expendable frame, else the oldest
  if (expendable_) {
    const auto e = std::find_if(q.begin(), q.end(), [&](const frame& x) { return expendable_(x); });
    if (e != q.end()) victim = e;
  }
  q.erase(victim);
  counters.overflow++;
  return 1;
}

void send_backlog::retry(const send_fn& send) {
  for (auto it = lanes_.begin(); it != lanes_.end();) {
    std::deque<frame>& q = it->second;
    while (!q.empty() && send(q.front())) q.pop_front();
    it = q.empty() ? lanes_.erase(it) : std::next(it);
  }
}

size_t send_backlog::clear() {
  const size_t n = size();
  lanes_.clear();
  return n;
}

size_t send_backlog::size() const {
  size_t n = 0;
  for (const auto& [lane, q] : lanes_) n += q.size();
  return n;
}

void set_keepalive(zmq::socket_ref sock) {
  sock.set(zmq::sockopt::tcp_keepalive, 1);
  sock.set(zmq::sockopt::tcp_keepalive_idle, 30);
  sock.set(zmq::sockopt::tcp_keepalive_intvl, 10);
  sock.set(zmq::sockopt::tcp_keepalive_cnt, 3);
}

void poll_once(std::span<poll_source> sources, std::chrono::milliseconds idle, std::chrono::milliseconds backlogged) {
  std::vector<zmq::pollitem_t> items;
  items.reserve(sources.size());
  bool waiting = false;
  for (const poll_source& s : sources) {
    const bool out = s.backlog && !s.backlog->empty();
    waiting |= out;
    items.push_back({s.socket, 0, static_cast<short>(ZMQ_POLLIN | (out ? ZMQ_POLLOUT : 0)), 0});
  }
  zmq::poll(items.data(), items.size(), waiting ? backlogged : idle);
  frame parts;
  for (size_t i = 0; i < sources.size(); ++i) {
    poll_source& s = sources[i];
    if (items[i].revents & ZMQ_POLLIN) {
      zmq::socket_ref sock(zmq::from_handle, s.socket);
      for (int n = 0; n < s.burst; ++n) {
        parts.clear();
        if (!zmq::recv_multipart(sock, std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
        s.on_frame(parts);
      }
    }
    if (s.backlog) s.backlog->retry(s.send);
  }
}

}  // namespace sy::link
