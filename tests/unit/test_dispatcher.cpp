// The router's core state class driven by hand: no sockets, threads or sleeps. Time is the
// `now_s` argument; worker frames are encoded with the real protocol and fed through on_frame;
// what the dispatcher sends is decoded back from its link frames; clients are fake exchanges
// that record every call. A welcome carries a tokenizer (the router builds its model entry from
// it): the tiny in-memory vocabulary of tiny_vocab.hpp, so no case needs the model file.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/wire/protocol.hpp"
#include "router/dispatch/cache_replay.hpp"
#include "router/dispatch/dispatcher.hpp"
#include "router/http/api_handler.hpp"
#include "tests/unit/router_fakes.hpp"

using namespace sy::router;
namespace proto = sy::proto;
using json = nlohmann::json;

namespace {

constexpr const char* k_model = "smollm2-135m";
using sy::test::fake_exchange;
using sy::test::header;
using sy::test::header_list;
using sy::test::tiny_vocab;

// The body of a frame the dispatcher sent, decoded as T (the test fails if it is not one).
template <class T>
T as(const link_frame& f) {
  const auto r = proto::decode(f.type, f.body);
  REQUIRE(r.ok());
  const T* m = r.get_if<T>();
  REQUIRE(m != nullptr);
  return *m;
}

std::vector<std::string> types(const std::vector<link_frame>& frames) {
  std::vector<std::string> out;
  for (const auto& f : frames) out.push_back(f.type);
  return out;
}

std::vector<proto::submit> submits(const std::vector<link_frame>& frames, worker_ref worker) {
  std::vector<proto::submit> out;
  for (const auto& f : frames)
    if (f.worker == worker && f.type == "submit") out.push_back(as<proto::submit>(f));
  return out;
}

std::vector<proto::cancel> cancels(const std::vector<link_frame>& frames, worker_ref worker) {
  std::vector<proto::cancel> out;
  for (const auto& f : frames)
    if (f.worker == worker && f.type == "cancel") out.push_back(as<proto::cancel>(f));
  return out;
}

dispatcher_config test_config(int32_t local_queue = 2) {
  dispatcher_config c;
  c.router_id = "test-router";
  c.pool.local_queue = local_queue;
  c.pool.heartbeat_timeout_s = 2.0;
  return c;
}

struct request_opts {
  int32_t priority = 0;
  bool stream = false;
  bool include_usage = false;
  bool chat = false;
  int32_t n = 1;
  int32_t max_tokens = 16;
  double timeout_s = 0;
  double queue_timeout_s = 0;  // the request's own "queue_timeout"
  std::string api_key{};       // picks the tenant
  bool gone = false;           // the client left before the dispatcher saw the request
  std::string model = k_model;
  bool start_stream_throws = false;  // the exchange fails to start the stream
  std::string cache_key{};           // cacheable: identical requests in flight are coalesced
  std::string prompt = "The quick brown fox";
};

struct client {
  uint64_t id = 0;
  std::shared_ptr<fake_exchange> ex;
};

// One dispatcher with its tenants and model registry, plus the frames it has sent (`out`).
struct harness {
  explicit harness(dispatcher_config cfg = test_config(), tenant_registry t = tenant_registry::open_access())
      : tenants(std::move(t)), d(std::move(cfg), tenants, models) {}

  // The ref of the worker at `endpoint`, listed now.
  worker_ref add_worker(const std::string& endpoint, double now_s) {
    d.add_worker(endpoint, now_s, out);
    return ref_of(endpoint);
  }
  worker_ref ref_of(const std::string& endpoint) const {
    for (const auto& [ref, v] : d.workers().all())
      if (v.endpoint == endpoint) return ref;
    FAIL("no worker at " << endpoint);
    return 0;
  }
  void feed(worker_ref w, proto::msg_type type, const std::string& body, double now_s) {
    d.on_frame(w, proto::name(type), body, now_s, now_s, out);
  }
  void welcome(worker_ref w, uint32_t max_running, double now_s, const std::string& worker_id = "",
               const std::string& model = k_model, uint32_t context_length = 2048) {
    proto::welcome m;
    m.worker_id = worker_id.empty() ? "worker-" + std::to_string(w) : worker_id;
    m.model_id = model;
    m.context_length = context_length;
    m.kv_capacity_tokens = 4096;
    m.kv_block_size = 16;
    m.max_running = max_running;
    m.tokenizer = tiny_vocab();
    feed(w, proto::msg_type::welcome, proto::encode(m), now_s);
  }
  void heartbeat(worker_ref w, double now_s, bool draining = false) {
    proto::heartbeat m;
    m.draining = draining;
    feed(w, proto::msg_type::heartbeat, proto::encode(m), now_s);
  }
  // One tokens message: `n_new` new token ids, the text they decode to, usage totals so far.
  // `stop`: the stop string the worker names in a last frame that ends with "stop" on one.
  void tokens(worker_ref w, const std::string& wire_id, uint32_t n_new, const std::string& text, uint32_t completion,
              double now_s, const std::string& finish = "", uint32_t prompt = 0, uint32_t cached = 0,
              const std::string& stop = "") {
    proto::tokens m;
    m.request_id = wire_id;
    m.stop = stop;
    for (uint32_t i = 0; i < n_new; ++i) m.token_ids.push_back(static_cast<int32_t>(100 + i));
    m.text = text;
    m.finish_reason = sy::parse_finish_reason(finish).value();  // the worker's wire name
    m.usage = {prompt, cached, completion};
    feed(w, proto::msg_type::tokens, proto::encode(m), now_s);
  }
  void error(worker_ref w, const std::string& wire_id, sy::error_code code, double now_s) {
    proto::error m;
    m.request_id = wire_id;
    m.code = code;
    m.message = "refused by the test";
    feed(w, proto::msg_type::error, proto::encode(m), now_s);
  }

  client request(const request_opts& o, double now_s) {
    auto r = std::make_shared<routed_request>();
    r->id = next_id++;
    r->request_id = "req-" + std::to_string(r->id);
    auto ex = std::make_shared<fake_exchange>();
    ex->gone = o.gone;
    ex->throw_start_stream = o.start_stream_throws;
    r->ex = ex;
    r->who = tenants.authenticate(o.api_key);
    REQUIRE(r->who != nullptr);
    r->set_priority(o.priority);
    r->req.kind = o.chat ? endpoint::chat_completions : endpoint::completions;
    r->req.model = o.model;
    r->req.n = o.n;
    r->req.stream = o.stream;
    r->req.include_usage = o.include_usage;
    r->req.sampling.max_tokens = o.max_tokens;
    r->model = models.find(o.model);
    REQUIRE(r->model != nullptr);
    r->prompt = r->model->tok.encode(o.prompt);
    r->meta.id = (o.chat ? "chatcmpl-" : "cmpl-") + std::to_string(r->id);
    r->meta.model = o.model;
    r->meta.created = 1700000000;
    r->meta.kind = r->req.kind;
    r->t_received_s = r->t_parsed_s = now_s;
    r->timeout_s = o.timeout_s;
    r->queue_timeout_s = o.queue_timeout_s;
    r->cache_key = o.cache_key;
    const uint64_t id = r->id;
    d.on_request(std::move(r), now_s, out);
    return {id, ex};
  }

  std::vector<link_frame> take() { return std::exchange(out, {}); }

  tenant_registry tenants;
  model_registry models;
  dispatcher d;
  std::vector<link_frame> out;
  uint64_t next_id = 1;
};

std::string wire(uint64_t id, uint32_t attempt, uint32_t choice = 0) {
  return std::to_string(id) + "-" + std::to_string(attempt) + "." + std::to_string(choice);
}

// A harness with `n` workers welcomed at t=0, their connect/hello/welcome frames drained.
void start_workers(harness& h, size_t n, uint32_t max_running) {
  for (size_t w = 0; w < n; ++w) {
    const worker_ref i = h.add_worker("tcp://w" + std::to_string(w) + ":5555", 0.0);
    h.welcome(i, max_running, 0.0);
  }
  h.take();
}

}  // namespace

TEST_CASE("dispatcher: the tiny vocabulary is a tokenizer the router builds a model entry from") {
  harness h;
  const worker_ref w = h.add_worker("tcp://w0:5555", 0.0);
  h.welcome(w, 4, 0.0);
  const auto m = h.models.find(k_model);
  REQUIRE(m != nullptr);
  REQUIRE(m->tmpl.supported());
  const sy::tokenizer& tok = m->tok;
  CHECK(tok.vocab_size() == tiny_vocab().tokens.size());
  CHECK(tok.bos() == tiny_vocab().bos_id);
  CHECK(tok.eos() == tiny_vocab().eos_id);
  CHECK(tok.is_eog(tok.eos()));
  // Every text encodes (a token per byte at worst) and decodes back as it was; the merges make
  // the words the tests send fewer tokens than bytes.
  for (const std::string text : {"The quick brown fox", "Hello, world!", "Hi", "caf\xC3\xA9 \xE2\x9C\x93\n\t~"}) {
    const auto ids = tok.encode(text);
    CHECK(tok.decode(ids) == text);
    CHECK_FALSE(ids.empty());
    CHECK(ids.size() <= text.size());
  }
  CHECK(tok.encode("The quick brown fox").size() == 4);
  CHECK(tok.encode("Hello").size() == 1);
  // Its chat template is ChatML, whose markers are single control tokens.
  const auto chat = m->chat_prompt({{"user", "Hi"}}, /*add_generation_prompt=*/true);
  const auto im_start = tok.encode("<|im_start|>"), im_end = tok.encode("<|im_end|>");
  REQUIRE(im_start.size() == 1);
  REQUIRE(im_end.size() == 1);
  CHECK(chat.front() == im_start[0]);
  CHECK(std::count(chat.begin(), chat.end(), im_start[0]) == 2);  // the user's turn, the assistant's
  CHECK(std::count(chat.begin(), chat.end(), im_end[0]) == 1);
  CHECK(tok.decode(chat, /*render_special=*/true) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("dispatcher: a new worker is connected, greeted, and ready after its welcome") {
  harness h;
  const worker_ref w = h.add_worker("tcp://w0:5555", 0.0);
  auto f = h.take();
  REQUIRE(types(f) == std::vector<std::string>{"_connect", "hello"});
  CHECK(f[0].worker == w);
  CHECK(f[0].body == "tcp://w0:5555");
  CHECK(f[1].worker == w);
  const auto hello = as<proto::hello>(f[1]);
  CHECK(hello.router_id == "test-router");
  CHECK(hello.version == proto::k_protocol_version);

  h.add_worker("tcp://w0:5555", 0.1);  // known endpoint: no second connection
  CHECK(h.out.empty());
  CHECK_FALSE(h.d.ready(0.2));
  CHECK(h.d.workers().n_ready() == 0);
  CHECK(h.models.find(k_model) == nullptr);

  h.d.tick(1.2, h.out);  // unanswered hello is retried after hello_retry_s, the stale one dropped
  f = h.take();
  REQUIRE(types(f) == std::vector<std::string>{"_flush", "hello"});

  h.welcome(w, 4, 1.3);
  h.heartbeat(w, 1.4);
  CHECK(h.d.ready(1.4));
  CHECK(h.d.workers().n_ready() == 1);
  const auto m = h.models.find(k_model);
  REQUIRE(m != nullptr);
  CHECK(m->context_length == 2048);
  CHECK(m->tok.vocab_size() == tiny_vocab().tokens.size());

  h.d.tick(3.0, h.out);  // ready and heard from: no more hellos
  CHECK(h.take().empty());
}

TEST_CASE("dispatcher: a non-streamed completion is submitted and answered once with the whole text") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({.priority = 3, .max_tokens = 20}, 0.1);
  auto f = h.take();
  auto s = submits(f, 0);
  REQUIRE(s.size() == 1);
  REQUIRE(f.size() == 1);
  CHECK(s[0].request_id == wire(c.id, 1));
  CHECK(s[0].prompt == h.models.find(k_model)->tok.encode("The quick brown fox"));
  CHECK(s[0].sampling.max_tokens == 20);
  CHECK(s[0].priority == 3);
  CHECK(h.d.active() == 1);
  CHECK(h.d.queued() == 0);

  const auto n_prompt = static_cast<uint32_t>(s[0].prompt.size());
  h.tokens(0, wire(c.id, 1), 2, "Hello", 2, 0.2, "", n_prompt, 4);
  h.tokens(0, wire(c.id, 1), 1, ", world", 3, 0.3, "", n_prompt, 4);
  CHECK(c.ex->log.empty());  // nothing reaches the client before the end
  h.tokens(0, wire(c.id, 1), 1, "!", 4, 0.4, "stop", n_prompt, 4);

  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  const http_response& resp = c.ex->responses[0];
  CHECK(resp.status == 200);
  CHECK(header(resp.headers, "X-Request-Id") == "req-1");
  const json b = c.ex->body();
  CHECK(b["object"] == "text_completion");
  CHECK(b["id"] == "cmpl-1");
  REQUIRE(b["choices"].size() == 1);
  CHECK(b["choices"][0]["text"] == "Hello, world!");
  CHECK(b["choices"][0]["finish_reason"] == "stop");
  CHECK(b["usage"]["prompt_tokens"] == n_prompt);
  CHECK(b["usage"]["completion_tokens"] == 4);
  CHECK(b["usage"]["total_tokens"] == n_prompt + 4);
  CHECK(b["usage"]["prompt_tokens_details"]["cached_tokens"] == 4);
  CHECK(h.d.active() == 0);
  CHECK(h.d.workers().at(0).in_flight == 0);
}

TEST_CASE("dispatcher: a stream's first tokens go out at once even without text, later textless ones wait") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({.stream = true, .chat = true}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  // The first token is half of a UTF-8 character: no text yet, but the client learns its first
  // token was generated (the time to first token is now, not when the text completes).
  h.tokens(0, wire(c.id, 1), 1, "", 1, 0.2);
  REQUIRE(c.ex->events.size() == 1);
  const json first = c.ex->event(0);
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK_FALSE(first["choices"][0]["delta"].contains("content"));
  h.tokens(0, wire(c.id, 1), 1, "", 2, 0.3);  // still no text: nothing new to say
  CHECK(c.ex->events.size() == 1);
  h.tokens(0, wire(c.id, 1), 1, "\xc3\xa9", 3, 0.4);
  REQUIRE(c.ex->events.size() == 2);
  CHECK(c.ex->event(1)["choices"][0]["delta"]["content"] == "\xc3\xa9");
  CHECK_FALSE(c.ex->event(1)["choices"][0]["delta"].contains("role"));
}

TEST_CASE("dispatcher: a streamed chat request gets chunks, a usage chunk, then [DONE]") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({.stream = true, .include_usage = true, .chat = true}, 0.1);
  REQUIRE(c.ex->log == std::vector<std::string>{"start_stream"});  // headers go out at once
  CHECK(c.ex->stream_status == 200);
  CHECK(header(c.ex->stream_headers, "X-Request-Id") == "req-1");
  const auto s = submits(h.take(), 0);
  REQUIRE(s.size() == 1);
  CHECK(s[0].stream);

  h.tokens(0, wire(c.id, 1), 1, "Hi", 1, 0.2, "", 5, 0);
  h.tokens(0, wire(c.id, 1), 2, " there", 3, 0.3, "", 5, 0);
  REQUIRE(c.ex->events.size() == 2);
  h.tokens(0, wire(c.id, 1), 0, "", 3, 0.4, "stop", 5, 0);

  REQUIRE(c.ex->log == std::vector<std::string>{"start_stream", "send_event", "send_event", "send_event", "send_event",
                                                "send_event", "end_stream"});
  const json first = c.ex->event(0);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["id"] == "chatcmpl-1");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["choices"][0]["delta"]["content"] == "Hi");
  CHECK(first["choices"][0]["finish_reason"].is_null());
  const json second = c.ex->event(1);
  CHECK_FALSE(second["choices"][0]["delta"].contains("role"));
  CHECK(second["choices"][0]["delta"]["content"] == " there");
  const json last = c.ex->event(2);
  CHECK(last["choices"][0]["finish_reason"] == "stop");
  CHECK_FALSE(last["choices"][0]["delta"].contains("content"));
  const json usage = c.ex->event(3);
  CHECK(usage["object"] == "chat.completion.chunk");
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["prompt_tokens"] == 5);
  CHECK(usage["usage"]["completion_tokens"] == 3);
  CHECK(c.ex->events[4] == "[DONE]");
  CHECK(h.d.active() == 0);
}

TEST_CASE("dispatcher: with one slot, an interactive request overtakes queued batch work") {
  harness h(test_config(/*local_queue=*/0));
  start_workers(h, 1, /*max_running=*/1);
  const auto a = h.request({.priority = 5}, 0.1);
  const auto b = h.request({.priority = 5}, 0.2);
  const auto c = h.request({.priority = -1}, 0.3);
  auto s = submits(h.take(), 0);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == wire(a.id, 1));
  CHECK(s[0].priority == 5);
  CHECK(h.d.queued() == 2);

  h.tokens(0, wire(a.id, 1), 1, "done", 1, 0.4, "stop");
  CHECK(a.ex->responses.size() == 1);
  s = submits(h.take(), 0);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == wire(c.id, 1));
  CHECK(s[0].priority == -1);
  CHECK(h.d.queued() == 1);

  h.tokens(0, wire(c.id, 1), 1, "done", 1, 0.5, "stop");
  s = submits(h.take(), 0);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == wire(b.id, 1));
  CHECK(h.d.queued() == 0);
  CHECK(b.ex->log.empty());
}

TEST_CASE("dispatcher: a tenant over its request rate gets 429 with Retry-After") {
  auto tenants = tenant_registry::parse(R"({"tenants": [
      {"name": "slow", "keys": ["sk-slow"], "requests_per_s": 1},
      {"name": "fast", "keys": ["sk-fast"]}]})");
  harness h(test_config(), std::move(tenants));
  start_workers(h, 1, 4);
  const auto first = h.request({.api_key = "sk-slow"}, 1.0);
  CHECK(first.ex->log.empty());
  CHECK(submits(h.take(), 0).size() == 1);

  const auto second = h.request({.api_key = "sk-slow"}, 1.1);
  REQUIRE(second.ex->log == std::vector<std::string>{"respond"});
  const http_response& resp = second.ex->responses[0];
  CHECK(resp.status == 429);
  CHECK(header(resp.headers, "Retry-After") == "1");
  CHECK(header(resp.headers, "X-Request-Id") == "req-2");
  const json b = second.ex->body();
  CHECK(b["error"]["code"] == "tenant_rate");
  CHECK(b["error"]["type"] == "rate_limit_error");
  CHECK(h.take().empty());  // nothing was submitted for it

  const auto other = h.request({.api_key = "sk-fast"}, 1.1);  // other tenants are unaffected
  CHECK(other.ex->log.empty());
  const auto later = h.request({.api_key = "sk-slow"}, 2.1);  // the bucket refilled
  CHECK(later.ex->log.empty());
  CHECK(submits(h.take(), 0).size() == 2);
  CHECK(h.d.render_metrics(10.0).find("switchyard_router_admission_rejections_total{reason=\"tenant_rate\"} 1\n") !=
        std::string::npos);
}

TEST_CASE("dispatcher: a priority outside the tenant's range runs clamped and says so, a strict tenant's is a 403") {
  auto tenants = tenant_registry::parse(R"({"tenants": [
      {"name": "low", "keys": ["sk-low"], "priority": {"default": 2, "min": 0, "max": 5}},
      {"name": "strict", "keys": ["sk-strict"], "priority": {"default": 2, "min": 0, "max": 5, "strict": true}}]})");
  harness h(test_config(), std::move(tenants));
  start_workers(h, 1, 4);
  const auto clamped = h.request({.priority = -3, .api_key = "sk-low"}, 0.1);
  const auto inside = h.request({.priority = 4, .api_key = "sk-low", .prompt = "Another prompt"}, 0.1);
  const auto s = submits(h.take(), 0);
  REQUIRE(s.size() == 2);
  CHECK(s[0].priority == 0);
  CHECK(s[1].priority == 4);
  const uint64_t ids[] = {clamped.id, inside.id};
  for (const uint64_t id : ids) {
    h.tokens(0, wire(id, 1), 1, " jumps", 1, 0.2, "stop", 4, 0);
  }
  REQUIRE(clamped.ex->responses.size() == 1);
  CHECK(clamped.ex->responses[0].status == 200);
  CHECK(header(clamped.ex->responses[0].headers, "X-Switchyard-Priority") == "0");
  REQUIRE(inside.ex->responses.size() == 1);
  CHECK(header(inside.ex->responses[0].headers, "X-Switchyard-Priority").empty());  // nothing changed

  // A stream says it in its head.
  const auto streamed = h.request({.priority = 9, .stream = true, .api_key = "sk-low", .prompt = "A third"}, 0.3);
  CHECK(header(streamed.ex->stream_headers, "X-Switchyard-Priority") == "5");
  CHECK(submits(h.take(), 0)[0].priority == 5);

  const auto refused = h.request({.priority = -3, .api_key = "sk-strict"}, 0.4);
  REQUIRE(refused.ex->log == std::vector<std::string>{"respond"});
  CHECK(refused.ex->responses[0].status == 403);
  CHECK(header(refused.ex->responses[0].headers, "Retry-After").empty());
  CHECK(refused.ex->body()["error"]["code"] == "priority_not_allowed");
  CHECK(h.d.render_metrics(1.0).find(
            "switchyard_router_admission_rejections_total{reason=\"priority_not_allowed\"} 1\n") != std::string::npos);
}

TEST_CASE("dispatcher: a burst on an idle cluster is admitted, and a deadline the measured queue wait passes is 503") {
  harness h;  // local queue 2: the worker holds 3 requests, the rest wait in the router
  start_workers(h, 1, /*max_running=*/1);
  const worker_ref w = 0;
  double t = 0;
  for (; t < 10.0; t += 0.1) {  // a long idle start: nothing queued, nothing done
    h.heartbeat(w, t);
    h.d.tick(t, h.out);
  }
  // A burst; its first token comes slowly (the worker is busy with prefills). A wait estimated
  // from the output of the first seconds (one token) would refuse all of these on their deadline.
  std::vector<client> burst;
  for (int i = 0; i < 20; ++i) burst.push_back(h.request({.timeout_s = 60, .prompt = "Another prompt"}, t));
  std::vector<std::string> running;
  for (const auto& s : submits(h.take(), w)) running.push_back(s.request_id);
  REQUIRE(running.size() == 3);
  h.tokens(w, running[0], 1, " a", 1, t + 0.5, "", 2, 0);
  for (int i = 0; i < 20; ++i) {
    h.heartbeat(w, t + 0.6 + 0.1 * i);
    h.d.tick(t + 0.6 + 0.1 * i, h.out);
    burst.push_back(h.request({.timeout_s = 60, .prompt = "Another prompt"}, t + 0.6 + 0.1 * i));
  }
  t += 2.6;
  for (const client& c : burst) CHECK(c.ex->log.empty());  // queued or running, none refused
  // The worker now finishes one request every 0.5 s: each clears prompt + max_tokens = 18 tokens
  // of queued work, 36 a second, with the queue never empty.
  for (int k = 0; k < 12; ++k) {
    for (int i = 0; i < 5; ++i, t += 0.1) {
      h.heartbeat(w, t);
      h.d.tick(t, h.out);
    }
    h.tokens(w, running.front(), 16, " done", 16, t, "length", 2, 0);
    running.erase(running.begin());
    for (const auto& s : submits(h.take(), w)) running.push_back(s.request_id);
  }
  const size_t queued = h.d.queued();
  REQUIRE(queued >= 20);
  const double wait = static_cast<double>(queued) * 18 / 36;  // the estimate, about
  // A request that cannot be dispatched before its deadline is refused at once...
  const auto late = h.request({.timeout_s = wait / 3, .prompt = "Another prompt"}, t);
  REQUIRE(late.ex->log == std::vector<std::string>{"respond"});
  CHECK(late.ex->responses[0].status == 503);
  CHECK(late.ex->body()["error"]["code"] == "deadline");
  const std::string message = late.ex->body()["error"]["message"];
  INFO(message);
  const double said = std::stod(message.substr(message.find("wait ") + 5));
  CHECK(said == Approx(wait).epsilon(0.25));
  CHECK(std::stoi(header(late.ex->responses[0].headers, "Retry-After")) >= 1);
  // ...one with time enough queues.
  const auto fine = h.request({.timeout_s = wait * 3, .prompt = "Another prompt"}, t);
  CHECK(fine.ex->log.empty());
}

TEST_CASE("dispatcher: a full cluster queue answers 429 queue_full") {
  dispatcher_config cfg = test_config(/*local_queue=*/0);
  cfg.admission.max_queued_requests = 1;
  cfg.admission.shed_fraction = {1.0, 1.0, 1.0};  // no class is shed early: the cap is exactly 1
  harness h(cfg);
  start_workers(h, 1, /*max_running=*/1);
  const auto running = h.request({}, 0.1);
  const auto queued = h.request({}, 0.2);
  CHECK(h.d.queued() == 1);
  CHECK(queued.ex->log.empty());

  const auto refused = h.request({}, 0.3);
  REQUIRE(refused.ex->log == std::vector<std::string>{"respond"});
  CHECK(refused.ex->responses[0].status == 429);
  CHECK_FALSE(header(refused.ex->responses[0].headers, "Retry-After").empty());
  const json b = refused.ex->body();
  CHECK(b["error"]["code"] == "queue_full");
  CHECK(b["error"]["type"] == "rate_limit_error");
  CHECK(h.d.queued() == 1);
  CHECK(h.d.active() == 2);
  CHECK(h.d.render_metrics(10.0).find("switchyard_router_admission_rejections_total{reason=\"queue_full\"} 1\n") !=
        std::string::npos);
}

TEST_CASE("dispatcher: a request on a dead worker that sent nothing is re-submitted to another") {
  harness h;
  start_workers(h, 2, 4);
  const auto c = h.request({}, 0.1);
  auto s = submits(h.take(), 0);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == wire(c.id, 1));

  h.heartbeat(1, 1.5);  // worker 1 stays alive; worker 0 goes silent
  h.d.tick(1.9, h.out);
  CHECK(h.take().empty());
  h.d.tick(2.5, h.out);
  const auto f = h.take();
  REQUIRE_FALSE(f.empty());
  CHECK(f[0].worker == 0);
  CHECK(f[0].type == "_flush");
  CHECK(h.d.workers().at(0).state == worker_state::dead);
  CHECK(h.d.ready(2.5));
  s = submits(f, 1);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == wire(c.id, 2));  // a new attempt: the old wire id is dead
  CHECK(s[0].prompt == h.models.find(k_model)->tok.encode("The quick brown fox"));
  CHECK(submits(f, 0).empty());
  CHECK(c.ex->log.empty());  // the client noticed nothing

  h.tokens(0, wire(c.id, 1), 1, "stale", 1, 2.6);  // the old worker wakes up: ignored
  h.tokens(1, wire(c.id, 2), 1, "fresh", 1, 2.7);
  h.tokens(1, wire(c.id, 2), 1, " text", 2, 2.8, "length");
  h.tokens(0, wire(c.id, 1), 1, " more", 2, 2.9, "stop");
  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  CHECK(c.ex->responses[0].status == 200);
  const json b = c.ex->body();
  CHECK(b["choices"][0]["text"] == "fresh text");
  CHECK(b["choices"][0]["finish_reason"] == "length");
  CHECK(b["usage"]["completion_tokens"] == 2);
  const std::string metrics = h.d.render_metrics(10.0);
  CHECK(metrics.find("switchyard_router_redispatched_total 1\n") != std::string::npos);
  CHECK(metrics.find("switchyard_router_late_frames_total 2\n") != std::string::npos);
}

TEST_CASE("dispatcher: a stream whose worker dies after sending tokens continues on another from what it sent") {
  harness h;
  start_workers(h, 2, 4);
  const auto c = h.request({.stream = true, .include_usage = true, .max_tokens = 3}, 0.1);
  auto s = submits(h.take(), 0);
  REQUIRE(s.size() == 1);
  const auto prompt = s[0].prompt;
  h.tokens(0, wire(c.id, 1), 1, "Once", 1, 0.2);  // token id 100
  REQUIRE(c.ex->events.size() == 1);

  h.heartbeat(1, 1.5);
  h.d.tick(2.5, h.out);
  s = submits(h.take(), 1);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == wire(c.id, 2));
  auto resumed = prompt;
  resumed.push_back(100);
  CHECK(s[0].prompt == resumed);  // the prompt plus what the client has, recomputed as output
  CHECK(s[0].n_generated == 1);
  CHECK(s[0].sampling.max_tokens == 3);  // the original limit: the worker counts the resumed token
  CHECK(c.ex->log == std::vector<std::string>{"start_stream", "send_event"});  // a pause, no error

  h.tokens(0, wire(c.id, 1), 1, " stale", 2, 2.6);  // the old worker wakes up: ignored
  h.tokens(1, wire(c.id, 2), 2, " upon a", 3, 2.7, "length", 5, 0);
  REQUIRE(c.ex->events.size() == 4);  // "Once", " upon a" + finish, usage, [DONE]
  CHECK(c.ex->event(1)["choices"][0]["text"] == " upon a");
  CHECK(c.ex->event(1)["choices"][0]["finish_reason"] == "length");
  CHECK(c.ex->event(2)["usage"]["completion_tokens"] == 3);
  CHECK(c.ex->events[3] == "[DONE]");
  const std::string m = h.d.render_metrics(3.0);
  CHECK(m.find("switchyard_router_streams_resumed_total 1\n") != std::string::npos);
  CHECK(m.find("switchyard_router_worker_lost_total 0\n") != std::string::npos);
}

TEST_CASE("dispatcher: with retries off a stream whose worker dies after sending tokens ends with worker_lost") {
  dispatcher_config cfg = test_config();
  cfg.max_attempts = 1;
  harness h(cfg);
  start_workers(h, 2, 4);
  const auto c = h.request({.stream = true}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.tokens(0, wire(c.id, 1), 1, "Once", 1, 0.2);
  REQUIRE(c.ex->events.size() == 1);

  h.heartbeat(1, 1.5);
  h.d.tick(2.5, h.out);
  const auto f = h.take();
  CHECK(submits(f, 1).empty());  // the client already has tokens: no second attempt
  REQUIRE(c.ex->log ==
          std::vector<std::string>{"start_stream", "send_event", "send_event", "send_event", "end_stream"});
  const json err = c.ex->event(1);
  CHECK(err["error"]["code"] == "worker_lost");
  CHECK(c.ex->events[2] == "[DONE]");
  CHECK(h.d.active() == 0);

  h.tokens(0, wire(c.id, 1), 1, " upon", 2, 2.6);  // nothing more reaches the client
  CHECK(c.ex->log.size() == 5);
  CHECK(h.d.render_metrics(10.0).find("switchyard_router_worker_lost_total 1\n") != std::string::npos);
}

TEST_CASE("dispatcher: a worker that restarts within the heartbeat timeout gets its unstarted work again") {
  harness h;
  start_workers(h, 1, 4);
  const auto quiet = h.request({}, 0.1);                    // nothing streamed yet
  const auto streaming = h.request({.stream = true}, 0.1);  // has tokens at the client
  REQUIRE(submits(h.take(), 0).size() == 2);
  h.tokens(0, wire(streaming.id, 1), 1, "Once", 1, 0.2);
  REQUIRE(streaming.ex->events.size() == 1);

  // The process behind the address restarted: a welcome with a new worker id, heartbeats never
  // missed. Without noticing, both requests would wait forever (they have no deadline).
  h.welcome(0, 4, 0.5, "worker-0-restarted");
  const auto f = h.take();
  const auto s = submits(f, 0);
  REQUIRE(s.size() == 2);  // both re-sent as new attempts; the started stream resumes
  const bool quiet_first = s[0].request_id == wire(quiet.id, 2);
  const proto::submit& sq = s[quiet_first ? 0 : 1];
  const proto::submit& ss = s[quiet_first ? 1 : 0];
  CHECK(sq.request_id == wire(quiet.id, 2));
  CHECK(sq.n_generated == 0);
  CHECK(ss.request_id == wire(streaming.id, 2));
  CHECK(ss.n_generated == 1);
  CHECK(quiet.ex->log.empty());
  CHECK(streaming.ex->log == std::vector<std::string>{"start_stream", "send_event"});  // no error
  CHECK(h.d.active() == 2);
  CHECK(h.d.workers().at(0).state == worker_state::ready);
  CHECK(h.d.workers().at(0).in_flight == 2);

  h.tokens(0, wire(quiet.id, 2), 1, "fresh", 1, 0.6, "length");
  REQUIRE(quiet.ex->log == std::vector<std::string>{"respond"});
  CHECK(quiet.ex->body()["choices"][0]["text"] == "fresh");
  h.tokens(0, wire(streaming.id, 2), 1, " upon", 2, 0.6, "length");
  CHECK(streaming.ex->events.back() == "[DONE]");
  // A repeated welcome from the same process changes nothing.
  h.welcome(0, 4, 0.7, "worker-0-restarted");
  CHECK(submits(h.take(), 0).empty());
}

// ---- worker lifecycle: retirement and removal against requests in flight --------------------

namespace {

bool has_line(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

std::vector<link_frame> of_type(const std::vector<link_frame>& frames, const std::string& type) {
  std::vector<link_frame> out;
  for (const auto& f : frames)
    if (f.type == type) out.push_back(f);
  return out;
}

}  // namespace

TEST_CASE("dispatcher: a retired worker gets no new request, finishes its stream, then is removed and closed") {
  harness h;
  start_workers(h, 2, 4);
  const auto c = h.request({.stream = true}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.tokens(0, wire(c.id, 1), 1, "Once", 1, 0.2);

  h.d.retire_worker("tcp://w0:5555", 0.3, h.out);  // it left the DNS answer
  CHECK(h.take().empty());                         // still running c: nothing closed
  CHECK(h.d.workers().at(0).state == worker_state::retired);
  std::string m = h.d.render_metrics(0.3);
  CHECK(has_line(m, "switchyard_router_workers{state=\"retired\"} 1"));
  CHECK(has_line(m, "switchyard_router_workers{state=\"ready\"} 1"));
  CHECK(has_line(m, "switchyard_router_worker_in_flight{worker=\"tcp://w0:5555\"} 1"));

  const auto d = h.request({}, 0.4);  // new work goes to the other worker only
  auto f = h.take();
  CHECK(submits(f, 0).empty());
  REQUIRE(submits(f, 1).size() == 1);

  h.heartbeat(0, 0.5);
  h.d.tick(0.6, h.out);
  CHECK(of_type(h.take(), "_close").empty());
  h.tokens(0, wire(c.id, 1), 1, " upon", 2, 0.7, "stop");  // the stream ends normally
  REQUIRE(c.ex->log ==
          std::vector<std::string>{"start_stream", "send_event", "send_event", "send_event", "end_stream"});
  CHECK(c.ex->events[2] == "[DONE]");

  h.d.tick(0.8, h.out);  // nothing of ours runs there any more: removed, its connection closed
  f = h.take();
  const auto closed = of_type(f, "_close");
  REQUIRE(closed.size() == 1);
  CHECK(closed[0].worker == 0);
  CHECK(h.d.workers().find(0) == nullptr);
  CHECK(h.d.workers().size() == 1);
  m = h.d.render_metrics(0.8);
  CHECK(m.find("tcp://w0:5555") == std::string::npos);  // its labels are gone
  CHECK(has_line(m, "switchyard_router_workers{state=\"retired\"} 0"));
  CHECK(has_line(m, "switchyard_router_workers{state=\"ready\"} 1"));

  h.tokens(0, wire(c.id, 1), 1, " late", 3, 0.9);  // a frame still on its way: dropped, counted as late
  CHECK(has_line(h.d.render_metrics(0.9), "switchyard_router_late_frames_total 1"));
  CHECK(has_line(h.d.render_metrics(0.9), "switchyard_router_bad_frames_total 0"));
  h.tokens(1, wire(d.id, 1), 1, "fine", 1, 1.0, "stop");
  CHECK(d.ex->responses.at(0).status == 200);

  h.d.add_worker("tcp://w0:5555", 1.1, h.out);  // listed again later: a new connection, a new ref
  f = h.take();
  REQUIRE(types(f) == std::vector<std::string>{"_connect", "hello"});
  CHECK(f[0].worker != 0);
  CHECK(f[0].worker != 1);
  CHECK(f[0].body == "tcp://w0:5555");
}

TEST_CASE("dispatcher: an idle worker that is retired is removed at once") {
  harness h;
  start_workers(h, 2, 4);
  h.d.retire_worker("tcp://w1:5555", 0.1, h.out);
  const auto f = h.take();
  REQUIRE(types(f) == std::vector<std::string>{"_close"});
  CHECK(f[0].worker == 1);
  CHECK(h.d.workers().size() == 1);
  h.d.retire_worker("tcp://unknown:5555", 0.2, h.out);  // never listed: nothing happens
  CHECK(h.take().empty());
}

TEST_CASE("dispatcher: a retired worker that dies mid-drain has its requests re-sent or ended, then goes at once") {
  harness h;
  start_workers(h, 2, 4);
  const auto quiet = h.request({}, 0.1);
  const auto streaming = h.request({.stream = true}, 0.1);
  auto f = h.take();
  REQUIRE(submits(f, 0).size() == 1);  // one on each worker: the least loaded takes the second
  REQUIRE(submits(f, 1).size() == 1);
  const bool quiet_on_0 = submits(f, 0)[0].request_id == wire(quiet.id, 1);
  const worker_ref q = quiet_on_0 ? 0 : 1, s = quiet_on_0 ? 1 : 0;
  h.tokens(s, wire(streaming.id, 1), 1, "Once", 1, 0.2);
  // Both workers leave the answer; the quiet one's worker keeps beating, the other goes silent.
  h.d.retire_worker("tcp://w" + std::to_string(s) + ":5555", 0.3, h.out);
  CHECK(h.take().empty());
  h.heartbeat(q, 1.5);
  h.d.tick(2.1, h.out);
  f = h.take();
  // The streaming worker died: its stream resumes on the other, and it is removed in the same tick.
  const auto closed = of_type(f, "_close");
  REQUIRE(closed.size() == 1);
  CHECK(closed[0].worker == s);
  const auto resumed = submits(f, q);
  REQUIRE(resumed.size() == 1);
  CHECK(resumed[0].request_id == wire(streaming.id, 2));
  CHECK(resumed[0].n_generated == 1);
  CHECK(h.d.workers().find(s) == nullptr);
  h.tokens(q, wire(streaming.id, 2), 1, " upon", 2, 2.15, "length");
  CHECK(streaming.ex->events.back() == "[DONE]");
  CHECK(streaming.ex->event(1)["choices"][0]["text"] == " upon");

  // Now the other one is retired while running `quiet`, and dies too: `quiet` never reached its
  // client, so it waits in the queue (no worker left) rather than being lost.
  h.d.retire_worker("tcp://w" + std::to_string(q) + ":5555", 2.2, h.out);
  CHECK(of_type(h.take(), "_close").empty());
  h.d.tick(3.6, h.out);
  f = h.take();
  REQUIRE(of_type(f, "_close").size() == 1);
  CHECK(h.d.workers().size() == 0);
  CHECK(quiet.ex->log.empty());
  CHECK(h.d.queued() == 1);

  // A new worker joins: the request runs there, as a new attempt.
  const worker_ref n = h.add_worker("tcp://w9:5555", 3.7);
  h.welcome(n, 4, 3.8);
  const auto again = submits(h.take(), n);
  REQUIRE(again.size() == 1);
  CHECK(again[0].request_id == wire(quiet.id, 2));
  h.tokens(n, wire(quiet.id, 2), 1, "done", 1, 3.9, "stop");
  CHECK(quiet.ex->responses.at(0).status == 200);
}

TEST_CASE("dispatcher: a dead worker still listed is removed after the grace and greeted afresh under a new ref") {
  harness h;  // heartbeat timeout 2 s, dead grace 4 s
  start_workers(h, 2, 4);
  const auto c = h.request({}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  for (double t = 0.5; t < 2.4; t += 0.5) h.heartbeat(1, t);
  h.d.tick(2.1, h.out);  // worker 0 dead: c goes to worker 1
  auto f = h.take();
  REQUIRE(submits(f, 1).size() == 1);
  CHECK(submits(f, 1)[0].request_id == wire(c.id, 2));
  CHECK(h.d.workers().at(0).state == worker_state::dead);
  CHECK(has_line(h.d.render_metrics(2.1), "switchyard_router_workers{state=\"dead\"} 1"));

  for (double t = 2.5; t < 6.5; t += 0.5) {
    h.heartbeat(1, t);
    h.d.tick(t, h.out);
  }
  f = h.take();  // hellos in case it comes back, but no removal yet (dead since 2.1)
  CHECK(of_type(f, "_close").empty());
  CHECK(of_type(f, "hello").size() >= 3);
  h.heartbeat(1, 6.2);
  h.d.tick(6.2, h.out);
  f = h.take();
  REQUIRE(types(f) == std::vector<std::string>{"_close", "_connect", "hello"});
  CHECK(f[0].worker == 0);
  const worker_ref fresh = f[1].worker;
  CHECK(fresh != 0);
  CHECK(f[1].body == "tcp://w0:5555");
  CHECK(f[2].worker == fresh);
  CHECK(h.d.workers().find(0) == nullptr);
  CHECK(h.d.workers().at(fresh).state == worker_state::connecting);
  std::string m = h.d.render_metrics(6.2);
  CHECK(has_line(m, "switchyard_router_workers{state=\"dead\"} 0"));
  CHECK(has_line(m, "switchyard_router_workers{state=\"connecting\"} 1"));

  // The old attempt's answer, from the old connection, is ignored; the restarted worker rejoins.
  h.tokens(0, wire(c.id, 1), 1, "stale", 1, 6.25, "stop");
  CHECK(c.ex->log.empty());
  h.welcome(fresh, 4, 6.3, "worker-0-restarted");
  CHECK(h.d.workers().at(fresh).state == worker_state::ready);
  CHECK(h.d.workers().n_ready() == 2);
  h.tokens(1, wire(c.id, 2), 1, "fresh", 1, 6.4, "stop");
  CHECK(c.ex->body()["choices"][0]["text"] == "fresh");
}

TEST_CASE("dispatcher: a retired worker that never answers is removed once the deadline ends its request") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({.timeout_s = 1.0}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.d.retire_worker("tcp://w0:5555", 0.2, h.out);
  for (double t = 0.5; t < 6.0; t += 0.5) {  // alive, but c is never answered
    h.heartbeat(0, t);
    h.d.tick(t, h.out);
  }
  CHECK(of_type(h.take(), "_close").empty());
  h.heartbeat(0, 6.2);
  h.d.tick(6.2, h.out);  // 5 s past the deadline: c ends (504), the cancel goes out, then the close
  const auto f = h.take();
  REQUIRE(types(f) == std::vector<std::string>{"cancel", "_close"});
  CHECK(c.ex->responses.at(0).status == 504);
  CHECK(h.d.workers().size() == 0);
}

TEST_CASE("dispatcher: a worker that says it is draining is counted as draining and gets nothing new") {
  harness h;
  start_workers(h, 1, 4);
  h.heartbeat(0, 0.5, /*draining=*/true);
  std::string m = h.d.render_metrics(0.5);
  CHECK(has_line(m, "switchyard_router_workers{state=\"draining\"} 1"));
  CHECK(has_line(m, "switchyard_router_workers{state=\"ready\"} 0"));
  CHECK(h.d.ready(0.5));  // its only worker draining: still ready through the no-worker grace
  h.request({}, 0.6);
  CHECK(submits(h.take(), 0).empty());
  CHECK(h.d.queued() == 1);
  h.heartbeat(0, 1.0);  // not draining after all
  CHECK(submits(h.take(), 0).size() == 1);
}

TEST_CASE("dispatcher: per-model metrics: active requests, queue depth by class, oldest queued wait") {
  harness h(test_config(/*local_queue=*/0));
  const worker_ref wa = h.add_worker("tcp://a:5555", 0.0), wb = h.add_worker("tcp://b:5555", 0.0);
  h.welcome(wa, /*max_running=*/1, 0.0, "worker-a", "model-a");
  h.welcome(wb, /*max_running=*/1, 0.0, "worker-b", "model-b");
  h.take();
  h.request({.model = "model-a"}, 0.1);                 // running
  h.request({.model = "model-a"}, 0.2);                 // queued, standard
  h.request({.priority = 1, .model = "model-a"}, 0.7);  // queued, batch
  const std::string m = h.d.render_metrics(1.2);
  CHECK(has_line(m, "switchyard_router_active_requests{model=\"model-a\"} 3"));
  CHECK(has_line(m, "switchyard_router_active_requests{model=\"model-b\"} 0"));  // known, idle: 0, not absent
  CHECK(has_line(m, "switchyard_router_queue_depth{model=\"model-a\",class=\"standard\"} 1"));
  CHECK(has_line(m, "switchyard_router_queue_depth{model=\"model-a\",class=\"batch\"} 1"));
  CHECK(has_line(m, "switchyard_router_queue_depth{model=\"model-a\",class=\"interactive\"} 0"));
  CHECK(has_line(m, "switchyard_router_queue_depth{model=\"model-b\",class=\"standard\"} 0"));
  CHECK(has_line(m, "switchyard_router_queue_oldest_wait_seconds{model=\"model-a\"} 1"));
  CHECK(has_line(m, "switchyard_router_queue_oldest_wait_seconds{model=\"model-b\"} 0"));
}

TEST_CASE("dispatcher: a model whose workers are busy does not hold back another model's requests") {
  harness h(test_config(/*local_queue=*/0));
  const worker_ref wa = h.add_worker("tcp://a:5555", 0.0), wb = h.add_worker("tcp://b:5555", 0.0);
  h.welcome(wa, /*max_running=*/1, 0.0, "worker-a", "model-a");
  h.welcome(wb, /*max_running=*/1, 0.0, "worker-b", "model-b");
  h.take();
  const auto a1 = h.request({.model = "model-a"}, 0.1);
  const auto a2 = h.request({.model = "model-a"}, 0.2);  // waits: model-a's only slot is taken
  CHECK(submits(h.take(), wa).size() == 1);
  CHECK(h.d.queued() == 1);
  const auto b1 = h.request({.model = "model-b"}, 0.3);  // behind a2 in time, but for a free worker
  const auto s = submits(h.take(), wb);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == wire(b1.id, 1));
  CHECK(h.d.queued() == 1);
  // a1 ends: a2 goes to model-a's worker.
  h.tokens(wa, wire(a1.id, 1), 1, "x", 1, 0.4, "length");
  const auto s2 = submits(h.take(), wa);
  REQUIRE(s2.size() == 1);
  CHECK(s2[0].request_id == wire(a2.id, 1));
  CHECK(h.d.queued() == 0);
}

TEST_CASE("dispatcher: a client that goes away is cancelled on its worker or dropped from the queue") {
  harness h(test_config(/*local_queue=*/0));
  start_workers(h, 1, /*max_running=*/1);
  const auto running = h.request({}, 0.1);
  const auto waiting = h.request({}, 0.2);
  REQUIRE(submits(h.take(), 0).size() == 1);
  CHECK(h.d.queued() == 1);

  h.d.on_client_gone(running.id, 0.25, h.out);
  const auto f = h.take();
  const auto cs = cancels(f, 0);
  REQUIRE(cs.size() == 1);
  CHECK(cs[0].request_id == wire(running.id, 1));
  CHECK(h.d.workers().at(0).in_flight == 1);  // freed, and taken at once by the waiting request
  // The freed slot goes to the waiting request at once.
  auto s = submits(f, 0);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == wire(waiting.id, 1));
  h.tokens(0, wire(running.id, 1), 1, "late", 1, 0.3);
  h.tokens(0, wire(running.id, 1), 0, "", 1, 0.3, "cancelled");
  CHECK(running.ex->log.empty());
  CHECK(submits(h.take(), 0).empty());

  const auto third = h.request({}, 0.4);
  CHECK(h.d.queued() == 1);
  h.d.on_client_gone(third.id, 0.45, h.out);
  CHECK(h.d.queued() == 0);
  CHECK(h.d.active() == 1);
  CHECK(cancels(h.take(), 0).empty());  // never reached a worker: nothing to cancel
  CHECK(third.ex->log.empty());
  CHECK(h.d.render_metrics(10.0).find("switchyard_router_client_cancels_total 2\n") != std::string::npos);
}

TEST_CASE("dispatcher: a request whose client left before it arrived is dropped, not generated") {
  // After a cache lookup the request is submitted from a cache thread, so its client's "gone"
  // can reach the dispatcher first (and find nothing to cancel).
  harness h;
  start_workers(h, 1, /*max_running=*/4);
  request_opts o;
  o.gone = true;
  const auto left = h.request(o, 0.1);
  h.d.on_client_gone(left.id, 0.1, h.out);
  CHECK(submits(h.take(), 0).empty());
  CHECK(h.d.active() == 0);
  CHECK(left.ex->log.empty());
  const std::string m = h.d.render_metrics(10.0);
  CHECK(m.find("switchyard_router_client_cancels_total 1\n") != std::string::npos);
  CHECK(m.find("switchyard_router_requests_total{status=\"499\"} 1\n") != std::string::npos);
}

TEST_CASE("dispatcher: a request whose deadline passes in the queue gets 504") {
  harness h(test_config(/*local_queue=*/0));
  start_workers(h, 1, /*max_running=*/1);
  h.request({}, 0.1);
  const auto c = h.request({.timeout_s = 1.0}, 0.2);
  CHECK(h.d.queued() == 1);
  h.heartbeat(0, 1.0);
  h.d.tick(1.1, h.out);
  CHECK(c.ex->log.empty());  // not yet
  h.d.tick(2.2, h.out);
  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  CHECK(c.ex->responses[0].status == 504);
  CHECK(c.ex->body()["error"]["code"] == "deadline_exceeded");
  CHECK(h.d.queued() == 0);
  CHECK(cancels(h.take(), 0).empty());
}

TEST_CASE(
    "dispatcher: a request still queued past its queue timeout gets 408 queue_timeout, a running one is not cut") {
  dispatcher_config cfg = test_config(/*local_queue=*/0);
  cfg.queue_timeout_s = 1.0;
  auto tenants = tenant_registry::parse(R"({"tenants": [
      {"name": "std", "keys": ["sk-std"]}, {"name": "patient", "keys": ["sk-patient"], "queue_timeout_s": 0},
      {"name": "hasty", "keys": ["sk-hasty"], "queue_timeout_s": 0.5}]})");
  harness h(cfg, std::move(tenants));
  start_workers(h, 1, /*max_running=*/1);
  const auto running = h.request({.api_key = "sk-std"}, 0.1);  // holds the only slot
  const auto queued = h.request({.api_key = "sk-std", .prompt = "one"}, 0.2);
  const auto streamed = h.request({.stream = true, .api_key = "sk-std", .prompt = "two"}, 0.2);
  const auto patient = h.request({.api_key = "sk-patient", .prompt = "three"}, 0.2);
  const auto hasty = h.request({.api_key = "sk-hasty", .prompt = "four"}, 0.3);
  CHECK(submits(h.take(), 0).size() == 1);
  CHECK(h.d.queued() == 4);
  h.heartbeat(0, 0.7);
  h.d.tick(0.7, h.out);
  CHECK(hasty.ex->log.empty());  // 0.4 s: not yet
  h.d.tick(0.9, h.out);          // 0.6 s: past its tenant's 0.5 s
  REQUIRE(hasty.ex->log == std::vector<std::string>{"respond"});
  CHECK(hasty.ex->responses[0].status == 408);
  CHECK(hasty.ex->body()["error"]["code"] == "queue_timeout");
  CHECK(queued.ex->log.empty());
  h.heartbeat(0, 1.25);
  h.d.tick(1.25, h.out);  // 1.05 s: past the router's 1 s
  REQUIRE(queued.ex->log == std::vector<std::string>{"respond"});
  const http_response& resp = queued.ex->responses[0];
  CHECK(resp.status == 408);
  CHECK(std::stoi(header(resp.headers, "Retry-After")) >= 1);
  const json b = queued.ex->body();
  CHECK(b["error"]["code"] == "queue_timeout");
  CHECK(b["error"]["type"] == "timeout_error");
  CHECK_THAT(b["error"]["message"].get<std::string>(), Catch::Contains("queue timeout is 1 s"));
  // A stream's head went out at admission: it ends with the error event.
  CHECK(streamed.ex->log.back() == "end_stream");
  CHECK(std::any_of(streamed.ex->events.begin(), streamed.ex->events.end(),
                    [](const std::string& e) { return e.find("queue_timeout") != std::string::npos; }));
  // A tenant without a queue timeout waits on; the running request is never cut by it.
  CHECK(patient.ex->log.empty());
  CHECK(running.ex->log.empty());
  CHECK(h.d.queued() == 1);
  CHECK(cancels(h.take(), 0).empty());
  h.heartbeat(0, 30.0);
  h.d.tick(30.0, h.out);
  CHECK(running.ex->log.empty());
  CHECK(h.d.render_metrics(30.0).find("switchyard_router_queue_timeouts_total 3\n") != std::string::npos);
  h.tokens(0, wire(running.id, 1), 1, " jumps", 1, 30.1, "stop", 4, 0);  // the slot frees: the patient one runs
  CHECK(running.ex->responses.at(0).status == 200);
  CHECK(submits(h.take(), 0).size() == 1);
}

TEST_CASE("dispatcher: a request's own queue_timeout shortens its tenant's, never lengthens it") {
  dispatcher_config cfg = test_config(/*local_queue=*/0);
  cfg.queue_timeout_s = 2.0;
  auto tenants = tenant_registry::parse(R"({"tenants": [
      {"name": "std", "keys": ["sk-std"]}, {"name": "patient", "keys": ["sk-patient"], "queue_timeout_s": 0}]})");
  harness h(cfg, std::move(tenants));
  start_workers(h, 1, /*max_running=*/1);
  const auto running = h.request({.api_key = "sk-std"}, 0.1);  // holds the only slot
  const auto shorter = h.request({.queue_timeout_s = 0.5, .api_key = "sk-std", .prompt = "one"}, 0.2);
  const auto longer = h.request({.queue_timeout_s = 60, .api_key = "sk-std", .prompt = "two"}, 0.2);
  const auto patient = h.request({.queue_timeout_s = 1.0, .api_key = "sk-patient", .prompt = "three"}, 0.2);
  CHECK(submits(h.take(), 0).size() == 1);
  h.heartbeat(0, 0.6);
  h.d.tick(0.6, h.out);  // 0.4 s
  CHECK(shorter.ex->log.empty());
  h.heartbeat(0, 0.8);
  h.d.tick(0.8, h.out);  // 0.6 s: past its own 0.5 s
  REQUIRE(shorter.ex->log == std::vector<std::string>{"respond"});
  CHECK(shorter.ex->responses[0].status == 408);
  CHECK_THAT(shorter.ex->body()["error"]["message"].get<std::string>(), Catch::Contains("queue timeout is 0.5 s"));
  h.heartbeat(0, 1.3);
  h.d.tick(1.3, h.out);  // 1.1 s: a tenant without a queue timeout still honours its client's
  REQUIRE(patient.ex->log == std::vector<std::string>{"respond"});
  CHECK(patient.ex->responses[0].status == 408);
  CHECK(longer.ex->log.empty());
  h.heartbeat(0, 2.3);
  h.d.tick(2.3, h.out);  // 2.1 s: 60 s asked, the router's 2 s applies
  REQUIRE(longer.ex->log == std::vector<std::string>{"respond"});
  CHECK(longer.ex->responses[0].status == 408);
  CHECK(running.ex->log.empty());
}

TEST_CASE("dispatcher: a request that comes back to the queue after its worker died is not cut by the queue timeout") {
  dispatcher_config cfg = test_config(/*local_queue=*/0);
  cfg.queue_timeout_s = 1.0;
  harness h(cfg);
  start_workers(h, 2, /*max_running=*/1);
  const auto a = h.request({}, 0.1);
  const auto b = h.request({.prompt = "another"}, 0.1);
  CHECK(h.take().size() >= 2);  // one on each worker
  CHECK(h.d.queued() == 0);
  h.heartbeat(1, 1.0);
  h.heartbeat(1, 2.0);
  h.d.tick(2.5, h.out);  // worker 0 silent past the heartbeat timeout: its request is queued again
  CHECK(h.d.queued() == 1);
  h.heartbeat(1, 3.0);
  h.d.tick(3.9, h.out);  // 3.8 s after admission, well past 1 s: still waiting
  CHECK(h.d.queued() == 1);
  CHECK(a.ex->log.empty());
  CHECK(b.ex->log.empty());
  CHECK(h.d.render_metrics(4.0).find("switchyard_router_queue_timeouts_total 0\n") != std::string::npos);
}

TEST_CASE("dispatcher: a dispatched request the worker never ends is ended well after its deadline") {
  harness h(test_config(/*local_queue=*/0));
  start_workers(h, 1, /*max_running=*/1);
  const auto c = h.request({.timeout_s = 1.0}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  // Its submit was lost somewhere: the worker stays alive (heartbeats) but never answers.
  for (double t = 0.5; t < 6.0; t += 0.5) {
    h.heartbeat(0, t);
    h.d.tick(t, h.out);
  }
  CHECK(c.ex->log.empty());  // the worker's own deadline handling gets a grace period
  h.heartbeat(0, 6.5);
  h.d.tick(6.6, h.out);
  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  CHECK(c.ex->responses[0].status == 504);
  CHECK(cancels(h.take(), 0).size() == 1);  // and the worker is told, in case it still runs
  CHECK(h.d.active() == 0);
  CHECK(h.d.workers().at(0).in_flight == 0);
}

TEST_CASE("dispatcher: a request whose answer cannot be written still ends and frees its slot") {
  dispatcher_config cfg = test_config(/*local_queue=*/0);
  cfg.max_attempts = 1;  // a worker error ends the request at once (retries: see the cases below)
  harness h(cfg);
  start_workers(h, 1, /*max_running=*/1);
  for (const bool finish_by_error : {false, true}) {
    INFO((finish_by_error ? "worker error" : "normal finish"));
    const auto c = h.request({.max_tokens = 4}, 0.1);
    const auto s = submits(h.take(), 0);
    REQUIRE(s.size() == 1);
    c.ex->throw_calls = true;  // writing the answer fails (e.g. a failed allocation)
    const auto n_prompt = static_cast<uint32_t>(s[0].prompt.size());
    CHECK_THROWS(h.tokens(0, s[0].request_id, 1, "x", 1, 0.2, finish_by_error ? "error" : "length", n_prompt, 0));
    // Gone from the tables all the same: nothing active, the slot free for the next request.
    CHECK(h.d.active() == 0);
    CHECK(h.d.workers().at(0).in_flight == 0);
  }
  h.request({.max_tokens = 4}, 0.5);
  CHECK(submits(h.take(), 0).size() == 1);
}

TEST_CASE("dispatcher: a request the worker ends on its own (finish error or cancelled) is a 502") {
  dispatcher_config cfg = test_config();
  cfg.max_attempts = 1;  // not retried (retries: see the cases below)
  harness h(cfg);
  start_workers(h, 1, 4);
  for (const std::string reason : {"error", "cancelled"}) {
    INFO(reason);
    const auto c = h.request({}, 0.1);
    REQUIRE(submits(h.take(), 0).size() == 1);
    h.tokens(0, wire(c.id, 1), 0, "", 0, 0.2, reason);
    REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
    CHECK(c.ex->responses[0].status == 502);
    CHECK(c.ex->body()["error"]["code"] == "worker_" + reason);
    CHECK(h.d.active() == 0);
  }
}

TEST_CASE("dispatcher: worker errors: invalid_request is a 400, overloaded goes to another worker") {
  harness h;
  start_workers(h, 2, 4);
  const auto bad = h.request({}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.error(0, wire(bad.id, 1), proto::error_code::invalid_request, 0.2);
  REQUIRE(bad.ex->log == std::vector<std::string>{"respond"});
  CHECK(bad.ex->responses[0].status == 400);
  const json b = bad.ex->body();
  CHECK(b["error"]["code"] == "invalid_request");
  CHECK(b["error"]["type"] == "invalid_request_error");
  h.take();

  // Both idle: the next request is worker 1's turn. It starts draining and refuses what it was sent.
  const auto c = h.request({}, 0.3);
  auto s = submits(h.take(), 1);
  REQUIRE(s.size() == 1);
  h.heartbeat(1, 0.4, /*draining=*/true);
  h.error(1, wire(c.id, 1), proto::error_code::overloaded, 0.5);
  CHECK(c.ex->log.empty());
  s = submits(h.take(), 0);
  REQUIRE(s.size() == 1);
  CHECK(s[0].request_id == wire(c.id, 2));
  h.tokens(0, wire(c.id, 2), 1, "ok", 1, 0.6, "stop");
  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  CHECK(c.ex->responses[0].status == 200);
  CHECK(c.ex->body()["choices"][0]["text"] == "ok");
}

TEST_CASE("dispatcher: a request refused as overloaded keeps its deadline in the queue") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({.timeout_s = 1.0}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.heartbeat(0, 0.2, /*draining=*/true);
  h.error(0, wire(c.id, 1), proto::error_code::overloaded, 0.3);
  CHECK(h.d.queued() == 1);  // no worker takes submits now
  h.heartbeat(0, 1.5, true);
  h.d.tick(1.6, h.out);
  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  CHECK(c.ex->responses[0].status == 504);
  CHECK(c.ex->body()["error"]["code"] == "deadline_exceeded");
  CHECK(h.d.queued() == 0);
}

TEST_CASE("dispatcher: n=2 submits one request per choice and answers with both") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({.n = 2}, 0.1);
  const auto s = submits(h.take(), 0);
  REQUIRE(s.size() == 2);
  CHECK(s[0].request_id == wire(c.id, 1, 0));
  CHECK(s[1].request_id == wire(c.id, 1, 1));
  CHECK(h.d.workers().at(0).in_flight == 2);

  h.tokens(0, wire(c.id, 1, 1), 3, "second", 3, 0.2, "stop", 5, 0);
  CHECK(c.ex->log.empty());  // one choice is not the answer
  h.tokens(0, wire(c.id, 1, 0), 2, "first", 2, 0.3, "", 5, 0);
  h.tokens(0, wire(c.id, 1, 0), 2, " one", 4, 0.4, "length", 5, 0);
  REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
  const json b = c.ex->body();
  REQUIRE(b["choices"].size() == 2);
  CHECK(b["choices"][0]["index"] == 0);
  CHECK(b["choices"][0]["text"] == "first one");
  CHECK(b["choices"][0]["finish_reason"] == "length");
  CHECK(b["choices"][1]["index"] == 1);
  CHECK(b["choices"][1]["text"] == "second");
  CHECK(b["choices"][1]["finish_reason"] == "stop");
  CHECK(b["usage"]["prompt_tokens"] == 5);
  CHECK(b["usage"]["completion_tokens"] == 7);
  CHECK(h.d.workers().at(0).in_flight == 0);
}

TEST_CASE("dispatcher: metrics count answers by status, rejections and tokens") {
  auto tenants = tenant_registry::parse(R"({"tenants": [{"name": "t", "keys": ["k"], "requests_per_s": 2}]})");
  harness h(test_config(), std::move(tenants));
  start_workers(h, 1, 4);
  const auto ok1 = h.request({.api_key = "k"}, 0.1);
  const auto ok2 = h.request({.api_key = "k"}, 0.1);
  h.request({.api_key = "k"}, 0.1);  // 429
  h.tokens(0, wire(ok1.id, 1), 3, "abc", 3, 0.2, "stop", 5, 2);
  h.tokens(0, wire(ok2.id, 1), 4, "abcd", 4, 0.2, "stop", 5, 0);
  const auto gone = h.request({.api_key = "k"}, 1.2);
  h.d.on_client_gone(gone.id, 1.25, h.out);

  const std::string m = h.d.render_metrics(10.0);
  auto has = [&](const std::string& line) { return m.find(line + "\n") != std::string::npos; };
  CHECK(has("switchyard_router_requests_total{status=\"200\"} 2"));
  CHECK(has("switchyard_router_requests_total{status=\"429\"} 1"));
  CHECK(has("switchyard_router_requests_total{status=\"499\"} 1"));
  CHECK(has("switchyard_router_admission_rejections_total{reason=\"tenant_rate\"} 1"));
  CHECK(has("switchyard_router_admission_rejections_total{reason=\"queue_full\"} 0"));
  CHECK(has("switchyard_router_completion_tokens_total 7"));
  CHECK(has("switchyard_router_cached_prompt_tokens_total 2"));
  CHECK(has("switchyard_router_active_requests{model=\"smollm2-135m\"} 0"));
  CHECK(has("switchyard_router_workers{state=\"ready\"} 1"));
  CHECK(has("switchyard_router_client_cancels_total 1"));
}

TEST_CASE("dispatcher: a model whose chat template cannot be applied serves completions, and chats get a 400") {
  harness h;
  const worker_ref w = h.add_worker("tcp://w0:5555", 0.0);
  proto::welcome m;
  m.worker_id = "worker-0";
  m.model_id = k_model;
  m.context_length = 2048;
  m.kv_capacity_tokens = 4096;
  m.kv_block_size = 16;
  m.max_running = 4;
  m.tokenizer = tiny_vocab();
  m.tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}";
  h.feed(w, proto::msg_type::welcome, proto::encode(m), 0.0);
  h.heartbeat(w, 0.1);
  CHECK(h.d.workers().n_ready() == 1);  // the worker is taken all the same
  const auto model = h.models.find(k_model);
  REQUIRE(model != nullptr);
  CHECK_FALSE(model->tmpl.supported());
  h.take();

  // The HTTP layer refuses a chat request for it, saying why and what the operator can do...
  std::vector<std::shared_ptr<routed_request>> submitted;
  api_handler api(
      api_config{}, h.tenants, h.models, [&](std::shared_ptr<routed_request> r) { submitted.push_back(std::move(r)); },
      [](uint64_t) {}, std::make_shared<router_status>(), nullptr);
  auto post = [&](const std::string& path, const std::string& body) {
    http_request req;
    req.method = "POST";
    req.target = req.path = path;
    req.body = body;
    auto ex = std::make_shared<fake_exchange>();
    api(ex, std::move(req));
    return ex;
  };
  const auto chat =
      post("/v1/chat/completions", R"({"model":"smollm2-135m","messages":[{"role":"user","content":"Hi"}]})");
  REQUIRE(chat->responses.size() == 1);
  CHECK(chat->responses[0].status == 400);
  const json e = chat->body()["error"];
  CHECK(e["type"] == "invalid_request_error");
  CHECK(e["code"] == "chat_template_unsupported");
  CHECK(e["param"] == "model");
  const std::string message = e["message"];
  CHECK_THAT(message, Catch::Matchers::Contains("the chat template of the model 'smollm2-135m' cannot be applied") &&
                          Catch::Matchers::Contains("--chat-template NAME (chatml, llama3,") &&
                          Catch::Matchers::Contains("/v1/completions"));
  CHECK(submitted.empty());

  // ...and passes its completions on, which the worker serves as usual.
  const auto completion = post("/v1/completions", R"({"model":"smollm2-135m","prompt":"Hello","max_tokens":4})");
  CHECK(completion->responses.empty());
  REQUIRE(submitted.size() == 1);
  CHECK(submitted[0]->prompt == model->tok.encode("Hello"));
  h.d.on_request(submitted[0], 0.2, h.out);
  CHECK(submits(h.take(), w).size() == 1);
}

TEST_CASE("api_handler: /ready is 503 without a ready worker, while shutting down (still admitting) or draining") {
  harness h;
  start_workers(h, 1, 4);
  auto status = std::make_shared<router_status>();
  std::vector<std::shared_ptr<routed_request>> submitted;
  api_handler api(
      api_config{}, h.tenants, h.models, [&](std::shared_ptr<routed_request> r) { submitted.push_back(std::move(r)); },
      [](uint64_t) {}, status, nullptr);
  auto call = [&](const std::string& method, const std::string& path, const std::string& body = "") {
    http_request req;
    req.method = method;
    req.target = req.path = path;
    req.body = body;
    auto ex = std::make_shared<fake_exchange>();
    api(ex, std::move(req));
    REQUIRE(ex->responses.size() <= 1);
    return ex;
  };
  auto ready_status = [&] { return call("GET", "/ready")->responses.at(0).status; };
  auto set = [&](bool ready, bool draining, bool shutting_down) {
    std::lock_guard<std::mutex> lk(status->mu);
    status->ready = ready;
    status->draining = draining;
    status->shutting_down = shutting_down;
  };

  set(false, false, false);  // no worker ready (what the dispatcher publishes)
  CHECK(ready_status() == 503);
  CHECK(call("GET", "/ready")->body()["status"] == "not ready: no worker is ready");
  set(true, false, false);
  CHECK(ready_status() == 200);
  set(true, false, true);  // SIGTERM, within --shutdown-delay-s: not ready, but requests still pass
  CHECK(ready_status() == 503);
  CHECK(call("GET", "/ready")->body()["status"] == "not ready: shutting down");
  const auto admitted = call("POST", "/v1/completions", R"({"model":"smollm2-135m","prompt":"Hi","max_tokens":2})");
  CHECK(admitted->responses.empty());
  CHECK(submitted.size() == 1);
  set(false, true, true);  // draining: the dispatcher refuses (503), and so does /ready
  CHECK(ready_status() == 503);
  CHECK(call("GET", "/health")->responses.at(0).status == 200);  // alive all along
}

TEST_CASE("api routes: every route resolves to itself, an unknown path to 404 and another method to 405") {
  const auto table = api_handler::routes();
  REQUIRE(table.size() > 15);
  for (const route& r : table) {
    // A concrete path for the pattern: one segment per {id}, two for a {name*} tail.
    std::string path;
    std::string_view rest = r.pattern.substr(1);
    while (!rest.empty()) {
      const size_t slash = rest.find('/');
      const std::string_view seg = rest.substr(0, slash);
      path += "/" + std::string(seg.front() != '{' ? seg : seg.ends_with("*}") ? "org/name" : "abc");
      rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    }
    INFO(r.method << " " << path);
    const route_match m = match_route(table, r.method, path);
    CHECK(m.found == &r);
    CHECK(m.family == r.family);
    CHECK(m.allow.find(r.method) != std::string::npos);
  }
  const route_match unknown = match_route(table, "GET", "/v1/nope");
  CHECK(unknown.found == nullptr);
  CHECK(unknown.allow.empty());
  for (const char* p : {"/health/", "/v1/models/", "/v1/responses/", "/v1/responses//input_items", "", "health"})
    CHECK(match_route(table, "GET", p).allow.empty());
  const route_match put = match_route(table, "PUT", "/v1/responses/resp_1");
  CHECK(put.found == nullptr);
  CHECK(put.allow == "GET, DELETE");
  const route_match get_messages = match_route(table, "GET", "/v1/messages");
  CHECK(get_messages.found == nullptr);
  CHECK(get_messages.allow == "POST");
  CHECK(get_messages.family == api_family::anthropic);
  CHECK(match_route(table, "GET", "/dashboard/login").allow == "GET, POST");
  CHECK(path_matches("/v1/models/{name*}", "/v1/models/org/m/tokenizer/tokenizer.json"));
  CHECK_FALSE(path_matches("/v1/models/{name*}", "/v1/models//x"));
  CHECK_FALSE(path_matches("/v1/responses/{id}", "/v1/responses/a/b"));
}

TEST_CASE("api_handler: the metrics listener serves its own table's routes without a key, 404 for the rest") {
  harness h(test_config(), tenant_registry::parse(R"({"tenants": [{"name": "t", "keys": ["k"]}]})"));
  auto status = std::make_shared<router_status>();
  api_handler api(
      api_config{}, h.tenants, h.models, [](std::shared_ptr<routed_request>) {}, [](uint64_t) {}, status, nullptr);
  for (const route& r : api_handler::metrics_routes()) CHECK(r.access == route_access::open);
  auto call = [&](const std::string& method, const std::string& path) {
    http_request req;
    req.method = method;
    req.target = req.path = path;
    auto ex = std::make_shared<fake_exchange>();
    api.metrics_listener(ex, std::move(req));
    REQUIRE(ex->responses.size() == 1);
    return ex->responses.at(0);
  };
  const auto metrics = call("GET", "/metrics");
  CHECK(metrics.status == 200);
  CHECK(metrics.content_type == "text/plain; version=0.0.4");
  CHECK(metrics.body.find("switchyard_router_") != std::string::npos);
  CHECK(call("GET", "/health").status == 200);
  CHECK(call("GET", "/v1/models").status == 404);
  CHECK(call("POST", "/metrics").status == 404);
  CHECK(call("GET", "/ready").status == 404);
}

TEST_CASE("api_handler: keys are checked from the route table, 404 and 405 are JSON errors, 405 with Allow") {
  harness h(test_config(), tenant_registry::parse(R"({"tenants": [{"name": "t", "keys": ["k"]},
                                                    {"name": "ops", "keys": ["adm"], "admin": true}]})"));
  start_workers(h, 1, 4);
  std::vector<std::shared_ptr<routed_request>> submitted;
  api_handler api(
      api_config{}, h.tenants, h.models, [&](std::shared_ptr<routed_request> r) { submitted.push_back(std::move(r)); },
      [](uint64_t) {}, std::make_shared<router_status>(), nullptr);
  auto call = [&](const std::string& method, const std::string& path, const std::string& key,
                  const std::string& body = "") {
    http_request req;
    req.method = method;
    req.target = req.path = path;
    req.body = body;
    if (!key.empty()) req.headers.emplace_back("authorization", "Bearer " + key);
    auto ex = std::make_shared<fake_exchange>();
    api(ex, std::move(req));
    REQUIRE(ex->responses.size() <= 1);
    return ex;
  };
  auto status = [&](const std::string& method, const std::string& path, const std::string& key) {
    const auto ex = call(method, path, key);
    return ex->responses.empty() ? 0 : ex->responses[0].status;
  };
  // Open routes need no key; every other route does, unknown paths and wrong methods included.
  CHECK(status("GET", "/health", "") == 200);
  CHECK(status("GET", "/ready", "") == 503);
  const auto no_key = call("GET", "/v1/models", "");
  CHECK(no_key->responses.at(0).status == 401);
  CHECK(no_key->body()["error"]["code"] == "missing_api_key");
  CHECK(header(no_key->responses[0].headers, "WWW-Authenticate") == "Bearer");
  CHECK(call("GET", "/v1/models", "bad")->body()["error"]["code"] == "invalid_api_key");
  CHECK(status("GET", "/nope", "") == 401);
  CHECK(status("PUT", "/v1/responses/resp_1", "") == 401);
  CHECK(status("GET", "/v1/models", "k") == 200);
  CHECK(status("GET", "/version", "k") == 200);
  // 404 and 405 in the existing error shape; the 405 names the path's methods.
  const auto unknown = call("GET", "/nope", "k");
  CHECK(unknown->responses.at(0).status == 404);
  CHECK(unknown->body()["error"]["code"] == "unknown_url");
  const auto put = call("PUT", "/v1/responses/resp_1", "k");
  CHECK(put->responses.at(0).status == 405);
  CHECK(header(put->responses[0].headers, "Allow") == "GET, DELETE");
  CHECK(put->body()["error"]["code"] == "method_not_allowed");
  const auto get_messages = call("GET", "/v1/messages", "k");  // in Anthropic's shape
  CHECK(get_messages->responses.at(0).status == 405);
  CHECK(header(get_messages->responses[0].headers, "Allow") == "POST");
  CHECK(get_messages->body()["type"] == "error");
  CHECK(get_messages->body()["error"]["type"] == "invalid_request_error");
  // Admin routes: 403 for another tenant's key; the dashboard's sign-in page without one.
  CHECK(status("GET", "/metrics", "k") == 403);
  CHECK(call("GET", "/metrics", "k")->body()["error"]["code"] == "admin_only");
  CHECK(status("GET", "/metrics", "adm") == 200);
  const auto sign_in = call("GET", "/dashboard", "");
  CHECK(sign_in->responses.at(0).status == 401);
  CHECK(sign_in->responses[0].content_type == "text/html; charset=utf-8");
  CHECK(status("GET", "/dashboard", "k") == 403);
  CHECK(status("GET", "/dashboard", "adm") == 200);
  // A generation reaches its handler, and on to the dispatcher.
  CHECK(call("POST", "/v1/completions", "k", R"({"model":"smollm2-135m","prompt":"Hi","max_tokens":2})")
            ->responses.empty());
  CHECK(submitted.size() == 1);
  CHECK(status("POST", "/v1/completions", "") == 401);
  CHECK(submitted.size() == 1);
}

TEST_CASE("error_response: one Retry-After rule, the body in the route's family") {
  const auto retry = [](int status, double s) {
    api_error e = make_error(status, "x", "y", "z");
    e.retry_after_s = s;
    return header(error_response(e, api_family::openai, "req-1").headers, "Retry-After");
  };
  CHECK(retry(503, 0) == "1");
  CHECK(retry(429, 0) == "1");
  CHECK(retry(429, 2.3) == "3");
  CHECK(retry(503, 5) == "5");
  CHECK(retry(503, 0.2) == "1");
  CHECK(retry(400, 0).empty());
  CHECK(retry(500, 0).empty());
  CHECK(retry(403, 2) == "2");  // named: sent
  const api_error e = make_error(401, "authentication_error", "missing_api_key", "no key");
  const http_response openai = error_response(e, api_family::openai, "req-1");
  CHECK(openai.status == 401);
  CHECK(header(openai.headers, "X-Request-Id") == "req-1");
  CHECK(header(openai.headers, "WWW-Authenticate") == "Bearer");
  CHECK(nlohmann::json::parse(openai.body)["error"]["code"] == "missing_api_key");
  const http_response anthropic = error_response(e, api_family::anthropic, "");
  CHECK(nlohmann::json::parse(anthropic.body)["type"] == "error");
  CHECK(header(anthropic.headers, "X-Request-Id").empty());
}

TEST_CASE("dispatcher: a model's context length is the smallest among its workers' welcomes") {
  harness h;
  const worker_ref a = h.add_worker("tcp://w0:5555", 0.0), b = h.add_worker("tcp://w1:5555", 0.0),
                   c = h.add_worker("tcp://w2:5555", 0.0);
  h.welcome(a, 4, 0.0, "", k_model, 2048);
  REQUIRE(h.models.find(k_model)->context_length == 2048);
  h.welcome(b, 4, 0.1, "", k_model, 1024);  // a smaller one arrives second: it wins
  CHECK(h.models.find(k_model)->context_length == 1024);
  h.welcome(c, 4, 0.2, "", k_model, 8192);  // a larger one changes nothing
  CHECK(h.models.find(k_model)->context_length == 1024);
  CHECK(h.models.find(k_model)->tok.vocab_size() == tiny_vocab().tokens.size());  // the rest is kept
}

TEST_CASE("dispatcher: a submit carries the time left as a relative budget, no wall-clock time") {
  harness h;
  start_workers(h, 1, 4);
  request_opts o;
  o.timeout_s = 30;
  h.request(o, 0.1);
  const auto s = submits(h.take(), 0);
  REQUIRE(s.size() == 1);
  CHECK(s[0].budget_ms > 0);
  CHECK(s[0].budget_ms <= 30'000);
  request_opts none;  // no deadline: no budget
  h.request(none, 0.2);
  const auto s2 = submits(h.take(), 0);
  REQUIRE(s2.size() == 1);
  CHECK(s2[0].budget_ms == 0);
}

// ---- bad workers (docs/reliability.md): bounded retries, the retry budget, outlier ejection ----

namespace {

// The worker a request's latest submit went to, among `frames`.
std::optional<worker_ref> submitted_to(const std::vector<link_frame>& frames, const std::string& wire_id) {
  for (const auto& f : frames)
    if (f.type == "submit" && as<proto::submit>(f).request_id == wire_id) return f.worker;
  return std::nullopt;
}

}  // namespace

TEST_CASE("dispatcher: a request a worker fails (its step threw) runs again on another, the client sees the answer") {
  harness h;
  start_workers(h, 2, 4);
  SECTION("an internal_error frame, streamed") {
    const auto c = h.request({.stream = true}, 0.1);
    REQUIRE(submits(h.take(), 0).size() == 1);
    h.error(0, wire(c.id, 1), proto::error_code::internal_error, 0.2);
    const auto f = h.take();
    CHECK(cancels(f, 0).size() == 1);
    const auto s = submits(f, 1);  // not the worker that failed it
    REQUIRE(s.size() == 1);
    CHECK(s[0].request_id == wire(c.id, 2));
    CHECK(c.ex->log == std::vector<std::string>{"start_stream"});  // nothing reached the client
    h.tokens(1, wire(c.id, 2), 1, "ok", 1, 0.3, "stop");
    CHECK(c.ex->event(0)["choices"][0]["text"] == "ok");
    CHECK(c.ex->events.back() == "[DONE]");
  }
  SECTION("a finish_reason error, not streamed") {
    const auto c = h.request({}, 0.1);
    REQUIRE(submits(h.take(), 0).size() == 1);
    h.tokens(0, wire(c.id, 1), 0, "", 0, 0.2, "error");
    REQUIRE(submits(h.take(), 1).size() == 1);
    h.tokens(1, wire(c.id, 2), 1, "ok", 1, 0.3, "stop");
    REQUIRE(c.ex->log == std::vector<std::string>{"respond"});
    CHECK(c.ex->responses[0].status == 200);
  }
  CHECK(has_line(h.d.render_metrics(1.0), "switchyard_router_retries_total 1"));
  CHECK(h.d.active() == 0);
}

TEST_CASE("dispatcher: a worker that fails requests in a row is ejected until its time is up, and says so") {
  dispatcher_config cfg = test_config();
  cfg.pool.eject_after_failures = 3;
  cfg.pool.eject_base_s = 10.0;
  harness h(cfg);
  start_workers(h, 2, 4);
  // Idle and tied, worker 0 takes each new request; each fails there and succeeds on worker 1.
  for (int i = 0; i < 3; ++i) {
    const double t = 0.1 + 0.1 * i;
    const auto c = h.request({}, t);
    REQUIRE(submits(h.take(), 0).size() == 1);
    h.error(0, wire(c.id, 1), proto::error_code::internal_error, t);
    REQUIRE(submits(h.take(), 1).size() == 1);
    h.tokens(1, wire(c.id, 2), 1, "ok", 1, t, "stop");
    CHECK(c.ex->responses.at(0).status == 200);
  }
  CHECK(h.d.workers().at(0).state == worker_state::ejected);
  CHECK(h.d.ready(1.0));  // worker 1 serves
  std::string m = h.d.render_metrics(1.0);
  CHECK(has_line(m, "switchyard_router_workers{state=\"ejected\"} 1"));
  CHECK(has_line(m, "switchyard_router_workers{state=\"ready\"} 1"));
  CHECK(has_line(m, "switchyard_router_worker_ejections_total 1"));
  // However idle it is, it gets nothing new while ejected.
  for (int i = 0; i < 3; ++i) h.request({}, 1.0);
  auto f = h.take();
  CHECK(submits(f, 0).empty());
  CHECK(submits(f, 1).size() == 3);
  // Its time is up (0.3 + 10 s): ready again, and idle, it takes the next request.
  h.heartbeat(0, 10.0);
  h.heartbeat(1, 10.0);
  h.d.tick(10.5, h.out);
  CHECK(h.d.workers().at(0).state == worker_state::ready);
  h.take();
  h.request({}, 10.6);
  CHECK(submits(h.take(), 0).size() == 1);
}

TEST_CASE("dispatcher: a query of death ends with 502 retries_exhausted after max_attempts workers, counted") {
  harness h;  // max_attempts 2, heartbeat timeout 2 s
  start_workers(h, 3, 4);
  const auto c = h.request({.stream = true}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  // It kills worker 0 (silent from now on); the others beat.
  h.heartbeat(1, 1.5);
  h.heartbeat(2, 1.5);
  h.d.tick(2.1, h.out);
  auto f = h.take();
  const auto second = submitted_to(f, wire(c.id, 2));
  REQUIRE(second.has_value());
  CHECK(*second != 0);
  // ... and the worker it was sent to next.
  const worker_ref survivor = *second == 1 ? 2 : 1;
  h.heartbeat(survivor, 3.0);
  h.d.tick(3.6, h.out);
  f = h.take();
  CHECK(submits(f, survivor).empty());  // not a third attempt: the survivor never sees it
  REQUIRE(c.ex->events.size() == 2);
  const json e = c.ex->event(0);
  CHECK(e["error"]["code"] == "retries_exhausted");
  CHECK(c.ex->events[1] == "[DONE]");
  CHECK(h.d.active() == 0);
  const std::string m = h.d.render_metrics(4.0);
  CHECK(has_line(m, "switchyard_router_retries_exhausted_total 1"));
  CHECK(has_line(m, "switchyard_router_retries_total 1"));
  CHECK(has_line(m, "switchyard_router_requests_total{status=\"502\"} 1"));
  CHECK(h.d.workers().at(survivor).state == worker_state::ready);
}

TEST_CASE("dispatcher: a request lost with a fleet killed at once is not remembered as a query of death") {
  dispatcher_config cfg = test_config();
  cfg.query_of_death_ttl_s = 100.0;
  harness h(cfg);  // max_attempts 2, heartbeat timeout 2 s
  start_workers(h, 2, 4);
  const auto c = h.request({.prompt = "An ordinary prompt"}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  // Both workers are killed together: worker 1 last beat at 0.2, worker 0 at 0 (its welcome).
  h.heartbeat(1, 0.2);
  h.d.tick(2.1, h.out);  // worker 0 declared dead; the retry goes to worker 1, silent for 1.9 s
  const auto second = submitted_to(h.take(), wire(c.id, 2));
  REQUIRE(second.has_value());
  CHECK(*second == 1);
  h.d.tick(2.3, h.out);  // worker 1 declared dead too
  REQUIRE(c.ex->responses.size() == 1);
  CHECK(c.ex->body()["error"]["code"] == "retries_exhausted");
  h.take();
  // A worker comes back: the prompt is served, not refused as deadly (one worker it reached alive died).
  h.welcome(0, 4, 5.0, "worker-0-restarted");
  h.take();
  const auto again = h.request({.prompt = "An ordinary prompt"}, 5.1);
  CHECK(again.ex->responses.empty());
  CHECK(submits(h.take(), 0).size() == 1);
  CHECK(has_line(h.d.render_metrics(5.2), "switchyard_router_query_of_death_refused_total 0"));
}

TEST_CASE("dispatcher: past the cluster's retry budget a failed request ends with 502 retry_budget_exhausted") {
  dispatcher_config cfg = test_config();
  cfg.retry = {.ratio = 0.0, .min_retries = 1, .window_s = 10.0};
  harness h(cfg);
  start_workers(h, 2, 4);
  const auto a = h.request({}, 0.1);
  const auto b = h.request({}, 0.1);
  auto f = h.take();
  const auto wa = submitted_to(f, wire(a.id, 1)), wb = submitted_to(f, wire(b.id, 1));
  REQUIRE(wa.has_value());
  REQUIRE(wb.has_value());
  h.error(*wa, wire(a.id, 1), proto::error_code::internal_error, 0.2);  // the one retry the budget allows
  CHECK(submitted_to(h.take(), wire(a.id, 2)).has_value());
  h.error(*wb, wire(b.id, 1), proto::error_code::internal_error, 0.3);  // none left
  CHECK_FALSE(submitted_to(h.take(), wire(b.id, 2)).has_value());
  REQUIRE(b.ex->responses.size() == 1);
  CHECK(b.ex->responses[0].status == 502);
  CHECK(b.ex->body()["error"]["code"] == "retry_budget_exhausted");
  CHECK(a.ex->responses.empty());  // still running its retry
  CHECK(has_line(h.d.render_metrics(1.0), "switchyard_router_retry_budget_exhausted_total 1"));
}

TEST_CASE("dispatcher: one failed step is one failure of its worker, however many requests it held") {
  dispatcher_config cfg = test_config();
  cfg.pool.eject_after_failures = 3;
  cfg.retry = {.ratio = 0.0, .min_retries = 1, .window_s = 10.0};  // one charged retry per 10 s
  harness h(cfg);
  start_workers(h, 2, 8);
  // Six requests over the two workers, then worker 0's step throws: an error frame for each of
  // its requests, all of the same failure.
  std::vector<client> cs;
  for (int i = 0; i < 6; ++i) cs.push_back(h.request({}, 0.1));
  auto f = h.take();
  std::vector<uint64_t> on0;
  for (const auto& c : cs)
    if (submitted_to(f, wire(c.id, 1)) == worker_ref{0}) on0.push_back(c.id);
  REQUIRE(on0.size() >= 3);
  for (const uint64_t id : on0) {
    proto::error e;
    e.request_id = wire(id, 1);
    e.code = proto::error_code::internal_error;
    e.message = "the worker's step failed";
    e.failure = 1;
    h.feed(0, proto::msg_type::error, proto::encode(e), 0.2);
  }
  f = h.take();
  // Not ejected (one failure of 3), every bystander re-sent (only the first drew on the budget).
  CHECK(h.d.workers().at(0).state == worker_state::ready);
  for (const uint64_t id : on0) CHECK(submitted_to(f, wire(id, 2)).has_value());
  const std::string m = h.d.render_metrics(0.3);
  CHECK(has_line(m, "switchyard_router_retry_budget_exhausted_total 0"));
  CHECK(has_line(m, "switchyard_router_retries_total " + std::to_string(on0.size())));
  CHECK(has_line(m, "switchyard_router_worker_ejections_total 0"));
}

TEST_CASE("dispatcher: a request that throws before it is queued gets a 500, not silence") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({.stream = true, .start_stream_throws = true}, 0.1);
  REQUIRE_FALSE(c.ex->responses.empty());
  CHECK(c.ex->responses[0].status == 500);
  CHECK(c.ex->body()["error"]["code"] == "internal_error");
  CHECK(h.d.active() == 0);
  CHECK(submits(h.take(), 0).empty());
  const std::string m = h.d.render_metrics(1.0);
  CHECK(has_line(m, "switchyard_router_internal_errors_total 1"));
  CHECK(has_line(m, "switchyard_router_requests_total{status=\"500\"} 1"));
  // The dispatcher goes on serving.
  const auto ok = h.request({}, 0.2);
  CHECK(submits(h.take(), 0).size() == 1);
  CHECK(ok.ex->log.empty());
}

TEST_CASE("dispatcher: an identical request joins the running generation, a stream from what was already sent") {
  harness h;
  start_workers(h, 1, 4);
  const auto first = h.request({.stream = true, .cache_key = "k1"}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.tokens(0, wire(first.id, 1), 1, "Hello", 1, 0.2);
  // Same key while it generates: no second submit; the stream replays "Hello" at once.
  const auto late_stream = h.request({.stream = true, .cache_key = "k1"}, 0.3);
  const auto late_whole = h.request({.cache_key = "k1"}, 0.3);
  CHECK(submits(h.take(), 0).empty());
  CHECK(h.d.active() == 1);
  CHECK(header(late_stream.ex->stream_headers, "X-Cache") == "coalesced");
  REQUIRE(late_stream.ex->events.size() == 1);
  CHECK(late_stream.ex->event(0)["choices"][0]["text"] == "Hello");
  h.tokens(0, wire(first.id, 1), 1, " world", 2, 0.4, "stop");
  for (const auto* c : {&first, &late_stream}) {
    REQUIRE(c->ex->events.size() == 3);
    CHECK(c->ex->event(1)["choices"][0]["text"] == " world");
    CHECK(c->ex->event(1)["choices"][0]["finish_reason"] == "stop");
    CHECK(c->ex->events[2] == "[DONE]");
  }
  REQUIRE(late_whole.ex->responses.size() == 1);
  CHECK(late_whole.ex->body()["choices"][0]["text"] == "Hello world");
  CHECK(header(late_whole.ex->responses[0].headers, "X-Cache") == "coalesced");
  CHECK(h.d.active() == 0);
  // Ended: the key generates afresh.
  h.request({.cache_key = "k1"}, 0.5);
  CHECK(submits(h.take(), 0).size() == 1);
  CHECK(h.d.render_metrics(1.0).find("switchyard_router_coalesced_total 2\n") != std::string::npos);
}

TEST_CASE("dispatcher: stop_reason names the worker's stop string, whole, streamed, coalesced and replayed") {
  harness h;
  start_workers(h, 1, 4);
  const auto whole = h.request({.chat = true, .cache_key = "k1"}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.tokens(0, wire(whole.id, 1), 1, "Hello", 1, 0.2);
  const auto joined = h.request({.stream = true, .chat = true, .cache_key = "k1"}, 0.25);  // coalesced
  const auto other = h.request({.stream = true, .chat = true}, 0.3);
  const auto ended = h.request({.chat = true}, 0.3);
  const auto s = submits(h.take(), 0);
  REQUIRE(s.size() == 2);
  h.tokens(0, wire(whole.id, 1), 1, " world", 2, 0.4, "stop", 5, 0, "END");
  h.tokens(0, wire(other.id, 1), 1, "Hi", 1, 0.4, "stop", 5, 0, "\n\nUser:");
  h.tokens(0, wire(ended.id, 1), 1, "Bye", 1, 0.4, "stop", 5, 0);  // the end of the turn: none named
  REQUIRE(whole.ex->responses.size() == 1);
  CHECK(whole.ex->body()["choices"][0]["message"]["content"] == "Hello world");
  CHECK(whole.ex->body()["choices"][0]["stop_reason"] == "END");
  REQUIRE(joined.ex->events.size() == 3);  // "Hello" as it was, " world" with the finish, [DONE]
  CHECK_FALSE(joined.ex->event(0)["choices"][0].contains("stop_reason"));
  CHECK(joined.ex->event(1)["choices"][0]["finish_reason"] == "stop");
  CHECK(joined.ex->event(1)["choices"][0]["stop_reason"] == "END");
  REQUIRE(other.ex->events.size() == 2);
  CHECK(other.ex->event(0)["choices"][0]["stop_reason"] == "\n\nUser:");
  REQUIRE(ended.ex->responses.size() == 1);
  CHECK(ended.ex->body()["choices"][0]["finish_reason"] == "stop");
  CHECK(ended.ex->body()["choices"][0]["stop_reason"].is_null());

  // From the response cache: the stored choice keeps its stop string.
  sy::cache::stored_response stored;
  stored.endpoint = 0;
  stored.model = k_model;
  stored.choices.push_back({{"Hel", "lo"}, sy::finish_reason::stop, {}, "END"});
  stored.choices.push_back({{"Bye"}, sy::finish_reason::length, {}, {}});
  for (const bool stream : {false, true}) {
    routed_request r;
    auto ex = std::make_shared<fake_exchange>();
    r.ex = ex;
    r.req.kind = endpoint::completions;
    r.req.stream = stream;
    r.meta.id = "cmpl-9";
    r.meta.model = k_model;
    r.meta.kind = endpoint::completions;
    replay_response(r, stored);
    if (!stream) {
      REQUIRE(ex->responses.size() == 1);
      CHECK(ex->body()["choices"][0]["stop_reason"] == "END");
      CHECK(ex->body()["choices"][1]["stop_reason"].is_null());
      continue;
    }
    REQUIRE(ex->events.size() == 4);  // Hel, lo (stop), Bye (length), [DONE]
    CHECK_FALSE(ex->event(0)["choices"][0].contains("stop_reason"));
    CHECK(ex->event(1)["choices"][0]["stop_reason"] == "END");
    CHECK(ex->event(2)["choices"][0]["stop_reason"].is_null());
  }
}

TEST_CASE("dispatcher: a coalesced generation goes on while anyone listens and is cancelled when the last leaves") {
  harness h;
  start_workers(h, 1, 4);
  const auto first = h.request({.stream = true, .cache_key = "k2"}, 0.1);
  const auto second = h.request({.stream = true, .cache_key = "k2"}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.d.on_client_gone(first.id, 0.2, h.out);  // its own client left: the other still listens
  CHECK(cancels(h.take(), 0).empty());
  h.tokens(0, wire(first.id, 1), 1, "Hi", 1, 0.3);
  CHECK(first.ex->events.empty());
  REQUIRE(second.ex->events.size() == 1);
  h.d.on_client_gone(second.id, 0.4, h.out);  // the last one: cancelled on the worker
  const auto cs = cancels(h.take(), 0);
  REQUIRE(cs.size() == 1);
  CHECK(cs[0].request_id == wire(first.id, 1));
  CHECK(h.d.active() == 0);
  CHECK(h.d.render_metrics(1.0).find("switchyard_router_client_cancels_total 2\n") != std::string::npos);
}

TEST_CASE(
    "dispatcher: ready means a ready worker heard from within the heartbeat timeout as of now_s, or a model within "
    "its no-worker grace") {
  dispatcher_config cfg = test_config();  // heartbeat timeout 2 s
  cfg.no_worker_timeout_s = 10.0;
  harness h(cfg);
  CHECK_FALSE(h.d.ready(0.0));  // never met a worker
  start_workers(h, 1, 4);       // welcomed at t=0
  CHECK(h.d.ready(1.9));
  CHECK(h.d.workers().any_ready(1.9));
  CHECK_FALSE(h.d.workers().any_ready(2.5));  // silent too long, though no tick has declared it dead yet
  CHECK(h.d.ready(2.5));                      // ... and the router is within the model's grace
  h.heartbeat(0, 2.6);
  CHECK(h.d.ready(2.7));
  h.d.tick(5.0, h.out);  // dead: the grace runs from here
  CHECK(h.d.ready(14.9));
  h.d.tick(15.1, h.out);
  CHECK_FALSE(h.d.ready(15.1));
  harness other(cfg);
  start_workers(other, 1, 4);
  other.d.drain();
  CHECK_FALSE(other.d.ready(0.5));
}

TEST_CASE("dispatcher: TTFT, inter-token time and e2e come from the given times, not a clock of its own") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({}, 10.0);  // received (stamped) at t=10
  h.take();
  h.tokens(0, wire(c.id, 1), 1, "a", 1, 10.3);
  h.tokens(0, wire(c.id, 1), 1, "b", 2, 10.32);
  h.tokens(0, wire(c.id, 1), 1, "c", 3, 11.5, "stop");
  const std::string m = h.d.render_metrics(12.0);
  CHECK(m.find("switchyard_router_ttft_seconds_bucket{le=\"0.25\"} 0\n") != std::string::npos);
  CHECK(m.find("switchyard_router_ttft_seconds_bucket{le=\"0.5\"} 1\n") != std::string::npos);
  CHECK(m.find("switchyard_router_inter_token_seconds_bucket{le=\"0.025\"} 1\n") != std::string::npos);
  CHECK(m.find("switchyard_router_inter_token_seconds_bucket{le=\"1\"} 1\n") != std::string::npos);
  CHECK(m.find("switchyard_router_e2e_seconds_bucket{le=\"1\"} 0\n") != std::string::npos);
  CHECK(m.find("switchyard_router_e2e_seconds_bucket{le=\"2.5\"} 1\n") != std::string::npos);
}

TEST_CASE(
    "dispatcher: a model whose last worker died answers 503 no_workers after the no-worker timeout, not at its "
    "deadline, and the router stays ready until then") {
  dispatcher_config cfg = test_config();
  cfg.no_worker_timeout_s = 10.0;
  harness h(cfg);
  start_workers(h, 1, 4);
  const auto first = h.request({.timeout_s = 600}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.d.tick(2.2, h.out);  // no heartbeat since 0: dead; `first` goes back to the queue (nothing was sent)
  CHECK(h.d.workers().at(0).state == worker_state::dead);
  CHECK(h.d.queued() == 1);
  const auto streamed = h.request({.stream = true, .timeout_s = 600}, 5.0);  // within the grace: queued
  CHECK(h.d.queued() == 2);
  CHECK(streamed.ex->stream_status == 200);
  CHECK(h.d.ready(5.0));  // readiness has the same grace: a rollout does not empty the Service
  h.d.tick(12.1, h.out);  // 9.9 s without a ready worker
  CHECK(h.d.queued() == 2);
  CHECK(first.ex->responses.empty());
  CHECK(h.d.ready(12.1));
  h.d.tick(12.3, h.out);  // past 10 s: both end now, not at their 600 s deadlines
  CHECK_FALSE(h.d.ready(12.3));
  CHECK(h.d.queued() == 0);
  CHECK(h.d.active() == 0);
  REQUIRE(first.ex->responses.size() == 1);
  CHECK(first.ex->responses[0].status == 503);
  CHECK(json::parse(first.ex->responses[0].body)["error"]["code"] == "no_workers");
  REQUIRE(streamed.ex->events.size() >= 2);
  CHECK(json::parse(streamed.ex->events.at(0))["error"]["code"] == "no_workers");
  CHECK(streamed.ex->events.back() == "[DONE]");
  // A new request is refused at once, with Retry-After.
  const auto late = h.request({.timeout_s = 600}, 13.0);
  REQUIRE(late.ex->responses.size() == 1);
  CHECK(late.ex->responses[0].status == 503);
  CHECK(header(late.ex->responses[0].headers, "Retry-After") == "2");
  CHECK(json::parse(late.ex->responses[0].body)["error"]["code"] == "no_workers");
  CHECK(has_line(h.d.render_metrics(13.0), "switchyard_router_no_workers_total 3"));
  // A worker comes back (relisted under a new ref after the dead grace): served again at once.
  h.take();
  const worker_ref back = h.ref_of("tcp://w0:5555");
  h.welcome(back, 4, 14.0, "worker-again");
  h.d.tick(14.1, h.out);
  h.take();
  const auto again = h.request({}, 14.2);
  REQUIRE(submits(h.take(), back).size() == 1);
  CHECK(again.ex->responses.empty());
  CHECK(h.d.ready(14.2));
}

TEST_CASE("dispatcher: a stall of the router's own loop is not its workers' death") {
  dispatcher_config cfg = test_config();  // heartbeat timeout 2 s
  cfg.stall_threshold_s = 0.5;
  harness h(cfg);
  start_workers(h, 2, 4);
  const auto c = h.request({.stream = true}, 0.1);
  auto f = h.take();
  const worker_ref w = submits(f, 0).empty() ? 1 : 0, other = 1 - w;
  h.tokens(w, wire(c.id, 1), 1, "Once", 1, 0.2);
  for (double t = 0.1; t < 1.05; t += 0.1) {
    h.heartbeat(0, t);
    h.heartbeat(1, t);
    h.d.tick(t, h.out);
  }
  // The router is SIGSTOPped from 1.0 to 21.0: on waking, its first tick sees a 20 s gap.
  h.d.tick(21.0, h.out);
  f = h.take();
  CHECK(submits(f, other).empty());  // nothing re-dispatched
  CHECK(h.d.workers().at(0).state == worker_state::ready);
  CHECK(h.d.workers().at(1).state == worker_state::ready);
  CHECK(has_line(h.d.render_metrics(21.0), "switchyard_router_stalls_total 1"));
  // The frames the worker sent meanwhile arrive: the stream goes on where it was.
  h.heartbeat(w, 21.05);
  h.tokens(w, wire(c.id, 1), 1, " upon", 2, 21.05, "length");
  CHECK(c.ex->events.back() == "[DONE]");
  // A worker that really is gone is still found out, on the time the router was awake: `other`
  // was last heard at 1.0, plus the 20 s forgiven: 21.0; dead past 23.0.
  for (double t = 21.4; t < 23.5; t += 0.4) {
    h.heartbeat(w, t);
    h.d.tick(t, h.out);
    CHECK(h.d.workers().at(w).state == worker_state::ready);
    CHECK(h.d.workers().at(other).state == (t > 23.0 ? worker_state::dead : worker_state::ready));
  }
  CHECK(has_line(h.d.render_metrics(23.4), "switchyard_router_stalls_total 1"));
}

TEST_CASE("dispatcher: a numbered tokens frame after a lost one resumes the stream from what the client has") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({.stream = true, .max_tokens = 8}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  const auto frame = [&](uint32_t attempt, uint32_t seq, std::vector<int32_t> ids, const std::string& text,
                         const std::string& finish = "") {
    proto::tokens m;
    m.request_id = wire(c.id, attempt);
    m.seq = seq;
    m.token_ids = std::move(ids);
    m.text = text;
    m.finish_reason = sy::parse_finish_reason(finish).value();
    m.usage.completion_tokens = 0;
    h.feed(0, proto::msg_type::tokens, proto::encode(m), 0.5);
  };
  frame(1, 1, {101}, "A");
  frame(1, 2, {102}, "B");
  frame(1, 4, {104}, "D");  // frame 3 was lost on the link: D must not reach the client after B
  auto f = h.take();
  REQUIRE(cancels(f, 0).size() == 1);
  const auto again = submits(f, 0);
  REQUIRE(again.size() == 1);
  CHECK(again[0].request_id == wire(c.id, 2));
  CHECK(again[0].n_generated == 2);  // the tokens the client has: A, B
  CHECK(std::vector<int32_t>(again[0].prompt.end() - 2, again[0].prompt.end()) == std::vector<int32_t>{101, 102});
  frame(1, 3, {103}, "C");  // the old attempt's frames are ignored from now on
  frame(2, 1, {103}, "C");
  frame(2, 2, {104}, "D", "length");
  std::string text;
  for (size_t i = 0; i + 1 < c.ex->events.size(); ++i) text += json::parse(c.ex->events[i])["choices"][0]["text"];
  CHECK(text == "ABCD");
  CHECK(c.ex->events.back() == "[DONE]");
  const std::string m = h.d.render_metrics(1.0);
  CHECK(has_line(m, "switchyard_router_frame_gaps_total 1"));
  CHECK(has_line(m, "switchyard_router_retries_total 0"));  // the link's loss, not a worker failure
}

TEST_CASE("dispatcher: a request that keeps losing frames on the link ends with 502 frames_lost") {
  harness h;
  start_workers(h, 1, 4);
  const auto c = h.request({.max_tokens = 8}, 0.1);
  for (uint32_t attempt = 1; attempt <= 4; ++attempt) {
    REQUIRE(submits(h.take(), 0).size() == 1);
    proto::tokens m;
    m.request_id = wire(c.id, attempt);
    m.seq = 2;  // the first frame of every attempt is lost
    m.token_ids = {100};
    h.feed(0, proto::msg_type::tokens, proto::encode(m), 0.2 * attempt);
  }
  REQUIRE(c.ex->responses.size() == 1);
  CHECK(c.ex->responses[0].status == 502);
  CHECK(json::parse(c.ex->responses[0].body)["error"]["code"] == "frames_lost");
  CHECK(h.d.active() == 0);
}

TEST_CASE("dispatcher: a started stream silent past the try-idle timeout while its worker beats resumes elsewhere") {
  dispatcher_config cfg = test_config();
  cfg.try_idle_timeout_s = 5.0;
  harness h(cfg);
  start_workers(h, 1, 4);
  const auto c = h.request({.stream = true, .max_tokens = 8}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.tokens(0, wire(c.id, 1), 1, "Once", 1, 0.2);
  // Its final frame was lost (say): the worker beats on, nothing more comes for the request.
  for (double t = 0.5; t < 5.15; t += 0.5) {
    h.heartbeat(0, t);
    h.d.tick(t, h.out);
  }
  CHECK(submits(h.take(), 0).empty());
  h.heartbeat(0, 5.3);
  h.d.tick(5.3, h.out);
  const auto f = h.take();
  CHECK(cancels(f, 0).size() == 1);
  const auto again = submits(f, 0);
  REQUIRE(again.size() == 1);
  CHECK(again[0].request_id == wire(c.id, 2));
  CHECK(again[0].n_generated == 1);
  h.tokens(0, wire(c.id, 2), 1, " upon", 2, 5.4, "length");
  CHECK(c.ex->events.back() == "[DONE]");
  CHECK(has_line(h.d.render_metrics(5.5), "switchyard_router_idle_tries_total 1"));
}

TEST_CASE("dispatcher: a prompt that took down max_attempts workers is refused at once for the query-of-death TTL") {
  dispatcher_config cfg = test_config();
  cfg.query_of_death_ttl_s = 100.0;
  harness h(cfg);  // max_attempts 2, heartbeat timeout 2 s
  start_workers(h, 3, 4);
  const auto c = h.request({.prompt = "MARKER kills workers"}, 0.1);
  REQUIRE(submits(h.take(), 0).size() == 1);
  h.heartbeat(1, 1.5);
  h.heartbeat(2, 1.5);
  h.d.tick(2.1, h.out);  // worker 0 died running it; it goes to another, which dies too
  const auto second = submitted_to(h.take(), wire(c.id, 2));
  REQUIRE(second.has_value());
  const worker_ref survivor = *second == 1 ? 2 : 1;
  h.heartbeat(survivor, 3.0);
  h.d.tick(3.6, h.out);
  REQUIRE(c.ex->responses.size() == 1);
  CHECK(c.ex->body()["error"]["code"] == "retries_exhausted");
  h.take();
  // Sent again: refused before it reaches a worker; other prompts are served.
  const auto again = h.request({.prompt = "MARKER kills workers"}, 4.0);
  REQUIRE(again.ex->responses.size() == 1);
  CHECK(again.ex->responses[0].status == 400);
  CHECK(again.ex->body()["error"]["code"] == "query_of_death");
  CHECK(h.take().empty());
  h.request({.prompt = "Something harmless"}, 4.1);
  CHECK(submits(h.take(), survivor).size() == 1);
  CHECK(has_line(h.d.render_metrics(4.2), "switchyard_router_query_of_death_refused_total 1"));
  // After the TTL it may run again (a fixed worker build, say).
  h.heartbeat(survivor, 103.0);
  h.d.tick(103.0, h.out);
  h.take();
  h.request({.prompt = "MARKER kills workers"}, 103.7);
  CHECK(submits(h.take(), survivor).size() == 1);
}
