// The worker's actors, on the real model.
//
// Engine actor: spawned as a scheduled actor on CAF's testing scheduler (tests/unit/actor_env.hpp)
// and stepped by the test, one message at a time where the order matters; its tick runs on the
// simulated clock. (serve.cpp spawns the same behaviour detached, on a thread of its own; a
// detached actor is never run by the test coordinator, so the tests spawn it scheduled.) Its
// replies are read from the real inproc outbox socket the link would poll, on the test's own
// thread: an inproc send is readable by a non-blocking receive as soon as it returns.
//
// Link actor: a blocking actor (zmq::poll on its own thread: docs/engineering.md, "Blocking I/O on
// its own thread"), so it cannot be stepped.
// It is driven through real inproc ZeroMQ sockets; the "engine" is a scoped actor that blocks
// until the link's message arrives. Every wait is for an event the link must produce, never for
// time; counters are read after the link has stopped (its down message).
#include <catch2/catch.hpp>

#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/system_messages.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/wire/protocol.hpp"
#include "tests/unit/actor_env.hpp"
#include "tests/unit/model_env.hpp"
#include "worker/engine/engine.hpp"
#include "worker/service/actor_protocol.hpp"
#include "worker/service/engine_actor.hpp"
#include "worker/service/link_actor.hpp"

using namespace sy;
using sy::test::env;
using namespace std::chrono_literals;

namespace {

engine_config small_engine() {
  engine_config c;
  c.n_kv_blocks = 64;
  c.block_size = 16;
  c.max_context = 512;
  c.sched.max_running = 4;
  return c;
}

std::vector<int32_t> chat_prompt(const std::string& q) {
  const auto& m = *env()->model;
  return m.vocab().encode(m.chat().apply({{"user", q}}));
}

proto::submit make_submit(const std::string& id, int32_t max_tokens, const std::string& question) {
  proto::submit s;
  s.request_id = id;
  s.prompt = chat_prompt(question);
  s.sampling.max_tokens = max_tokens;
  s.sampling.ignore_eos = true;  // greedy, exactly max_tokens tokens
  s.stream = true;
  return s;
}

// One frame the engine actor put in its outbox: [peer][type][body].
struct sent {
  std::string peer;
  std::string type;
  std::string body;
};

template <class T>
T as(const sent& f) {
  const auto r = proto::decode(f.type, f.body);
  REQUIRE(r.ok());
  const T* m = r.get_if<T>();
  REQUIRE(m != nullptr);
  return *m;
}

std::vector<std::string> types(const std::vector<sent>& frames) {
  std::vector<std::string> out;
  for (const auto& f : frames) out.push_back(f.type);
  return out;
}

// The engine actor on the test coordinator, with the link's end of its outbox.
struct engine_fixture {
  engine_fixture() {
    outbox.set(zmq::sockopt::linger, 0);
    outbox.bind(k_outbox_endpoint);
    eng = std::make_unique<engine>(*env()->model, env()->pool, small_engine());
    service_config sc;
    sc.worker_id = "worker-test";
    sc.model_id = "smollm2";
    actor = actors.spawn(engine_actor, &ctx, eng.get(), sc, metrics);
    actors.sched().run();  // initialisation and the first tick (no router yet: nothing to send)
  }

  template <class T>
  void send(const std::string& peer, const T& m) {
    caf::anon_send(actor, frame_atom::value, peer, std::string(proto::name(proto::type_of<T>)), proto::encode(m));
  }

  // Everything the actor has sent so far, in order.
  std::vector<sent> take() {
    std::vector<sent> out;
    std::vector<zmq::message_t> parts;
    while (zmq::recv_multipart(outbox, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
      REQUIRE(parts.size() == 3);
      out.push_back({parts[0].to_string(), parts[1].to_string(), parts[2].to_string()});
      parts.clear();
    }
    return out;
  }

  metrics_snapshot snapshot() {
    std::lock_guard<std::mutex> lk(metrics->mu);
    return metrics->snap;
  }

  // Declared first, destroyed last: every socket (the actor's outbox too) closes before it.
  zmq::context_t ctx{1};
  zmq::socket_t outbox{ctx, zmq::socket_type::pull};
  std::unique_ptr<engine> eng;
  std::shared_ptr<shared_metrics> metrics = std::make_shared<shared_metrics>();
  test::actor_env actors;  // stops the actor before the engine and the sockets go
  caf::actor actor;
};

// What the engine produces for `s` alone, stepped directly: the reference for the actor's stream.
std::vector<int32_t> reference_tokens(const proto::submit& s) {
  engine e(*env()->model, env()->pool, small_engine());
  sampling_params p;
  p.max_tokens = s.sampling.max_tokens;
  p.ignore_eos = s.sampling.ignore_eos;
  REQUIRE_FALSE(e.submit("ref", std::vector<token_id>(s.prompt.begin(), s.prompt.end()), p, 0).has_value());
  std::vector<int32_t> out;
  std::vector<request_event> ev;
  while (e.has_work()) {
    ev.clear();
    e.step(0, ev);
    for (const auto& x : ev) out.insert(out.end(), x.tokens.begin(), x.tokens.end());
  }
  return out;
}

bool has_line(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

}  // namespace

TEST_CASE("engine actor: hello gets a welcome and a heartbeat, then heartbeats follow every 500 ms of simulated time") {
  REQUIRE_MODEL();
  engine_fixture f;
  CHECK(f.take().empty());

  proto::hello h;
  h.router_id = "router-a";
  f.send("peer-a", h);
  f.actors.sched().run();
  auto out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"welcome", "heartbeat"});
  CHECK(out[0].peer == "peer-a");
  CHECK(out[1].peer == "peer-a");
  const auto w = as<proto::welcome>(out[0]);
  CHECK(w.worker_id == "worker-test");
  CHECK(w.model_id == "smollm2");
  CHECK(w.context_length == 512);
  CHECK(w.kv_block_size == 16);
  CHECK(w.kv_capacity_tokens == 64 * 16);
  CHECK(w.max_running == 4);
  CHECK(w.tokenizer.tokens.size() == static_cast<size_t>(env()->model->hparams().n_vocab));
  const auto hb = as<proto::heartbeat>(out[1]);
  CHECK(hb.running == 0);
  CHECK(hb.total_kv_blocks == 64);
  CHECK(hb.free_kv_blocks == 64);
  CHECK(hb.total_window_kv_blocks == 0);  // SmolLM2 has no sliding-window layers
  CHECK_FALSE(hb.draining);

  // The actor's first tick ran at spawn (t = 0); the next is due at 500 ms.
  f.actors.advance(400ms);
  CHECK(f.take().empty());
  f.actors.advance(100ms);
  out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"heartbeat"});
  CHECK(out[0].peer == "peer-a");

  // A second router: greeted at once (a hello sends a heartbeat round to every router), then in
  // every heartbeat round with the first.
  h.router_id = "router-b";
  f.send("peer-b", h);
  f.actors.sched().run();
  out = f.take();
  std::vector<std::string> to_b;
  for (const auto& x : out)
    if (x.peer == "peer-b") to_b.push_back(x.type);
  CHECK(to_b == std::vector<std::string>{"welcome", "heartbeat"});
  f.actors.advance(400ms);
  CHECK(f.take().empty());
  f.actors.advance(100ms);
  out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"heartbeat", "heartbeat"});
  CHECK(out[0].peer == "peer-a");
  CHECK(out[1].peer == "peer-b");
}

TEST_CASE("engine actor: a submit streams the engine's tokens in order, one step per message, then one finish") {
  REQUIRE_MODEL();
  const proto::submit s = make_submit("r1", 8, "What is the capital of France?");
  const std::vector<int32_t> expected = reference_tokens(s);
  REQUIRE(expected.size() == 8);

  engine_fixture f;
  f.send("peer-a", s);
  f.actors.sched().run_once();  // the submit frame: queued in the engine, nothing generated yet
  CHECK(f.take().empty());
  CHECK(f.snapshot().engine.waiting + f.snapshot().engine.running == 1);

  // Each step is one message of its own (frames from routers interleave with steps): the first
  // step runs the prompt and samples the first token, each later one decodes one more.
  std::vector<int32_t> got;
  std::string text;
  for (int step = 0; step < 8; ++step) {
    REQUIRE(f.actors.sched().has_job());
    f.actors.sched().run_once();
    const auto out = f.take();
    REQUIRE(types(out) == std::vector<std::string>{"tokens"});
    CHECK(out[0].peer == "peer-a");
    const auto t = as<proto::tokens>(out[0]);
    CHECK(t.request_id == "r1");
    REQUIRE(t.token_ids.size() == 1);
    got.push_back(t.token_ids[0]);
    text += t.text;
    if (step < 7) {
      CHECK(t.finish_reason == sy::finish_reason::none);
    } else {
      CHECK(t.finish_reason == sy::finish_reason::length);
      CHECK(t.usage.prompt_tokens == s.prompt.size());
      CHECK(t.usage.completion_tokens == 8);
    }
  }
  CHECK(got == expected);
  CHECK(text == env()->model->vocab().decode(expected));
  CHECK_FALSE(f.actors.sched().has_job());  // no work left: the actor stops stepping itself
  f.actors.sched().run();
  CHECK(f.take().empty());

  const metrics_snapshot m = f.snapshot();
  CHECK(m.engine.running == 0);
  CHECK(m.engine.waiting == 0);
  CHECK(m.engine.steps == 8);
  CHECK(m.service.finished[static_cast<int>(finish_reason::length)] == 1);
  CHECK(m.step_seconds.count() == 8);  // one observation per step
  CHECK(has_line(render_metrics(m), "switchyard_worker_generation_tokens_total 8"));
}

TEST_CASE("engine actor: a cancel takes effect at the next step and ends the request as cancelled") {
  REQUIRE_MODEL();
  engine_fixture f;
  f.send("peer-a", make_submit("r1", 64, "Write a haiku about the sea."));
  f.actors.sched().run_once();                              // submit
  for (int i = 0; i < 3; ++i) f.actors.sched().run_once();  // three steps
  auto out = f.take();
  REQUIRE(out.size() == 3);

  proto::cancel c;
  c.request_id = "r1";
  f.send("peer-a", c);
  // The mailbox now holds the step queued by the last one, then the cancel: that step still
  // produces a token, the cancel is handled between steps, the next step reports the end.
  f.actors.sched().run();
  out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"tokens", "tokens"});
  const auto fourth = as<proto::tokens>(out[0]);
  CHECK(fourth.token_ids.size() == 1);
  CHECK(fourth.finish_reason == sy::finish_reason::none);
  const auto last = as<proto::tokens>(out[1]);
  CHECK(last.request_id == "r1");
  CHECK(last.finish_reason == sy::finish_reason::cancelled);
  CHECK(last.token_ids.empty());
  CHECK(last.usage.completion_tokens == 4);

  const metrics_snapshot m = f.snapshot();
  CHECK(m.engine.running == 0);
  CHECK(m.engine.free_blocks == m.engine.total_blocks);  // its KV blocks are back
  CHECK(has_line(render_metrics(m), "switchyard_worker_requests_finished_total{reason=\"cancelled\"} 1"));

  f.send("peer-a", c);  // cancelling what already ended does nothing
  f.actors.sched().run();
  CHECK(f.take().empty());
}

TEST_CASE("engine actor: a router that becomes unreachable loses its requests, other routers' go on") {
  REQUIRE_MODEL();
  engine_fixture f;
  f.send("peer-a", make_submit("r1", 32, "Why is the sky blue?"));
  f.send("peer-b", make_submit("r1", 6, "List three prime numbers."));  // same id, other router
  f.actors.sched().run_once();
  f.actors.sched().run_once();
  f.actors.sched().run_once();  // one step: the first token of each
  auto out = f.take();
  REQUIRE(out.size() == 2);

  caf::anon_send(f.actor, gone_atom::value, std::string("peer-a"));
  f.actors.sched().run_once();  // the step queued before the news: both still get a token
  out = f.take();
  REQUIRE(out.size() == 2);
  f.actors.sched().run_once();  // peer-a is gone
  CHECK(f.take().empty());
  f.actors.sched().run();
  out = f.take();
  REQUIRE_FALSE(out.empty());
  for (const auto& x : out) CHECK(x.peer == "peer-b");  // nothing more for the router that left
  const auto last = as<proto::tokens>(out.back());
  CHECK(last.finish_reason == sy::finish_reason::length);
  CHECK(last.usage.completion_tokens == 6);

  const metrics_snapshot m = f.snapshot();
  CHECK(m.engine.running == 0);
  CHECK(m.service.peers_gone == 1);
  CHECK(m.service.finished[static_cast<int>(finish_reason::cancelled)] == 1);
  CHECK(m.service.finished[static_cast<int>(finish_reason::length)] == 1);
}

TEST_CASE("engine actor: draining refuses new submits as overloaded and finishes what runs") {
  REQUIRE_MODEL();
  engine_fixture f;
  proto::hello h;
  h.router_id = "router-a";
  f.send("peer-a", h);
  f.send("peer-a", make_submit("r1", 4, "Why is the sky blue?"));
  f.actors.sched().run_once();
  f.actors.sched().run_once();
  f.take();

  caf::anon_send(f.actor, drain_atom::value);
  f.send("peer-a", make_submit("r2", 4, "List three prime numbers."));
  f.actors.sched().run();
  const auto out = f.take();
  std::vector<std::string> finishes;
  std::vector<proto::error> errors;
  for (const auto& x : out) {
    if (x.type == "tokens") {
      const auto t = as<proto::tokens>(x);
      CHECK(t.request_id == "r1");
      if (t.finish_reason != sy::finish_reason::none) finishes.push_back(std::string(sy::name(t.finish_reason)));
    } else if (x.type == "error") {
      errors.push_back(as<proto::error>(x));
    }
  }
  CHECK(finishes == std::vector<std::string>{"length"});
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].request_id == "r2");
  CHECK(errors[0].code == proto::error_code::overloaded);
  CHECK(f.snapshot().draining);

  f.actors.advance(500ms);  // the next heartbeat tells routers
  const auto hb = f.take();
  REQUIRE(types(hb) == std::vector<std::string>{"heartbeat"});
  CHECK(as<proto::heartbeat>(hb[0]).draining);
}

TEST_CASE("engine actor: bad frames are answered with errors and the actor keeps serving") {
  REQUIRE_MODEL();
  engine_fixture f;
  caf::anon_send(f.actor, frame_atom::value, std::string("peer-a"), std::string("submit"),
                 std::string("\xc1 not msgpack"));
  f.actors.sched().run();
  auto out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"error"});
  CHECK(as<proto::error>(out[0]).code == proto::error_code::bad_message);

  proto::submit oov = make_submit("r-oov", 4, "Hi");
  oov.prompt.push_back(1'000'000);  // outside the vocabulary
  f.send("peer-a", oov);
  f.send("peer-a", make_submit("r-dup", 4, "Hi"));
  f.send("peer-a", make_submit("r-dup", 4, "Hi"));
  f.actors.sched().run_once();
  f.actors.sched().run_once();
  f.actors.sched().run_once();
  out = f.take();
  REQUIRE(types(out) == std::vector<std::string>{"error", "error"});
  const auto e1 = as<proto::error>(out[0]);
  CHECK(e1.request_id == "r-oov");
  CHECK(e1.code == proto::error_code::invalid_request);
  const auto e2 = as<proto::error>(out[1]);
  CHECK(e2.request_id == "r-dup");
  CHECK(e2.code == proto::error_code::duplicate_request);

  f.actors.sched().run();  // the first r-dup still runs to its end
  out = f.take();
  REQUIRE_FALSE(out.empty());
  const auto last = as<proto::tokens>(out.back());
  CHECK(last.request_id == "r-dup");
  CHECK(last.finish_reason == sy::finish_reason::length);
  const metrics_snapshot m = f.snapshot();
  CHECK(m.service.bad_messages == 1);
  CHECK(m.service.rejected == 2);
}

// ---- link actor -----------------------------------------------------------------------------

namespace {

constexpr const char* k_listen = "inproc://test-worker-link";

// Bounds every wait for the link, so that a broken link fails the test instead of hanging it;
// never reached when the link works (and nothing is measured).
constexpr auto k_hang_guard = std::chrono::seconds(60);

// The link on its own thread, a scoped actor standing in for the engine, and a router's DEALER.
struct link_fixture {
  link_fixture() {
    engine->monitor(link);
    router.set(zmq::sockopt::routing_id, "router-a");
    router.set(zmq::sockopt::linger, 0);
    router.set(zmq::sockopt::rcvtimeo, static_cast<int>(std::chrono::milliseconds(k_hang_guard).count()));
    router.connect(k_listen);  // inproc: may precede the link's bind
    to_link.set(zmq::sockopt::linger, 0);
    to_link.connect(k_outbox_endpoint);
  }
  ~link_fixture() { stop_link(); }

  // The next message from the link to the engine, handed to `f` (fails if the link died).
  template <class F>
  void engine_receive(F f) {
    engine->receive(
        f, [](const caf::down_msg& dm) { FAIL("the link stopped: " << caf::to_string(dm.reason)); },
        caf::after(k_hang_guard) >> [] { FAIL("the link sent the engine nothing"); });
  }

  // Stops the link and waits for its end; counters are final afterwards.
  void stop_link() {
    if (stopped_) return;
    stopped_ = true;
    stop->store(true);
    engine->receive([](const caf::down_msg&) {}, caf::after(k_hang_guard) >> [] { FAIL("the link did not stop"); });
  }

  // The next frame a router receives from the link (blocks until it comes).
  std::vector<std::string> router_recv() {
    std::vector<zmq::message_t> parts;
    REQUIRE(zmq::recv_multipart(router, std::back_inserter(parts)));
    std::vector<std::string> out;
    for (auto& p : parts) out.push_back(p.to_string());
    return out;
  }

  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::dealer};
  zmq::socket_t to_link{ctx, zmq::socket_type::push};  // the engine's outbox
  test::actor_env actors;
  caf::scoped_actor engine{actors.sys()};
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<link_counters> counters = std::make_shared<link_counters>();
  static link_config make_link_config() {
    link_config c;
    c.listen = k_listen;
    c.high_water_mark = 1000;
    return c;
  }
  caf::actor link =
      actors.sys().spawn(link_actor, &ctx, make_link_config(), caf::actor_cast<caf::actor>(engine), stop, counters);

 private:
  bool stopped_ = false;
};

}  // namespace

TEST_CASE("worker link: a router's frames reach the engine and the engine's replies reach that router") {
  link_fixture f;
  zmq::send_multipart(f.router, std::array<zmq::const_buffer, 2>{zmq::str_buffer("hello"), zmq::str_buffer("body-1")});
  f.engine_receive([&](frame_atom, const std::string& peer, const std::string& type, const std::string& body) {
    CHECK(peer == "router-a");
    CHECK(type == "hello");
    CHECK(body == "body-1");
  });

  zmq::send_multipart(f.to_link, std::array<zmq::const_buffer, 3>{zmq::str_buffer("router-a"),
                                                                  zmq::str_buffer("welcome"), zmq::str_buffer("w")});
  CHECK(f.router_recv() == std::vector<std::string>{"welcome", "w"});

  f.stop_link();
  CHECK(f.counters->frames_in == 1);
  CHECK(f.counters->frames_out == 1);
  CHECK(f.counters->malformed_envelopes == 0);
}

TEST_CASE("worker link: a frame that is not [type][body] is answered with bad_message and never reaches the engine") {
  link_fixture f;
  zmq::send_multipart(f.router, std::array<zmq::const_buffer, 1>{zmq::str_buffer("lonely")});
  const auto reply = f.router_recv();
  REQUIRE(reply.size() == 2);
  CHECK(reply[0] == "error");
  const auto r = proto::decode(reply[0], reply[1]);
  REQUIRE(r.ok());
  REQUIRE(r.get_if<proto::error>() != nullptr);
  CHECK(r.get_if<proto::error>()->code == proto::error_code::bad_message);

  zmq::send_multipart(
      f.router, std::array<zmq::const_buffer, 3>{zmq::str_buffer("a"), zmq::str_buffer("b"), zmq::str_buffer("c")});
  zmq::send_multipart(f.router, std::array<zmq::const_buffer, 2>{zmq::str_buffer("cancel"), zmq::str_buffer("x")});
  // The first message the engine gets is the valid frame sent after both malformed ones.
  f.engine_receive([&](frame_atom, const std::string&, const std::string& type, const std::string& body) {
    CHECK(type == "cancel");
    CHECK(body == "x");
  });
  CHECK(f.router_recv()[0] == "error");  // the three-part frame was answered too

  f.stop_link();
  CHECK(f.counters->frames_in == 3);
  CHECK(f.counters->malformed_envelopes == 2);
}

TEST_CASE("worker link: a reply to a router that is not connected tells the engine that router is gone") {
  link_fixture f;
  zmq::send_multipart(f.to_link, std::array<zmq::const_buffer, 3>{zmq::str_buffer("router-x"),
                                                                  zmq::str_buffer("tokens"), zmq::str_buffer("t")});
  f.engine_receive([&](gone_atom, const std::string& peer) { CHECK(peer == "router-x"); });
  f.stop_link();
  CHECK(f.counters->unreachable == 1);
  CHECK(f.counters->frames_out == 0);
}
