// The ZeroMQ loop both processes' link actors run (router/link_actor, worker/link_actor): poll the
// sockets, take a bounded burst of frames from each readable one, and retry what waits to go out.
// The loop and its one overflow rule are here; each link keeps only what is its own (the
// router's per-worker DEALER sockets, the worker's ROUTER socket and ZAP handler).
//
// Overflow rule (both processes): a frame a socket will not take now (high-water mark reached,
// or ZMQ_IMMEDIATE with no connection yet) waits in that socket's backlog, in order, behind any
// frame already waiting; a backlog holding more than its configured count drops its OLDEST frame
// and counts it. The oldest goes because it is the likeliest to be stale already: its request's
// deadline ends it either way, while the newest frames (cancels, the latest tokens) still matter.
//
// Threads: everything here belongs to the one thread that runs the link (STYLE 9).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <vector>
#include <zmq.hpp>

namespace sy::link {

using frame = std::vector<zmq::message_t>;  // one multipart message

// Sends one frame without blocking. Returns false when the socket would block (the frame stays
// with the caller, to retry), true when the frame is done with: sent, or failed for good (the
// send function counts that itself).
using send_fn = std::function<bool(frame&)>;

// Counted by every backlog of a link; exported as *_link_backlogged_total and
// *_link_backlog_overflow_total in both processes' /metrics.
struct backlog_counters {
  std::atomic<uint64_t> backlogged{0};  // frames that had to wait in a backlog
  std::atomic<uint64_t> overflow{0};    // frames dropped: the oldest of an over-full backlog
};

// The frames waiting for one socket, oldest first, at most max_frames (the rule above).
class send_backlog {
 public:
  explicit send_backlog(size_t max_frames) : max_frames_(max_frames) {}

  // Sends `f` now when nothing waits and the socket takes it; otherwise queues it behind the
  // waiting frames, dropping the oldest when that makes more than max_frames. Returns the number
  // of frames dropped (0 or 1).
  size_t send_or_queue(frame&& f, const send_fn& send, backlog_counters& counters);
  // Sends waiting frames in order while the socket takes them.
  void retry(const send_fn& send);
  // Drops every waiting frame (their peer is gone); returns how many.
  size_t clear();
  bool empty() const { return frames_.empty(); }
  size_t size() const { return frames_.size(); }

 private:
  size_t max_frames_;
  std::deque<frame> frames_;
};

// One socket of the loop.
struct poll_source {
  void* socket = nullptr;  // zmq::socket_t::handle()
  // Frames taken from the socket per turn at most, so that one busy peer cannot starve the rest.
  int burst = 256;
  std::function<void(frame&)> on_frame;  // each frame read (the callee may move its parts away)
  // Frames waiting to go out on this socket (null: none ever do), and how to send one.
  send_backlog* backlog = nullptr;
  send_fn send;
};

// One turn of the loop: waits up to `idle` for any socket to be readable (or, when a backlog
// waits, writable — and then at most `backlogged`, since a ZMQ_IMMEDIATE socket never reports
// writable before it connects), then, source by source in order, reads up to `burst` frames and
// retries the backlog.
void poll_once(std::span<poll_source> sources, std::chrono::milliseconds idle, std::chrono::milliseconds backlogged);

}  // namespace sy::link
