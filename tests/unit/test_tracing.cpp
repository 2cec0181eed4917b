// Request tracing (router/tracing/trace_context.hpp, otlp_span.hpp, otlp_exporter.hpp): traceparent
// parsed and written per W3C Trace Context, a span set in OTLP JSON, the exporter's bounded queue
// and what it drops, and a POST to a real listening socket.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "router/tracing/otlp_exporter.hpp"
#include "router/tracing/otlp_span.hpp"
#include "router/tracing/request_tracing.hpp"
#include "router/tracing/trace_context.hpp"

using namespace std::chrono_literals;
using namespace sy::router;
using nlohmann::json;

namespace {
const std::string kTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
const std::string kSpan = "00f067aa0ba902b7";

span_record sample_span(const std::string& name) {
  span_record s;
  s.trace = parse_traceparent("00-" + kTrace + "-" + kSpan + "-01")->trace;
  s.id = new_span_id();
  s.name = name;
  s.start_ns = 1;
  s.end_ns = 2;
  return s;
}
}  // namespace

TEST_CASE("traceparent: a valid header parses and formats back") {
  const std::string h = "00-" + kTrace + "-" + kSpan + "-01";
  const auto c = parse_traceparent(h);
  REQUIRE(c);
  CHECK(to_hex(c->trace) == kTrace);
  CHECK(to_hex(c->parent) == kSpan);
  CHECK(c->sampled);
  CHECK(format_traceparent(c->trace, c->parent, true) == h);
  const auto unsampled = parse_traceparent("00-" + kTrace + "-" + kSpan + "-00");
  REQUIRE(unsampled);
  CHECK_FALSE(unsampled->sampled);
  // Other flag bits are kept out of `sampled`; bit 0 decides.
  CHECK(parse_traceparent("00-" + kTrace + "-" + kSpan + "-03")->sampled);
  CHECK_FALSE(parse_traceparent("00-" + kTrace + "-" + kSpan + "-02")->sampled);
}

TEST_CASE("traceparent: a future version may carry more fields after a dash") {
  CHECK(parse_traceparent("01-" + kTrace + "-" + kSpan + "-01"));
  CHECK(parse_traceparent("cc-" + kTrace + "-" + kSpan + "-01-what-the-future-holds"));
  CHECK_FALSE(parse_traceparent("cc-" + kTrace + "-" + kSpan + "-01.extra"));
}

TEST_CASE("traceparent: every invalid form is rejected") {
  const std::string zero_trace(32, '0'), zero_span(16, '0');
  const char* const names[] = {
      "version ff", "all-zero trace id", "all-zero span id",  "upper-case hex", "short trace id",  "short span id",
      "bad flags",  "bad separator",     "version 00 suffix", "empty",          "non-hex version", "long trace id"};
  const std::string bad[] = {
      "ff-" + kTrace + "-" + kSpan + "-01",           "00-" + zero_trace + "-" + kSpan + "-01",
      "00-" + kTrace + "-" + zero_span + "-01",       "00-4BF92F3577B34DA6A3CE929D0E0E4736-" + kSpan + "-01",
      "00-" + kTrace.substr(1) + "-" + kSpan + "-01", "00-" + kTrace + "-" + kSpan.substr(1) + "-01",
      "00-" + kTrace + "-" + kSpan + "-0g",           "00_" + kTrace + "_" + kSpan + "_01",
      "00-" + kTrace + "-" + kSpan + "-01-extra",     "",
      "zz-" + kTrace + "-" + kSpan + "-01",           "00-" + kTrace + "0-" + kSpan + "-01",
  };
  for (std::size_t i = 0; i < std::size(bad); ++i) {
    INFO(names[i] << ": " << bad[i]);
    CHECK_FALSE(parse_traceparent(bad[i]));
  }
}

TEST_CASE("trace ids: new ids are non-zero and differ, sampling honours the ratio bounds") {
  const auto a = new_trace_id(), b = new_trace_id();
  CHECK(a != b);
  CHECK(to_hex(a) != std::string(32, '0'));
  CHECK(new_span_id() != new_span_id());
  CHECK(sample_new_trace(1.0));
  CHECK_FALSE(sample_new_trace(0.0));
  int hits = 0;
  for (int i = 0; i < 10000; ++i) hits += sample_new_trace(0.25) ? 1 : 0;
  CHECK(hits > 2000);
  CHECK(hits < 3000);
}

TEST_CASE("otlp json: a server span and a child, ids hex, times strings, kinds, status, attributes") {
  span_record server = sample_span("POST /v1/chat/completions");
  server.kind = span_kind::server;
  server.parent = parse_traceparent("00-" + kTrace + "-" + kSpan + "-01")->parent;
  server.start_ns = 1700000000000000001ULL;
  server.end_ns = 1700000000500000000ULL;
  server.attributes = {{"gen_ai.request.model", std::string("smol")},
                       {"http.response.status_code", std::int64_t{200}},
                       {"switchyard.cache_hit", false},
                       {"ratio", 0.5}};
  span_record child = sample_span("queue");
  child.parent = server.id;
  child.error = true;
  child.status_message = "worker_failed";

  const json body = json::parse(encode_otlp_json({server, child}, "svc"));
  const json& rs = body.at("resourceSpans").at(0);
  CHECK(rs.at("resource").at("attributes").at(0) ==
        json({{"key", "service.name"}, {"value", {{"stringValue", "svc"}}}}));
  const json& spans = rs.at("scopeSpans").at(0).at("spans");
  REQUIRE(spans.size() == 2);
  const json& s0 = spans.at(0);
  CHECK(s0.at("traceId") == kTrace);
  CHECK(s0.at("parentSpanId") == kSpan);
  CHECK(s0.at("spanId") == to_hex(server.id));
  CHECK(s0.at("kind") == 2);
  CHECK(s0.at("startTimeUnixNano") == "1700000000000000001");
  CHECK(s0.at("endTimeUnixNano") == "1700000000500000000");
  CHECK(s0.at("status") == json::object());
  const json& attrs = s0.at("attributes");
  CHECK(attrs.at(0) == json({{"key", "gen_ai.request.model"}, {"value", {{"stringValue", "smol"}}}}));
  CHECK(attrs.at(1).at("value") == json({{"intValue", "200"}}));
  CHECK(attrs.at(2).at("value") == json({{"boolValue", false}}));
  CHECK(attrs.at(3).at("value") == json({{"doubleValue", 0.5}}));
  const json& s1 = spans.at(1);
  CHECK(s1.at("kind") == 1);
  CHECK(s1.at("parentSpanId") == to_hex(server.id));
  CHECK(s1.at("status") == json({{"code", 2}, {"message", "worker_failed"}}));
  // A root span has no parentSpanId.
  const json root = json::parse(encode_otlp_json({sample_span("root")}, "svc"));
  CHECK_FALSE(root["resourceSpans"][0]["scopeSpans"][0]["spans"][0].contains("parentSpanId"));
}

TEST_CASE("otlp exporter: a full queue drops and counts, never blocks") {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> posts{0};
  otlp_exporter_config cfg;
  cfg.endpoint = "http://127.0.0.1:1/v1/traces";
  cfg.queue_capacity = 4;
  cfg.batch_size = 2;
  cfg.interval = 10ms;
  otlp_exporter ex(cfg, [&](const std::string&) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });  // a collector that does not answer yet
    ++posts;
    return true;
  });
  // The first batch is taken and blocks in the post; the queue then holds 4 more at most.
  REQUIRE(ex.submit(sample_span("a")));
  REQUIRE(ex.submit(sample_span("b")));
  std::this_thread::sleep_for(100ms);
  int accepted = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) accepted += ex.submit(sample_span("x")) ? 1 : 0;
  CHECK(std::chrono::steady_clock::now() - t0 < 50ms);
  CHECK(accepted == 4);
  CHECK(ex.dropped() == 6);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  ex.stop(2s);
  CHECK(ex.exported() == 6);
  CHECK(ex.dropped() == 6);
  CHECK_FALSE(ex.submit(sample_span("late")));  // stopped: dropped
  CHECK(ex.dropped() == 7);
}

TEST_CASE("otlp exporter: a failing collector drops its batches, counted") {
  otlp_exporter_config cfg;
  cfg.batch_size = 3;
  cfg.interval = 10ms;
  otlp_exporter ex(cfg, [](const std::string&) { return false; });
  for (int i = 0; i < 5; ++i) REQUIRE(ex.submit(sample_span("s")));
  ex.stop(1s);
  CHECK(ex.dropped() == 5);
  CHECK(ex.exported() == 0);
}

TEST_CASE("otlp exporter: stop sends what is queued") {
  std::atomic<std::size_t> spans{0};
  otlp_exporter_config cfg;
  cfg.interval = 10s;  // only stop() can flush
  otlp_exporter ex(cfg, [&](const std::string& body) {
    spans += json::parse(body)["resourceSpans"][0]["scopeSpans"][0]["spans"].size();
    return true;
  });
  for (int i = 0; i < 7; ++i) ex.submit(sample_span("s"));
  ex.stop(1s);
  CHECK(spans == 7);
  CHECK(ex.exported() == 7);
}

TEST_CASE("otlp http post: endpoints are checked, a real socket gets the JSON, a closed port fails fast") {
  CHECK_THROWS_AS(check_otlp_endpoint("https://collector:4318/v1/traces"), std::invalid_argument);
  CHECK_THROWS_AS(check_otlp_endpoint("collector:4318"), std::invalid_argument);
  CHECK_THROWS_AS(check_otlp_endpoint("http://collector:43x8/v1/traces"), std::invalid_argument);
  CHECK_NOTHROW(check_otlp_endpoint("http://127.0.0.1:4318/v1/traces"));
  CHECK_NOTHROW(check_otlp_endpoint("http://[::1]:4318/v1/traces"));

  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/v1/traces";
  std::string received;
  std::thread server([&] {
    const int c = ::accept(lfd, nullptr, nullptr);
    char buf[4096];
    while (received.find("{\"x\":1}") == std::string::npos) {
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      received.append(buf, static_cast<std::size_t>(n));
    }
    const std::string ok = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    ::send(c, ok.data(), ok.size(), 0);
    ::close(c);
  });
  CHECK(http_post_json(url, "{\"x\":1}", 2000ms));
  server.join();
  ::close(lfd);
  CHECK(received.rfind("POST /v1/traces HTTP/1.1\r\n", 0) == 0);
  CHECK(received.find("Content-Type: application/json") != std::string::npos);
  // The listener is closed now: the POST fails, within the timeout.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(http_post_json(url, "{}", 500ms));
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
}

TEST_CASE("request trace: the client's context is continued, a malformed one starts a new trace") {
  const std::string name = "POST /v1/chat/completions";
  const std::string good = "00-" + kTrace + "-" + kSpan + "-01";
  CHECK_FALSE(trace_for(name, good, "", {}));  // tracing off
  const trace_policy on{.on = true, .sample_ratio = 0.0};
  const auto t = trace_for(name, good, "k=v", on);
  REQUIRE(t);
  CHECK(to_hex(t->trace) == kTrace);
  CHECK(to_hex(t->parent) == kSpan);
  CHECK(t->sampled);
  CHECK(t->tracestate == "k=v");
  CHECK(t->name == "POST /v1/chat/completions");
  CHECK(t->traceparent() == "00-" + kTrace + "-" + to_hex(t->server) + "-01");
  CHECK(trace_note(t) == " trace " + kTrace);
  const std::string bad = "ff-" + kTrace + "-" + kSpan + "-01";
  const auto fresh = trace_for(name, bad, "k=v", on);
  REQUIRE(fresh);
  CHECK(to_hex(fresh->trace) != kTrace);
  CHECK(fresh->parent == span_id{});
  CHECK_FALSE(fresh->sampled);  // ratio 0
  CHECK(fresh->tracestate.empty());
  CHECK(trace_for(name, bad, "", {.on = true, .sample_ratio = 1.0})->sampled);
  CHECK(trace_for(name, "", "", {.on = true, .sample_ratio = 1.0})->parent == span_id{});
}

TEST_CASE("request spans: server span and phase children in time order, errors on the open phase") {
  request_trace t;
  t.trace = new_trace_id();
  t.server = new_span_id();
  t.parent = new_span_id();
  t.name = "POST /v1/completions";
  request_outcome o;
  o.model = "m";
  o.tenant = "acme";
  o.prompt_tokens = 5;
  o.completion_tokens = 3;
  o.t_received_s = 100.0;
  o.t_enqueued_s = 100.1;
  o.t_dispatched_s = 100.2;
  o.t_first_token_s = 100.5;
  o.t_last_token_s = 100.9;
  o.t_end_s = 101.0;
  const uint64_t unix_now = 2'000'000'000'000'000'000ULL;  // at steady 101.0
  auto spans = request_spans(t, o, 101.0, unix_now);
  REQUIRE(spans.size() == 4);
  CHECK(spans[0].kind == span_kind::server);
  CHECK(spans[0].parent == t.parent);
  CHECK(spans[0].end_ns == unix_now);
  CHECK(spans[0].start_ns == unix_now - 1'000'000'000ULL);
  const char* names[] = {"queue", "prefill", "decode"};
  uint64_t at = spans[0].start_ns;
  for (int i = 1; i < 4; ++i) {
    CHECK(spans[i].name == names[i - 1]);
    CHECK(spans[i].parent == t.server);
    CHECK(spans[i].trace == t.trace);
    CHECK(spans[i].start_ns >= at);
    CHECK(spans[i].end_ns <= spans[0].end_ns);
    CHECK_FALSE(spans[i].error);
    at = spans[i].end_ns;
  }
  // Failed while queued: the server span and queue carry the error, no prefill or decode.
  o.status = 503;
  o.error = "no_workers";
  o.t_dispatched_s = o.t_first_token_s = o.t_last_token_s = 0;
  spans = request_spans(t, o, 101.0, unix_now);
  REQUIRE(spans.size() == 2);
  CHECK(spans[0].error);
  CHECK(spans[0].status_message == "no_workers");
  CHECK(spans[1].name == "queue");
  CHECK(spans[1].error);
  CHECK(spans[1].end_ns == unix_now);
}

namespace {
// The value of attribute `key` on `s` (nullptr: absent).
const span_attribute* attribute(const span_record& s, const std::string& key) {
  for (const auto& a : s.attributes)
    if (a.key == key) return &a;
  return nullptr;
}

request_trace sample_trace() {
  request_trace t;
  t.trace = new_trace_id();
  t.server = new_span_id();
  t.name = "POST /v1/chat/completions";
  return t;
}
}  // namespace

TEST_CASE("request spans: a cache hit has its lookup child and the hit attribute, a miss its lookup before queue") {
  const request_trace t = sample_trace();
  request_outcome o;
  o.cache_hit = true;
  o.cache = "hit";
  o.t_received_s = 100.0;
  o.t_lookup_start_s = 100.01;
  o.t_lookup_end_s = 100.03;
  o.t_end_s = 100.05;
  const uint64_t unix_now = 2'000'000'000'000'000'000ULL;  // at steady 100.05
  auto spans = request_spans(t, o, 100.05, unix_now);
  REQUIRE(spans.size() == 2);
  CHECK(std::get<std::string>(attribute(spans[0], "switchyard.cache")->value) == "hit");
  CHECK(std::get<bool>(attribute(spans[0], "switchyard.cache_hit")->value));
  CHECK(spans[1].name == "cache.lookup");
  CHECK(spans[1].parent == t.server);
  CHECK(spans[1].kind == span_kind::internal);
  const auto lookup_ns = static_cast<double>(spans[1].end_ns - spans[1].start_ns);
  CHECK(std::abs(lookup_ns - 20e6) < 1e3);  // its duration, 20 ms (within rounding)
  CHECK(std::get<std::string>(attribute(spans[1], "switchyard.cache")->value) == "hit");
  // A miss: the lookup, then the phases; a failure later never marks the lookup.
  o.cache_hit = false;
  o.cache = "miss";
  o.t_enqueued_s = 100.04;
  o.status = 503;
  o.error = "queue_timeout";
  spans = request_spans(t, o, 100.05, unix_now);
  REQUIRE(spans.size() == 3);
  CHECK(spans[1].name == "cache.lookup");
  CHECK_FALSE(spans[1].error);
  CHECK(spans[2].name == "queue");
  CHECK(spans[2].error);
  CHECK(spans[2].start_ns >= spans[1].end_ns);
  // No lookup asked: no attribute, no child.
  o.cache.clear();
  spans = request_spans(t, o, 100.05, unix_now);
  CHECK(spans.size() == 2);
  CHECK(attribute(spans[0], "switchyard.cache") == nullptr);
}

TEST_CASE("request spans: a coalesced client's server span names and links the leader's, no phases") {
  const request_trace t = sample_trace();
  const request_trace leader = sample_trace();
  request_outcome o;
  o.coalesced_onto = span_link{leader.trace, leader.server};
  o.t_received_s = 100.0;
  o.t_end_s = 101.0;
  const auto spans = request_spans(t, o, 101.0, 2'000'000'000'000'000'000ULL);
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].trace == t.trace);
  CHECK(std::get<bool>(attribute(spans[0], "switchyard.coalesced")->value));
  CHECK(std::get<std::string>(attribute(spans[0], "switchyard.coalesced.trace_id")->value) == to_hex(leader.trace));
  REQUIRE(spans[0].links.size() == 1);
  CHECK(spans[0].links[0].trace == leader.trace);
  CHECK(spans[0].links[0].span == leader.server);
  // In OTLP JSON: links with hex ids; a span without links writes none.
  const json body = json::parse(encode_otlp_json(spans, "svc"));
  const json& s = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  CHECK(s.at("links") == json::array({{{"traceId", to_hex(leader.trace)}, {"spanId", to_hex(leader.server)}}}));
  const json plain = json::parse(encode_otlp_json({sample_span("x")}, "svc"));
  CHECK_FALSE(plain["resourceSpans"][0]["scopeSpans"][0]["spans"][0].contains("links"));
}

TEST_CASE("request spans: a refusal before admission is a lone server span with its status and error code") {
  const request_trace t = sample_trace();
  request_outcome o;
  o.status = 429;
  o.error = "tenant_rate";
  o.tenant = "slow";
  o.t_received_s = 100.0;
  o.t_end_s = 100.001;
  const auto spans = request_spans(t, o, 100.001, 2'000'000'000'000'000'000ULL);
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].kind == span_kind::server);
  CHECK(spans[0].error);
  CHECK(spans[0].status_message == "tenant_rate");
  CHECK(std::get<std::int64_t>(attribute(spans[0], "http.response.status_code")->value) == 429);
  CHECK(std::get<std::string>(attribute(spans[0], "error.type")->value) == "tenant_rate");
  CHECK(attribute(spans[0], "switchyard.cache") == nullptr);
  // A success names no error.type.
  o.status = 200;
  o.error.clear();
  CHECK(attribute(request_spans(t, o, 100.001, 2'000'000'000'000'000'000ULL)[0], "error.type") == nullptr);
}
