// The ZeroMQ loop both processes' link actors run (router/fleet/link_actor, worker/service/link_actor): poll the
// sockets, take a bounded burst of frames from each readable one, and retry what waits to go out.
// The loop and its one overflow rule are here; each link keeps only what is its own (the
// router's per-worker DEALER sockets, the worker's ROUTER socket and ZAP handler).
//
// Overflow rule (both processes): a frame a socket will not take now (high-water mark reached,
// or ZMQ_IMMEDIATE with no connection yet) waits in that socket's backlog, in order, behind any
// frame already waiting; a backlog holding more than its configured count drops one frame and
// counts it: its oldest EXPENDABLE frame when it has one (the backlog's predicate says which:
// the worker's heartbeats, superseded by the next, and KV events, whose numbered gaps make the
// router ask for a resync), else its oldest frame. Token and final frames go only when nothing
// expendable is left, and then the oldest, the likeliest to be stale: a lost tokens frame is a
// numbered gap the router resumes from (docs/reliability.md), never a silent hole.
//
// Threads: everything here belongs to the one thread that runs the link (docs/engineering.md,
// "Blocking I/O on its own thread").
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <span>
#include <string>
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

// The frames waiting for one socket, oldest first, at most max_frames per lane (the rule
// above). A socket that talks to one peer (a router's DEALER to one worker) has one lane; a
// ROUTER socket that talks to many (the worker's, one connection per router) has one lane per
// peer, keyed by the frame's first part (the peer's identity): a peer whose queue is full holds
// back only its own frames, never another peer's behind them.
class send_backlog {
 public:
  // `expendable`: frames an over-full lane drops first (none when empty).
  explicit send_backlog(size_t max_frames, bool lane_per_peer = false,
                        std::function<bool(const frame&)> expendable = {})
      : max_frames_(max_frames), lane_per_peer_(lane_per_peer), expendable_(std::move(expendable)) {}

  // Sends `f` now when nothing waits in its lane and the socket takes it; otherwise queues it
  // behind its lane's waiting frames, dropping one of that lane's (the overflow rule) when that
  // makes more than max_frames. Returns the number of frames dropped (0 or 1).
  size_t send_or_queue(frame&& f, const send_fn& send, backlog_counters& counters);
  // Sends each lane's waiting frames in order while the socket takes them.
  void retry(const send_fn& send);
  // Drops every waiting frame (their peer is gone); returns how many.
  size_t clear();
  bool empty() const { return lanes_.empty(); }
  size_t size() const;
  size_t lanes() const { return lanes_.size(); }

 private:
  std::string lane_of(const frame& f) const;

  size_t max_frames_;
  bool lane_per_peer_;
  std::function<bool(const frame&)> expendable_;
  std::map<std::string, std::deque<frame>> lanes_;  // only lanes with frames waiting
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

// TCP keepalive on a link socket (both ends set it): a peer whose host vanished without a FIN
// (a node gone, a partition) is found out by the kernel in about a minute (30 s idle, then 3
// probes 10 s apart). A paused or throttled peer process still has its kernel answer the
// probes, so a pause never breaks the connection or drops what is queued on it.
void set_keepalive(zmq::socket_ref sock);

// One turn of the loop: waits up to `idle` for any socket to be readable (or, when a backlog
// waits, writable — and then at most `backlogged`, since a ZMQ_IMMEDIATE socket never reports
// writable before it connects), then, source by source in order, reads up to `burst` frames and
// retries the backlog.
void poll_once(std::span<poll_source> sources, std::chrono::milliseconds idle, std::chrono::milliseconds backlogged);

}  // namespace sy::link
