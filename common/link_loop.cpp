// The link loop (see link_loop.hpp).
#include "common/link_loop.hpp"

#include <zmq_addon.hpp>

namespace sy::link {

size_t send_backlog::send_or_queue(frame&& f, const send_fn& send, backlog_counters& counters) {
  if (frames_.empty() && send(f)) return 0;
  counters.backlogged++;
  frames_.push_back(std::move(f));
  if (frames_.size() <= max_frames_) return 0;
  frames_.pop_front();
  counters.overflow++;
  return 1;
}

void send_backlog::retry(const send_fn& send) {
  while (!frames_.empty() && send(frames_.front())) frames_.pop_front();
}

size_t send_backlog::clear() {
  const size_t n = frames_.size();
  frames_.clear();
  return n;
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
