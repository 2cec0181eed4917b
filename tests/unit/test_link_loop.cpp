// The link loop both processes share (common/wire/link_loop.hpp): the backlog's order and its one
// overflow rule (drop the oldest expendable frame, else the oldest; count it) exactly, with a scripted send function
// standing in for a socket; then one turn of poll_once over a real inproc socket pair.
#include <catch2/catch.hpp>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/wire/link_loop.hpp"

using sy::link::backlog_counters;
using sy::link::frame;
using sy::link::poll_source;
using sy::link::send_backlog;

namespace {

frame one(const std::string& s) {
  frame f;
  f.emplace_back(s);
  return f;
}

// A socket that takes frames only while `open`; what it took, in order.
struct fake_socket {
  bool open = true;
  std::vector<std::string> sent;
  sy::link::send_fn fn() {
    return [this](frame& f) {
      if (!open) return false;
      sent.push_back(f.at(0).to_string());
      return true;
    };
  }
};

}  // namespace

TEST_CASE("link backlog: a frame the socket takes goes out at once and nothing waits") {
  fake_socket s;
  backlog_counters c;
  send_backlog b(4);
  CHECK(b.send_or_queue(one("a"), s.fn(), c) == 0);
  CHECK(s.sent == std::vector<std::string>{"a"});
  CHECK(b.empty());
  CHECK(c.backlogged == 0);
}

TEST_CASE("link backlog: refused frames wait, later ones queue behind them, retry sends in order") {
  fake_socket s;
  backlog_counters c;
  send_backlog b(4);
  s.open = false;
  b.send_or_queue(one("a"), s.fn(), c);
  s.open = true;
  b.send_or_queue(one("b"), s.fn(), c);  // the socket would take it, but "a" waits first
  CHECK(s.sent.empty());
  CHECK(b.size() == 2);
  CHECK(c.backlogged == 2);
  b.retry(s.fn());
  CHECK(s.sent == std::vector<std::string>{"a", "b"});
  CHECK(b.empty());
}

TEST_CASE("link backlog: over its bound the oldest frame is dropped and counted") {
  fake_socket s;
  s.open = false;
  backlog_counters c;
  send_backlog b(2);
  size_t dropped = 0;
  for (const char* x : {"1", "2", "3", "4"}) dropped += b.send_or_queue(one(x), s.fn(), c);
  CHECK(dropped == 2);
  CHECK(c.overflow == 2);
  CHECK(c.backlogged == 4);
  CHECK(b.size() == 2);
  s.open = true;
  b.retry(s.fn());
  CHECK(s.sent == std::vector<std::string>{"3", "4"});  // the newest survive
}

TEST_CASE("link backlog: over its bound an expendable frame goes before any other, oldest first") {
  fake_socket s;
  s.open = false;
  backlog_counters c;
  // "h..." frames are expendable (heartbeats), "t..." are not (tokens).
  send_backlog b(3, false, [](const frame& f) { return f.at(0).to_string()[0] == 'h'; });
  size_t dropped = 0;
  for (const char* x : {"t1", "h1", "t2", "h2", "t3", "t4"}) dropped += b.send_or_queue(one(x), s.fn(), c);
  CHECK(dropped == 3);
  CHECK(c.overflow == 3);
  s.open = true;
  b.retry(s.fn());
  // h1 and h2 went first; with none left, the oldest tokens frame.
  CHECK(s.sent == std::vector<std::string>{"t2", "t3", "t4"});
}

TEST_CASE("link backlog: clear drops what waits and says how much") {
  fake_socket s;
  s.open = false;
  backlog_counters c;
  send_backlog b(8);
  b.send_or_queue(one("a"), s.fn(), c);
  b.send_or_queue(one("b"), s.fn(), c);
  CHECK(b.clear() == 2);
  CHECK(b.empty());
  CHECK(c.overflow == 0);
}

TEST_CASE("link loop: one turn reads a readable socket up to its burst, the rest on the next turn") {
  zmq::context_t ctx(1);
  zmq::socket_t in(ctx, zmq::socket_type::pull), out(ctx, zmq::socket_type::push);
  in.bind("inproc://test_link_loop");
  out.connect("inproc://test_link_loop");
  for (int i = 0; i < 5; ++i) out.send(zmq::buffer(std::to_string(i)), zmq::send_flags::none);
  std::vector<std::string> got;
  std::vector<poll_source> sources{
      {in.handle(), 3, [&](frame& f) { got.push_back(f.at(0).to_string()); }, nullptr, nullptr}};
  // The frames are queued before the poll: each turn returns at once (the timeout bounds a broken
  // loop, it is never waited out when the loop works).
  sy::link::poll_once(sources, std::chrono::milliseconds(5000), std::chrono::milliseconds(5000));
  CHECK(got == std::vector<std::string>{"0", "1", "2"});
  sy::link::poll_once(sources, std::chrono::milliseconds(5000), std::chrono::milliseconds(5000));
  CHECK(got == std::vector<std::string>{"0", "1", "2", "3", "4"});
}

TEST_CASE("link backlog: with a lane per peer, a peer that stopped reading holds back only its own frames") {
  // [peer][payload] frames; the socket refuses peer "b" (its queue is full), takes "a".
  const auto to = [](const std::string& peer, const std::string& x) {
    frame f;
    f.emplace_back(peer);
    f.emplace_back(x);
    return f;
  };
  bool b_open = false;
  std::vector<std::string> sent;
  const sy::link::send_fn send = [&](frame& f) {
    if (f.at(0).to_string() == "b" && !b_open) return false;
    sent.push_back(f.at(0).to_string() + ":" + f.at(1).to_string());
    return true;
  };
  backlog_counters c;
  send_backlog b(2, /*lane_per_peer=*/true);
  b.send_or_queue(to("b", "1"), send, c);
  b.send_or_queue(to("a", "1"), send, c);  // not behind b's waiting frame
  b.send_or_queue(to("b", "2"), send, c);
  b.send_or_queue(to("a", "2"), send, c);
  CHECK(sent == std::vector<std::string>{"a:1", "a:2"});
  CHECK(b.size() == 2);
  CHECK(b.lanes() == 1);
  CHECK(b.send_or_queue(to("b", "3"), send, c) == 1);  // b's lane over its bound: b's oldest goes
  CHECK(c.overflow == 1);
  b.retry(send);  // still refused: nothing moves, a's later frames still pass
  b.send_or_queue(to("a", "3"), send, c);
  CHECK(sent.back() == "a:3");
  b_open = true;
  b.retry(send);
  CHECK(sent == std::vector<std::string>{"a:1", "a:2", "a:3", "b:2", "b:3"});
  CHECK(b.empty());
  CHECK(b.lanes() == 0);
}
