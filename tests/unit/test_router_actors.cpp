// The router's actors.
//
// Dispatcher actor: spawned as a scheduled actor on CAF's testing scheduler
// (tests/unit/actor_env.hpp) and stepped by the test; its 100 ms tick and the times it hands the
// dispatcher come from the simulated clock, so heartbeat timeouts and deadlines pass in
// simulated time. (main.cpp spawns the same behaviour detached; a detached actor is never run by
// the test coordinator, so the tests spawn it scheduled.) Workers are frames the test sends it;
// what it sends workers is read from the real inproc socket the link would poll; clients are
// fake exchanges (tests/unit/router_fakes.hpp).
//
// Link actor: a blocking actor (zmq::poll on its own thread: docs/engineering.md, "Blocking I/O on
// its own thread"), so it cannot be stepped.
// It is driven through real ZeroMQ sockets; the "dispatcher" is a scoped actor that blocks until
// the link's message arrives. Every wait is for an event the link must produce, never for time;
// counters are read after the link has stopped (its down message).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/system_messages.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/wire/protocol.hpp"
#include "router/base/router_clock.hpp"
#include "router/dispatch/actor_protocol.hpp"
#include "router/dispatch/dispatcher.hpp"
#include "router/dispatch/dispatcher_actor.hpp"
#include "router/fleet/link_actor.hpp"
#include "tests/unit/actor_env.hpp"
#include "tests/unit/router_fakes.hpp"

using namespace sy::router;
using namespace std::chrono_literals;
namespace proto = sy::proto;
using sy::test::fake_exchange;
using sy::test::tiny_vocab;

namespace {

constexpr const char* k_model = "smollm2-135m";

// One frame the dispatcher actor sent the link: [worker index][type][body].
struct to_link {
  uint32_t worker = 0;
  std::string type;
  std::string body;
};

template <class T>
T as(const to_link& f) {
  const auto r = proto::decode(f.type, f.body);
  REQUIRE(r.ok());
  const T* m = r.get_if<T>();
  REQUIRE(m != nullptr);
  return *m;
}

std::vector<std::string> types(const std::vector<to_link>& frames) {
  std::vector<std::string> out;
  for (const auto& f : frames) out.push_back(f.type);
  return out;
}

struct client {
  uint64_t id = 0;
  std::shared_ptr<fake_exchange> ex;
};

// The dispatcher actor on the test coordinator, with the link's end of its socket.
struct dispatcher_fixture {
  dispatcher_fixture() {
    inbox.set(zmq::sockopt::linger, 0);
    inbox.bind(k_link_inbox);
    dispatcher_config cfg;
    cfg.router_id = "test-router";
    cfg.pool.heartbeat_timeout_s = 2.0;
    cfg.hello_retry_s = 1.0;
    d = std::make_shared<dispatcher>(cfg, tenants, models);
    actor = actors.spawn(dispatcher_actor, &ctx, d, status);
    actors.sched().run();  // initialisation and the first tick
  }

  // Everything the actor has sent the link so far, in order.
  std::vector<to_link> take() {
    std::vector<to_link> out;
    std::vector<zmq::message_t> parts;
    while (zmq::recv_multipart(inbox, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
      REQUIRE(parts.size() == 3);
      REQUIRE(parts[0].size() == 4);
      to_link f;
      std::memcpy(&f.worker, parts[0].data(), 4);
      f.type = parts[1].to_string();
      f.body = parts[2].to_string();
      out.push_back(std::move(f));
      parts.clear();
    }
    return out;
  }

  // A frame from worker `w`, as the link delivers it; run to idle.
  template <class T>
  void feed(uint32_t w, const T& m) {
    caf::anon_send(actor, frame_atom::value, w, std::string(proto::name(proto::type_of<T>)), proto::encode(m),
                   int64_t{0});
    actors.sched().run();
  }

  void heartbeat(uint32_t w) { feed(w, proto::heartbeat{}); }

  // What worker 0 says to a hello: it serves the model, 4 requests at a time.
  static proto::welcome welcome() {
    proto::welcome m;
    m.worker_id = "worker-0";
    m.model_id = k_model;
    m.context_length = 2048;
    m.kv_capacity_tokens = 4096;
    m.kv_block_size = 16;
    m.max_running = 4;
    m.tokenizer = tiny_vocab();
    return m;
  }

  // Worker 0 added, greeted and welcomed; frames so far taken.
  void start_worker() {
    caf::anon_send(actor, add_atom::value, std::string("tcp://w0:5555"));
    actors.sched().run();
    feed(0, welcome());
    heartbeat(0);
    take();
  }

  client request(bool stream, double timeout_s = 0, bool throwing = false) {
    auto r = std::make_shared<routed_request>();
    r->id = next_id++;
    r->request_id = "req-" + std::to_string(r->id);
    auto ex = std::make_shared<fake_exchange>();
    ex->throw_calls = throwing;
    r->ex = ex;
    r->who = tenants.authenticate("");
    REQUIRE(r->who != nullptr);
    r->req.kind = endpoint::completions;
    r->req.model = k_model;
    r->req.stream = stream;
    r->req.sampling.max_tokens = 16;
    r->model = models.find(k_model);
    REQUIRE(r->model != nullptr);
    r->prompt = r->model->tok.encode("The quick brown fox");
    r->meta.id = "cmpl-" + std::to_string(r->id);
    r->meta.model = k_model;
    r->meta.kind = r->req.kind;
    r->t_received_s = r->t_parsed_s = steady_seconds(actors.sched().clock().now());  // the simulated clock
    r->timeout_s = timeout_s;
    const uint64_t id = r->id;
    caf::anon_send(actor, submit_atom::value, std::move(r));
    actors.sched().run();
    return {id, ex};
  }

  // One tokens message for `wire_id` from worker `w`.
  void tokens(uint32_t w, const std::string& wire_id, const std::string& text, uint32_t completion,
              const std::string& finish = "") {
    proto::tokens m;
    m.request_id = wire_id;
    m.token_ids = {static_cast<int32_t>(100 + completion)};
    m.text = text;
    m.finish_reason = sy::parse_finish_reason(finish).value();  // the worker's wire name
    m.usage = {5, 0, completion};
    feed(w, m);
  }

  bool ready() {
    std::lock_guard<std::mutex> lk(status->mu);
    return status->ready;
  }
  std::string metrics() {
    std::lock_guard<std::mutex> lk(status->mu);
    return status->dispatcher_metrics;
  }

  // Declared first, destroyed last: every socket (the actor's too) closes before it.
  zmq::context_t ctx{1};
  zmq::socket_t inbox{ctx, zmq::socket_type::pull};
  tenant_registry tenants = tenant_registry::open_access();
  model_registry models;
  std::shared_ptr<dispatcher> d;
  std::shared_ptr<router_status> status = std::make_shared<router_status>();
  sy::test::actor_env actors;  // stops the actor before the dispatcher and the sockets go
  caf::actor actor;
  uint64_t next_id = 1;
};

std::string wire(uint64_t id, uint32_t attempt) { return std::to_string(id) + "-" + std::to_string(attempt) + ".0"; }

bool has_line(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

}  // namespace

TEST_CASE("dispatcher actor: a new worker is greeted, greeted again each simulated second, and ready after welcome") {
  dispatcher_fixture f;
  caf::anon_send(f.actor, add_atom::value, std::string("tcp://w0:5555"));
  f.actors.sched().run();
  auto out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"_connect", "hello"});
  CHECK(out[0].worker == 0);
  CHECK(out[0].body == "tcp://w0:5555");
  CHECK(as<proto::hello>(out[1]).router_id == "test-router");

  f.actors.advance(900ms);  // ticks, but the hello is not a second old
  CHECK(f.take().empty());
  CHECK_FALSE(f.ready());
  f.actors.advance(200ms);
  out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"_flush", "hello"});  // the unanswered one dropped

  f.feed(0, f.welcome());
  f.actors.advance(100ms);  // readiness and metrics are published on the tick
  CHECK(f.ready());
  CHECK(has_line(f.metrics(), "switchyard_router_workers{state=\"ready\"} 1"));
  REQUIRE(f.models.find(k_model) != nullptr);
  f.actors.advance(800ms);  // welcomed: no more hellos
  CHECK(f.take().empty());
}

TEST_CASE(
    "dispatcher actor: a streamed request is submitted through the link and its tokens reach the client in order") {
  dispatcher_fixture f;
  f.start_worker();
  const client c = f.request(/*stream=*/true);
  REQUIRE(c.ex->log == std::vector<std::string>{"start_stream"});
  const auto out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"submit"});
  CHECK(out[0].worker == 0);
  const auto s = as<proto::submit>(out[0]);
  CHECK(s.request_id == wire(c.id, 1));
  CHECK(s.prompt == f.models.find(k_model)->tok.encode("The quick brown fox"));

  f.tokens(0, wire(c.id, 1), "Once", 1);
  f.tokens(0, wire(c.id, 1), " upon", 2);
  f.tokens(0, wire(c.id, 1), " a time", 3, "stop");
  REQUIRE(c.ex->log == std::vector<std::string>{"start_stream", "send_event", "send_event", "send_event", "send_event",
                                                "end_stream"});
  CHECK(c.ex->event(0)["choices"][0]["text"] == "Once");
  CHECK(c.ex->event(1)["choices"][0]["text"] == " upon");
  CHECK(c.ex->event(2)["choices"][0]["text"] == " a time");
  CHECK(c.ex->event(2)["choices"][0]["finish_reason"] == "stop");
  CHECK(c.ex->events[3] == "[DONE]");
  CHECK(f.d->active() == 0);
}

TEST_CASE("dispatcher actor: the tick ends a dispatched request its worker never answers, in simulated time") {
  dispatcher_fixture f;
  f.start_worker();
  const client c = f.request(/*stream=*/false, /*timeout_s=*/1.0);
  REQUIRE(types(f.take()) == std::vector<std::string>{"submit"});

  // The worker stays alive (a heartbeat every 500 ms) but the request's answer never comes. Its
  // worker gets 5 s past the 1 s deadline to end it.
  for (int i = 0; i < 11; ++i) {  // 5.5 s
    f.actors.advance(500ms);
    f.heartbeat(0);
  }
  CHECK(c.ex->log.empty());
  CHECK(f.take().empty());
  for (int i = 0; i < 2; ++i) {  // 6.5 s
    f.actors.advance(500ms);
    f.heartbeat(0);
  }
  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  CHECK(c.ex->responses[0].status == 504);
  CHECK(c.ex->body()["error"]["code"] == "deadline_exceeded");
  const auto out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"cancel"});  // in case the worker still runs it
  CHECK(as<proto::cancel>(out[0]).request_id == wire(c.id, 1));
  CHECK(f.d->active() == 0);
  CHECK(f.ready());  // the worker itself is fine
  CHECK(has_line(f.metrics(), "switchyard_router_expired_total 1"));
}

TEST_CASE("dispatcher actor: a worker silent past the heartbeat timeout is declared dead after simulated time") {
  dispatcher_fixture f;
  f.start_worker();
  const client streaming = f.request(/*stream=*/true);
  const client waiting = f.request(/*stream=*/false);
  REQUIRE(types(f.take()) == std::vector<std::string>{"submit", "submit"});
  f.tokens(0, wire(streaming.id, 1), "Once", 1);  // this client has seen a token
  REQUIRE(streaming.ex->events.size() == 1);

  f.actors.advance(1900ms);  // silent, but within the 2 s timeout
  CHECK(f.take().empty());
  CHECK(f.ready());
  f.actors.advance(300ms);
  const auto out = f.take();
  REQUIRE_FALSE(out.empty());
  CHECK(out.front().type == "_flush");  // what still waits for the dead worker is dropped
  CHECK(out.back().type == "hello");    // and it is greeted again, in case it comes back
  std::set<std::string> cancelled;      // in case it is only slow
  for (const auto& x : out)
    if (x.type == "cancel") cancelled.insert(as<proto::cancel>(x).request_id);
  CHECK(cancelled == std::set<std::string>{wire(streaming.id, 1), wire(waiting.id, 1)});
  CHECK(f.ready());  // no worker, but within the no-worker grace: requests queue for one
  CHECK(has_line(f.metrics(), "switchyard_router_workers{state=\"dead\"} 1"));

  // Both wait in the queue, the started stream to resume from what its client has (a pause, no
  // error event).
  CHECK(streaming.ex->log == std::vector<std::string>{"start_stream", "send_event"});
  CHECK(waiting.ex->log.empty());
  CHECK(f.d->queued() == 2);

  // The worker comes back: both are sent again, as new attempts, and answered.
  f.feed(0, f.welcome());
  const auto again = f.take();
  REQUIRE(types(again) == std::vector<std::string>{"submit", "submit"});
  std::set<std::string> resent;
  for (const auto& x : again) resent.insert(as<proto::submit>(x).request_id);
  CHECK(resent == std::set<std::string>{wire(streaming.id, 2), wire(waiting.id, 2)});
  f.tokens(0, wire(streaming.id, 2), " upon", 2, "length");
  CHECK(streaming.ex->events.back() == "[DONE]");
  f.tokens(0, wire(waiting.id, 1), "stale", 1, "stop");  // the old attempt's answer is ignored
  CHECK(waiting.ex->log.empty());
  f.tokens(0, wire(waiting.id, 2), "fresh", 1, "stop");
  REQUIRE(waiting.ex->log == std::vector<std::string>{"respond"});
  CHECK(waiting.ex->responses[0].status == 200);
  CHECK(waiting.ex->body()["choices"][0]["text"] == "fresh");
}

TEST_CASE("dispatcher actor: a handler that throws is logged and the actor keeps serving") {
  dispatcher_fixture f;
  f.start_worker();
  // Opening this client's stream throws inside the submit handler.
  const client broken = f.request(/*stream=*/true, 0, /*throwing=*/true);
  CHECK(broken.ex->log.empty());
  CHECK(f.take().empty());
  CHECK(f.d->active() == 0);

  // The actor is alive: the next request is dispatched and answered.
  const client c = f.request(/*stream=*/false);
  REQUIRE(types(f.take()) == std::vector<std::string>{"submit"});
  f.tokens(0, wire(c.id, 1), "fine", 1, "stop");
  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  CHECK(c.ex->responses[0].status == 200);

  // A worker frame whose answer throws (the client's write fails) leaves the actor serving too.
  const client d = f.request(/*stream=*/true);
  REQUIRE(types(f.take()) == std::vector<std::string>{"submit"});
  d.ex->throw_calls = true;
  f.tokens(0, wire(d.id, 1), "boom", 1);
  const client e = f.request(/*stream=*/false);
  REQUIRE(types(f.take()) == std::vector<std::string>{"submit"});
  f.tokens(0, wire(e.id, 1), "still fine", 1, "stop");
  REQUIRE(e.ex->log == std::vector<std::string>{"respond"});
  CHECK(e.ex->body()["choices"][0]["text"] == "still fine");
  f.actors.advance(100ms);  // and it still ticks
  CHECK(f.ready());
}

TEST_CASE("dispatcher actor: drain is published at once and refuses new requests with 503") {
  dispatcher_fixture f;
  f.start_worker();
  f.actors.advance(100ms);
  CHECK(f.ready());
  caf::anon_send(f.actor, drain_atom::value);
  f.actors.sched().run_once();  // no tick needed
  {
    std::lock_guard<std::mutex> lk(f.status->mu);
    CHECK(f.status->draining);
    CHECK_FALSE(f.status->ready);
    CHECK(f.status->active == 0);
  }
  const client c = f.request(/*stream=*/false);
  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  CHECK(c.ex->responses[0].status == 503);
  CHECK(c.ex->body()["error"]["code"] == "draining");
  CHECK(f.take().empty());
}

TEST_CASE("dispatcher actor: a client that goes away has its request cancelled on the worker") {
  dispatcher_fixture f;
  f.start_worker();
  const client c = f.request(/*stream=*/true);
  REQUIRE(types(f.take()) == std::vector<std::string>{"submit"});
  caf::anon_send(f.actor, gone_atom::value, c.id);
  f.actors.sched().run();
  const auto out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"cancel"});
  CHECK(as<proto::cancel>(out[0]).request_id == wire(c.id, 1));
  CHECK(f.d->active() == 0);
  f.tokens(0, wire(c.id, 1), "late", 1);  // what the worker still sends is dropped
  CHECK(c.ex->log == std::vector<std::string>{"start_stream"});
}

TEST_CASE("dispatcher actor: a scrape's publish request is served at once, without waiting for a tick") {
  dispatcher_fixture f;
  f.start_worker();
  f.actors.advance(100ms);
  const client c = f.request(/*stream=*/true);
  caf::anon_send(f.actor, gone_atom::value, c.id);
  f.actors.sched().run();
  CHECK_FALSE(has_line(f.metrics(), "switchyard_router_client_cancels_total 1"));  // the last tick's
  uint64_t mine = 0;
  {
    std::lock_guard<std::mutex> lk(f.status->mu);
    mine = ++f.status->publish_requests;  // what await_publication does before it asks
  }
  caf::anon_send(f.actor, publish_atom::value);
  f.actors.sched().run_once();  // no tick: the simulated clock has not moved
  {
    std::lock_guard<std::mutex> lk(f.status->mu);
    CHECK(f.status->published_through >= mine);
  }
  CHECK(has_line(f.metrics(), "switchyard_router_client_cancels_total 1"));
}

TEST_CASE("dispatcher actor: a retired worker is closed through the link once its request has ended") {
  dispatcher_fixture f;
  f.start_worker();
  const client c = f.request(/*stream=*/true);
  REQUIRE(types(f.take()) == std::vector<std::string>{"submit"});
  caf::anon_send(f.actor, retire_atom::value, std::string("tcp://w0:5555"));
  f.actors.sched().run();
  CHECK(f.take().empty());  // it still runs c
  f.actors.advance(100ms);
  CHECK(f.ready());  // its only worker takes nothing new, but the no-worker grace has just begun
  CHECK(has_line(f.metrics(), "switchyard_router_workers{state=\"retired\"} 1"));
  CHECK(f.take().empty());

  f.tokens(0, wire(c.id, 1), "Once", 1, "stop");
  CHECK(c.ex->events.back() == "[DONE]");
  f.actors.advance(100ms);  // the next tick removes it
  const auto out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"_close"});
  CHECK(out[0].worker == 0);
  CHECK(f.metrics().find("tcp://w0:5555") == std::string::npos);
  CHECK(has_line(f.metrics(), "switchyard_router_workers{state=\"retired\"} 0"));
  f.tokens(0, wire(c.id, 1), "late", 2);  // still on its way from the closed connection: dropped
  f.actors.advance(100ms);
  CHECK(has_line(f.metrics(), "switchyard_router_late_frames_total 1"));
}

// ---- link actor -----------------------------------------------------------------------------

namespace {

// Bounds every wait for the link, so that a broken link fails the test instead of hanging it;
// never reached when the link works (and nothing is measured).
constexpr auto k_hang_guard = std::chrono::seconds(60);

// A worker: a ROUTER socket bound where the link's DEALER connects.
struct fake_worker {
  fake_worker(zmq::context_t& ctx, const std::string& endpoint) : sock(ctx, zmq::socket_type::router) {
    sock.set(zmq::sockopt::linger, 0);
    sock.set(zmq::sockopt::rcvtimeo, static_cast<int>(std::chrono::milliseconds(k_hang_guard).count()));
    sock.bind(endpoint);
  }
  // The next [type][body] from the router (blocks until it comes); remembers the identity.
  std::vector<std::string> recv() {
    std::vector<zmq::message_t> parts;
    REQUIRE(zmq::recv_multipart(sock, std::back_inserter(parts)));
    REQUIRE(parts.size() >= 1);
    identity = parts[0].to_string();
    std::vector<std::string> out;
    for (size_t i = 1; i < parts.size(); ++i) out.push_back(parts[i].to_string());
    return out;
  }
  void send(const std::vector<std::string>& frames) {
    std::vector<zmq::const_buffer> parts{zmq::buffer(identity)};
    for (const auto& x : frames) parts.push_back(zmq::buffer(x));
    REQUIRE(zmq::send_multipart(sock, parts));
  }
  zmq::socket_t sock;
  std::string identity;
};

// The link on its own thread, with a scoped actor standing in for the dispatcher.
struct link_fixture {
  link_fixture() {
    dispatcher->monitor(link);
    inbox.set(zmq::sockopt::linger, 0);
    inbox.connect(k_link_inbox);  // inproc: may precede the link's bind
  }
  ~link_fixture() { stop_link(); }

  // A frame from the dispatcher for worker `w`.
  void push(uint32_t w, const std::string& type, const std::string& body) {
    std::array<zmq::const_buffer, 3> parts{zmq::buffer(&w, 4), zmq::buffer(type), zmq::buffer(body)};
    REQUIRE(zmq::send_multipart(inbox, parts));
  }

  // The next frame the link hands the dispatcher, as (worker, type, body).
  void expect_frame(uint32_t w, const std::string& type, const std::string& body) {
    dispatcher->receive(
        [&](frame_atom, uint32_t got_w, const std::string& got_type, const std::string& got_body, int64_t) {
          CHECK(got_w == w);
          CHECK(got_type == type);
          CHECK(got_body == body);
        },
        [](const caf::down_msg& dm) { FAIL("the link stopped: " << caf::to_string(dm.reason)); },
        caf::after(k_hang_guard) >> [] { FAIL("the link sent the dispatcher nothing"); });
  }

  // Stops the link and waits for its end; counters are final afterwards.
  void stop_link() {
    if (stopped_) return;
    stopped_ = true;
    stop->store(true);
    dispatcher->receive([](const caf::down_msg&) {}, caf::after(k_hang_guard) >> [] { FAIL("the link did not stop"); });
  }

  zmq::context_t ctx{1};
  zmq::socket_t inbox{ctx, zmq::socket_type::push};  // the dispatcher's end
  sy::test::actor_env actors;
  caf::scoped_actor dispatcher{actors.sys()};
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<link_counters> counters = std::make_shared<link_counters>();
  caf::actor link =
      actors.sys().spawn(link_actor, &ctx, link_config{}, caf::actor_cast<caf::actor>(dispatcher), stop, counters);

 private:
  bool stopped_ = false;
};

}  // namespace

TEST_CASE("router link: _connect opens a worker's connection, frames go out to it and come back tagged with it") {
  link_fixture f;
  fake_worker w0(f.ctx, "inproc://test-worker-0");
  fake_worker w1(f.ctx, "inproc://test-worker-1");
  f.push(0, "_connect", "inproc://test-worker-0");
  f.push(1, "_connect", "inproc://test-worker-1");
  f.push(1, "_connect", "inproc://test-worker-0");  // a ref already open: ignored (refs are never reused)
  f.push(7, "hello", "nobody");                     // no such worker: dropped
  f.push(1, "hello", "h1");
  f.push(0, "hello", "h0");
  CHECK(w0.recv() == std::vector<std::string>{"hello", "h0"});
  CHECK(w1.recv() == std::vector<std::string>{"hello", "h1"});

  w1.send({"welcome", "x1"});
  f.expect_frame(1, "welcome", "x1");
  w0.send({"a", "b", "c"});  // not [type][body]: dropped
  w0.send({"heartbeat", "x0"});
  f.expect_frame(0, "heartbeat", "x0");

  f.stop_link();
  CHECK(f.counters->frames_in == 3);
  CHECK(f.counters->frames_out == 2);
  CHECK(f.counters->dropped == 1);
}

TEST_CASE("router link: _flush drops what waits for a worker that cannot be reached, later frames get through") {
  link_fixture f;
  fake_worker w0(f.ctx, "inproc://test-worker-0");
  // An endpoint nobody has bound yet. (Not inproc: an inproc connect queues frames for a peer
  // that binds later, so nothing would wait in the link's backlog.)
  const std::string path = "/tmp/switchyard-test-router-link-" + std::to_string(::getpid());
  const std::string endpoint = "ipc://" + path;
  struct remove_at_end {
    std::string path;
    ~remove_at_end() { ::unlink(path.c_str()); }
  } socket_file{path};
  f.push(0, "_connect", "inproc://test-worker-0");
  f.push(1, "_connect", endpoint);
  f.push(1, "hello", "stale");  // no connection (ZMQ_IMMEDIATE): waits in the backlog
  f.push(1, "_flush", "");
  f.push(0, "marker", "m");  // the link handles its inbox in order: once w0 has this, w1 was flushed
  CHECK(w0.recv() == std::vector<std::string>{"marker", "m"});

  fake_worker w1(f.ctx, endpoint);
  f.push(1, "ping", "p");
  CHECK(w1.recv() == std::vector<std::string>{"ping", "p"});  // the flushed hello never arrives

  f.stop_link();
  CHECK(f.counters->dropped == 1);
  CHECK(f.counters->backlog.backlogged >= 1);
}

TEST_CASE("router link: _close closes a worker's connection - frames for it afterwards are dropped") {
  link_fixture f;
  // A worker on loopback TCP, watched through a socket monitor: the link's connection to it is
  // accepted on _connect and disconnected on _close.
  zmq::socket_t worker(f.ctx, zmq::socket_type::router);
  worker.set(zmq::sockopt::linger, 0);
  worker.set(zmq::sockopt::rcvtimeo, static_cast<int>(std::chrono::milliseconds(k_hang_guard).count()));
  const std::string monitor_endpoint = "inproc://test-worker-monitor";
  REQUIRE(zmq_socket_monitor(worker.handle(), monitor_endpoint.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) ==
          0);
  zmq::socket_t monitor(f.ctx, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::linger, 0);
  monitor.set(zmq::sockopt::rcvtimeo, static_cast<int>(std::chrono::milliseconds(k_hang_guard).count()));
  monitor.connect(monitor_endpoint);
  worker.bind("tcp://127.0.0.1:*");
  const std::string endpoint = worker.get(zmq::sockopt::last_endpoint);
  // The next event's id (frame 1: 16-bit event, 32-bit value; frame 2: the address).
  auto next_event = [&] {
    std::vector<zmq::message_t> parts;
    REQUIRE(zmq::recv_multipart(monitor, std::back_inserter(parts)));
    REQUIRE(parts.size() == 2);
    uint16_t event = 0;
    std::memcpy(&event, parts[0].data(), sizeof event);
    return event;
  };

  f.push(3, "_connect", endpoint);
  f.push(3, "hello", "h");
  std::vector<zmq::message_t> got;
  REQUIRE(zmq::recv_multipart(worker, std::back_inserter(got)));
  CHECK(got.at(1).to_string() == "hello");
  CHECK(next_event() == ZMQ_EVENT_ACCEPTED);

  f.push(3, "_close", "");
  CHECK(next_event() == ZMQ_EVENT_DISCONNECTED);  // the link's socket is gone
  f.push(3, "hello", "after");                    // nothing reaches a closed worker
  f.push(3, "_close", "");                        // closing twice is harmless
  fake_worker other(f.ctx, "inproc://test-worker-other");
  f.push(4, "_connect", "inproc://test-worker-other");
  f.push(4, "marker", "m");  // the link handles its inbox in order: once this arrives, so did the rest
  CHECK(other.recv() == std::vector<std::string>{"marker", "m"});
  f.stop_link();
  CHECK(f.counters->closed == 1);
  CHECK(f.counters->dropped == 2);
  CHECK(f.counters->frames_out == 2);
}
