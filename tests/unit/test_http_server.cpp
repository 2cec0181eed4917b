// The router's HTTP/1.1 server over real sockets on 127.0.0.1: framing, limits, deadlines,
// SSE streaming, answers from other threads, disconnect detection, and thousands of
// connections on one I/O thread. The client is a small blocking one written here.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "router/http/http_server.hpp"

using namespace sy::router;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

struct client_response {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;                                          // de-chunked
  std::vector<std::string> chunks;                           // when chunked

  std::string header(const std::string& name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return {};
  }
};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A blocking HTTP/1.1 client on one socket; every read gives up after 5 s.
class test_client {
 public:
  // `from`: the local address to connect from (any 127.x.y.z is this machine's loopback).
  explicit test_client(int port, const char* from = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (from) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, from, &local.sin_addr);
      ::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local);
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~test_client() { close_now(); }
  test_client(const test_client&) = delete;
  test_client& operator=(const test_client&) = delete;

  bool connected() const { return fd_ >= 0; }

  bool send(std::string_view s) {
    while (!s.empty()) {
      const auto n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      s.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  void close_now() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Closes with a reset instead of a FIN.
  void reset_now() {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close_now();
  }

  // One response (an interim 1xx one too); nullopt when the connection ended or timed out.
  std::optional<client_response> read_response() {
    client_response r;
    auto status_line = read_line();
    if (!status_line) return std::nullopt;
    if (std::sscanf(status_line->c_str(), "HTTP/1.%*d %d", &r.status) != 1) return std::nullopt;
    for (;;) {
      auto line = read_line();
      if (!line) return std::nullopt;
      if (line->empty()) break;
      const auto colon = line->find(':');
      if (colon == std::string::npos) return std::nullopt;
      auto value = line->substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      r.headers.emplace_back(lower(line->substr(0, colon)), value);
    }
    if (r.status < 200) return r;
    if (lower(r.header("transfer-encoding")) == "chunked") {
      for (;;) {
        auto size_line = read_line();
        if (!size_line) return std::nullopt;
        const size_t size = std::stoul(*size_line, nullptr, 16);
        std::string chunk;
        if (!read_exact(size + 2, chunk)) return std::nullopt;
        chunk.resize(size);
        if (size == 0) break;
        r.body += chunk;
        r.chunks.push_back(std::move(chunk));
      }
    } else if (!r.header("content-length").empty()) {
      if (!read_exact(std::stoul(r.header("content-length")), r.body)) return std::nullopt;
    } else {
      while (fill()) {
      }
      r.body = std::move(buf_);
      buf_.clear();
    }
    return r;
  }

  // True when the server closes (FIN or reset) within `within`; data that arrives is kept.
  bool wait_closed(std::chrono::milliseconds within) {
    const auto until = steady::now() + within;
    while (steady::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - steady::now()).count();
      if (::poll(&p, 1, static_cast<int>(std::max<long>(1, left))) <= 0) continue;
      char tmp[4096];
      const auto n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n <= 0) return true;
      buf_.append(tmp, static_cast<size_t>(n));
    }
    return false;
  }

 private:
  bool fill() {
    char tmp[16384];
    const auto n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  std::optional<std::string> read_line() {
    for (;;) {
      const auto eol = buf_.find("\r\n");
      if (eol != std::string::npos) {
        auto line = buf_.substr(0, eol);
        buf_.erase(0, eol + 2);
        return line;
      }
      if (!fill()) return std::nullopt;
    }
  }

  bool read_exact(size_t n, std::string& out) {
    while (buf_.size() < n)
      if (!fill()) return false;
    out.append(buf_, 0, n);
    buf_.erase(0, n);
    return true;
  }

  int fd_ = -1;
  std::string buf_;
};

http_server_config test_config() {
  http_server_config c;
  c.host = "127.0.0.1";
  c.port = 0;
  c.threads = 2;
  return c;
}

// Answers at once with what it got.
void echo(std::shared_ptr<http_exchange> ex, http_request&& req) {
  http_response r;
  r.content_type = "text/plain";
  r.body = req.method + " " + req.path + " " + req.body;
  r.headers.emplace_back("X-Target", req.target);
  r.headers.emplace_back("X-Host", std::string(req.header("host")));
  ex->respond(std::move(r));
}

// Keeps exchanges for the test to answer later, from its own thread.
struct parked_exchanges {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<http_exchange>> list;

  void park(std::shared_ptr<http_exchange> ex) {
    std::lock_guard lock(mu);
    list.push_back(std::move(ex));
    cv.notify_all();
  }

  bool wait_for(size_t n, std::chrono::milliseconds within) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, within, [&] { return list.size() >= n; });
  }

  std::vector<std::shared_ptr<http_exchange>> take() {
    std::lock_guard lock(mu);
    return std::exchange(list, {});
  }
};

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds within = 2000ms) {
  const auto until = steady::now() + within;
  while (!pred()) {
    if (steady::now() > until) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

const char* const get_request = "GET /v1/models?x=1 HTTP/1.1\r\nHost: test\r\n\r\n";

}  // namespace

TEST_CASE("http_server: GET gets 200 with its body and Content-Length") {
  http_server server(test_config(), echo);
  REQUIRE(server.port() > 0);
  test_client c(server.port());
  REQUIRE(c.connected());
  REQUIRE(c.send(get_request));
  auto r = c.read_response();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "GET /v1/models ");
  CHECK(r->header("content-length") == std::to_string(r->body.size()));
  CHECK(r->header("content-type") == "text/plain");
  CHECK(r->header("server") == "switchyard");
  CHECK(r->header("x-target") == "/v1/models?x=1");
  CHECK(r->header("x-host") == "test");
  CHECK(lower(r->header("connection")) == "keep-alive");
  CHECK(server.counters().requests == 1);
  CHECK(server.counters().connections_accepted == 1);
}

TEST_CASE("http_server: request fields reach the handler") {
  std::mutex mu;
  http_request seen;
  http_server server(test_config(), [&](std::shared_ptr<http_exchange> ex, http_request&& req) {
    {
      std::lock_guard lock(mu);
      seen = req;
    }
    ex->respond({});
  });
  test_client c(server.port());
  REQUIRE(
      c.send("POST /v1/chat/completions?stream=1 HTTP/1.1\r\nHost: h\r\nX-Tenant-Id: Acme\r\n"
             "Content-Length: 5\r\n\r\nhello"));
  REQUIRE(c.read_response());
  std::lock_guard lock(mu);
  CHECK(seen.method == "POST");
  CHECK(seen.target == "/v1/chat/completions?stream=1");
  CHECK(seen.path == "/v1/chat/completions");
  CHECK(seen.body == "hello");
  CHECK(seen.header("x-tenant-id") == "Acme");
  CHECK(seen.header("missing").empty());
  CHECK(seen.remote.rfind("127.0.0.1:", 0) == 0);
  CHECK(seen.received.time_since_epoch().count() != 0);
}

TEST_CASE("http_server: keep-alive serves several requests on one connection, pipelined ones in order") {
  http_server server(test_config(), echo);
  test_client c(server.port());
  REQUIRE(c.send("GET /a HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto a = c.read_response();
  REQUIRE(a);
  CHECK(a->body == "GET /a ");
  REQUIRE(c.send("POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nxyz"));
  auto b = c.read_response();
  REQUIRE(b);
  CHECK(b->body == "POST /b xyz");

  // Three requests in one send, the last asking to close.
  REQUIRE(
      c.send("GET /1 HTTP/1.1\r\nHost: t\r\n\r\nPOST /2 HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"
             "GET /3 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"));
  for (const char* want : {"GET /1 ", "POST /2 hi", "GET /3 "}) {
    auto r = c.read_response();
    REQUIRE(r);
    CHECK(r->body == want);
  }
  CHECK(c.wait_closed(2000ms));
  CHECK(server.counters().requests == 5);
  CHECK(server.counters().connections_accepted == 1);
}

TEST_CASE("http_server: requests after a pipelined pair are read intact (the read buffer is not moved under a read)") {
  // The read kept pending while a response is outstanding must not lose its place when the
  // buffered next request is consumed, nor when the buffer shrinks after a large body.
  http_server server(test_config(), echo);
  test_client c(server.port());
  REQUIRE(
      c.send("POST /1 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc"
             "POST /2 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\ndef"));
  for (const char* want : {"POST /1 abc", "POST /2 def"}) {
    auto r = c.read_response();
    REQUIRE(r);
    CHECK(r->body == want);
  }
  const std::string big(100000, 'b');
  REQUIRE(c.send("POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n" + big));
  auto r = c.read_response();
  REQUIRE(r);
  CHECK(r->body == "POST /big " + big);
  for (int i = 0; i < 20; ++i) {
    const std::string path = "/next-request-" + std::to_string(i);
    REQUIRE(c.send("POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nwxyz"));
    r = c.read_response();
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->body == "POST " + path + " wxyz");
  }
}

TEST_CASE("http_server: HTTP/1.0 gets Connection close") {
  http_server server(test_config(), echo);
  test_client c(server.port());
  REQUIRE(c.send("GET /old HTTP/1.0\r\n\r\n"));
  auto r = c.read_response();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(lower(r->header("connection")) == "close");
  CHECK(c.wait_closed(2000ms));
}

TEST_CASE("http_server: a body over max_body_bytes gets 413 with a JSON error") {
  auto config = test_config();
  config.max_body_bytes = 1000;
  http_server server(config, echo);

  SECTION("declared by Content-Length") {
    test_client c(server.port());
    REQUIRE(
        c.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n" + std::string(5000, 'x')));
    auto r = c.read_response();
    REQUIRE(r);
    CHECK(r->status == 413);
    CHECK(r->header("content-type") == "application/json");
    CHECK(r->body ==
          R"({"error":{"message":"request body exceeds 1000 bytes","type":"invalid_request_error","param":null,)"
          R"("code":"body_too_large"}})");
    CHECK(c.wait_closed(2000ms));
  }
  SECTION("found while reading chunks") {
    test_client c(server.port());
    REQUIRE(c.send("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + std::string(1024, 'x') +
                   "\r\n0\r\n\r\n"));
    auto r = c.read_response();
    REQUIRE(r);
    CHECK(r->status == 413);
    CHECK(c.wait_closed(2000ms));
  }
  CHECK(server.counters().bad_requests == 1);
  CHECK(server.counters().requests == 0);
}

TEST_CASE("http_server: a header over max_header_bytes gets 431") {
  auto config = test_config();
  config.max_header_bytes = 1024;
  http_server server(config, echo);
  test_client c(server.port());
  REQUIRE(c.send("GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(4000, 'a') + "\r\n\r\n"));
  auto r = c.read_response();
  REQUIRE(r);
  CHECK(r->status == 431);
  CHECK(r->body.find(R"("code":"header_too_large")") != std::string::npos);
  CHECK(r->body.find("request header exceeds 1024 bytes") != std::string::npos);
  CHECK(c.wait_closed(2000ms));
  CHECK(server.counters().bad_requests == 1);
}

TEST_CASE("http_server: a malformed request line gets 400") {
  http_server server(test_config(), echo);
  test_client c(server.port());
  REQUIRE(c.send("THIS IS NOT HTTP\r\n\r\n"));
  auto r = c.read_response();
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(r->body.find(R"("type":"invalid_request_error")") != std::string::npos);
  CHECK(r->body.find(R"("code":"bad_request")") != std::string::npos);
  CHECK(c.wait_closed(2000ms));
  CHECK(server.counters().bad_requests == 1);
  CHECK(server.counters().requests == 0);
}

TEST_CASE("http_server: unsupported Transfer-Encoding gets 400 and chunked bodies are read") {
  http_server server(test_config(), echo);
  {
    test_client c(server.port());
    REQUIRE(c.send("POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\nabc"));
    auto r = c.read_response();
    REQUIRE(r);
    CHECK(r->status == 400);
    CHECK(c.wait_closed(2000ms));
  }
  {
    test_client c(server.port());
    REQUIRE(
        c.send("POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
    auto r = c.read_response();
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->body == "POST /x abcde");
  }
}

TEST_CASE("http_server: Expect 100-continue gets an interim response before the body is sent") {
  http_server server(test_config(), echo);
  test_client c(server.port());
  REQUIRE(c.send("POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"));
  auto interim = c.read_response();
  REQUIRE(interim);
  CHECK(interim->status == 100);
  REQUIRE(c.send("body"));
  auto r = c.read_response();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "POST /e body");
}

TEST_CASE("http_server: a slow header is cut off after header_timeout") {
  auto config = test_config();
  config.header_timeout = 300ms;
  http_server server(config, echo);
  test_client c(server.port());
  REQUIRE(c.send("GET / HTTP/1.1\r\nHost: t\r\n"));
  // A byte every 100 ms: each one alone would keep an idle timer alive.
  const auto t0 = steady::now();
  bool closed = false;
  while (!closed && steady::now() - t0 < 3s) {
    c.send("X");
    closed = c.wait_closed(100ms);
  }
  CHECK(closed);
  CHECK(steady::now() - t0 < 2500ms);
  CHECK(server.counters().timeouts == 1);
  CHECK(server.counters().requests == 0);
}

TEST_CASE("http_server: a slow body gets 408") {
  auto config = test_config();
  config.body_timeout = 300ms;
  http_server server(config, echo);
  test_client c(server.port());
  REQUIRE(c.send("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789"));
  const auto t0 = steady::now();
  auto r = c.read_response();
  REQUIRE(r);
  CHECK(steady::now() - t0 < 3s);
  CHECK(r->status == 408);
  CHECK(r->body.find(R"("code":"request_timeout")") != std::string::npos);
  CHECK(c.wait_closed(2000ms));
  CHECK(server.counters().timeouts == 1);
}

TEST_CASE("http_server: an idle keep-alive connection is closed after idle_timeout") {
  auto config = test_config();
  config.idle_timeout = 300ms;
  http_server server(config, echo);
  test_client c(server.port());
  REQUIRE(c.send(get_request));
  REQUIRE(c.read_response());
  const auto t0 = steady::now();
  CHECK(c.wait_closed(3000ms));
  CHECK(steady::now() - t0 < 2500ms);
  CHECK(server.counters().timeouts == 1);
}

TEST_CASE("http_server: an SSE stream delivers its events in order, then keep-alive goes on") {
  std::atomic<int> written{0};
  std::atomic<bool> negative{false};
  auto config = test_config();
  config.on_written = [&](double seconds) {
    if (seconds < 0) negative = true;
    ++written;
  };
  http_server server(config, [](std::shared_ptr<http_exchange> ex, http_request&& req) {
    if (req.path != "/stream") return echo(std::move(ex), std::move(req));
    ex->start_stream(200, {{"X-Request-Id", "r1"}});
    const auto t = steady::now();
    ex->send_event(R"({"n":1})", t);
    ex->send_event(R"({"n":2})", t);
    ex->send_event("[DONE]", t);
    ex->end_stream();
    ex->send_event("after the end");  // ignored
  });
  test_client c(server.port());
  REQUIRE(c.send("POST /stream HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"));
  auto r = c.read_response();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->header("content-type") == "text/event-stream");
  CHECK(r->header("cache-control") == "no-cache");
  CHECK(r->header("x-accel-buffering") == "no");
  CHECK(r->header("x-request-id") == "r1");
  CHECK(r->header("content-length").empty());
  CHECK(r->body == "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n");
  CHECK(r->chunks.size() >= 1);
  REQUIRE(c.send(get_request));
  auto next = c.read_response();
  REQUIRE(next);
  CHECK(next->body == "GET /v1/models ");
  CHECK(eventually([&] { return written.load() == 3; }));
  CHECK_FALSE(negative);
}

TEST_CASE("http_server: events sent from another thread arrive as they are written") {
  parked_exchanges parked;
  http_server server(test_config(), [&](std::shared_ptr<http_exchange> ex, http_request&&) {
    ex->start_stream(200, {});
    parked.park(std::move(ex));
  });
  test_client c(server.port());
  REQUIRE(c.send(get_request));
  REQUIRE(parked.wait_for(1, 2000ms));
  auto ex = parked.take().front();
  std::thread producer([ex] {
    for (int i = 0; i < 3; ++i) {
      ex->send_event("event " + std::to_string(i));
      std::this_thread::sleep_for(20ms);
    }
    ex->end_stream();
  });
  auto r = c.read_response();
  producer.join();
  REQUIRE(r);
  CHECK(r->body == "data: event 0\n\ndata: event 1\n\ndata: event 2\n\n");
}

TEST_CASE("http_server: a response from another thread after a delay") {
  parked_exchanges parked;
  http_server server(test_config(), [&](std::shared_ptr<http_exchange> ex, http_request&&) { parked.park(ex); });
  test_client c(server.port());
  REQUIRE(c.send(get_request));
  std::thread answerer([&] {
    if (!parked.wait_for(1, 2000ms)) return;
    std::this_thread::sleep_for(100ms);
    for (auto& ex : parked.take()) {
      CHECK_FALSE(ex->disconnected());
      ex->respond({201, "application/json", {{"X-Later", "yes"}}, R"({"ok":true})"});
      ex->respond({500, "text/plain", {}, "second answer is ignored"});
    }
  });
  auto r = c.read_response();
  answerer.join();
  REQUIRE(r);
  CHECK(r->status == 201);
  CHECK(r->body == R"({"ok":true})");
  CHECK(r->header("x-later") == "yes");
  // The connection is still usable and answers the next request the same way.
  REQUIRE(c.send(get_request));
  REQUIRE(parked.wait_for(1, 2000ms));
  for (auto& ex : parked.take()) ex->respond({200, "text/plain", {}, "again"});
  auto again = c.read_response();
  REQUIRE(again);
  CHECK(again->body == "again");
}

TEST_CASE("http_server: a client that goes away while waiting fires on_disconnect once") {
  std::mutex mu;
  std::condition_variable cv;
  int fired = 0;
  std::shared_ptr<http_exchange> held;
  http_server server(test_config(), [&](std::shared_ptr<http_exchange> ex, http_request&&) {
    // The callback holds the exchange itself: the server must break that cycle.
    ex->on_disconnect([&, ex] {
      std::lock_guard lock(mu);
      ++fired;
      cv.notify_all();
    });
    std::lock_guard lock(mu);
    held = std::move(ex);
  });
  test_client c(server.port());
  REQUIRE(c.send(get_request));
  REQUIRE(eventually([&] {
    std::lock_guard lock(mu);
    return held != nullptr;
  }));
  SECTION("by closing") { CHECK_NOTHROW(c.close_now()); }
  SECTION("by resetting") { CHECK_NOTHROW(c.reset_now()); }
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, 2s, [&] { return fired > 0; }));
  }
  std::weak_ptr<http_exchange> weak;
  {
    std::lock_guard lock(mu);
    CHECK(held->disconnected());
    held->respond({});  // ignored: the client is gone
    weak = held;
    held.reset();
  }
  // Nothing else holds the exchange once the handler lets go.
  CHECK(eventually([&] { return weak.expired(); }));
  // The barrier: a connection is counted open until it is destroyed, after its disconnect
  // callback (connection::abandon_exchange) ran, so no call can come later.
  CHECK(eventually([&] { return server.counters().connections_open == 0; }));
  std::lock_guard lock(mu);
  CHECK(fired == 1);
  CHECK(server.counters().client_disconnects == 1);
}

TEST_CASE("http_server: a client that goes away mid-stream fires on_disconnect") {
  std::atomic<int> fired{0};
  parked_exchanges parked;
  http_server server(test_config(), [&](std::shared_ptr<http_exchange> ex, http_request&&) {
    ex->on_disconnect([&] { ++fired; });
    ex->start_stream(200, {});
    ex->send_event("first");
    parked.park(std::move(ex));
  });
  test_client c(server.port());
  REQUIRE(c.send(get_request));
  REQUIRE(parked.wait_for(1, 2000ms));
  c.close_now();
  CHECK(eventually([&] { return fired.load() == 1; }));
  auto ex = parked.take().front();
  CHECK(ex->disconnected());
  ex->send_event("nobody listens");  // ignored
  ex->end_stream();
  CHECK(server.counters().client_disconnects == 1);
}

TEST_CASE("http_server: on_disconnect does not fire for a completed response") {
  std::atomic<int> fired{0};
  parked_exchanges parked;
  http_server server(test_config(), [&](std::shared_ptr<http_exchange> ex, http_request&& req) {
    ex->on_disconnect([&] { ++fired; });
    if (req.path == "/stream") {
      ex->start_stream(200, {});
      ex->send_event("x");
      ex->end_stream();
    } else {
      parked.park(std::move(ex));
    }
  });
  {
    test_client c(server.port());
    REQUIRE(c.send(get_request));
    REQUIRE(parked.wait_for(1, 2000ms));
    std::thread answerer([&] {
      for (auto& ex : parked.take()) ex->respond({200, "text/plain", {}, "done"});
    });
    auto r = c.read_response();
    answerer.join();
    REQUIRE(r);
    CHECK(r->body == "done");
    REQUIRE(c.send("GET /stream HTTP/1.1\r\nHost: t\r\n\r\n"));
    auto s = c.read_response();
    REQUIRE(s);
    CHECK(s->body == "data: x\n\n");
  }
  // Counted open until destroyed, after any disconnect callback: nothing can fire after this.
  CHECK(eventually([&] { return server.counters().connections_open == 0; }));
  CHECK(fired == 0);
  CHECK(server.counters().client_disconnects == 0);
  CHECK(server.counters().requests == 2);
}

TEST_CASE("http_server: a handler that throws gets a 500 and the server keeps serving") {
  http_server server(test_config(), [](std::shared_ptr<http_exchange> ex, http_request&& req) {
    if (req.path == "/boom") throw std::runtime_error("boom");
    echo(std::move(ex), std::move(req));
  });
  test_client c(server.port());
  REQUIRE(c.send("GET /boom HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto r = c.read_response();
  REQUIRE(r);
  CHECK(r->status == 500);
  CHECK(r->body.find(R"("type":"server_error")") != std::string::npos);
  REQUIRE(c.send(get_request));
  auto ok = c.read_response();
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("http_server: connections beyond max_connections are closed at once") {
  auto config = test_config();
  config.max_connections = 2;
  parked_exchanges parked;
  http_server server(config, [&](std::shared_ptr<http_exchange> ex, http_request&&) { parked.park(ex); });
  test_client a(server.port()), b(server.port());
  REQUIRE(a.send(get_request));
  REQUIRE(b.send(get_request));
  REQUIRE(parked.wait_for(2, 2000ms));
  test_client extra(server.port());
  CHECK(extra.wait_closed(2000ms));
  CHECK(server.counters().connections_refused == 1);
  CHECK(server.counters().connections_accepted == 2);
  for (auto& ex : parked.take()) ex->respond({});
  CHECK(a.read_response());
  CHECK(b.read_response());
}

TEST_CASE("http_server: connections beyond max_connections_per_address from one address are closed at once") {
  auto config = test_config();
  config.max_connections_per_address = 2;
  parked_exchanges parked;
  http_server server(config, [&](std::shared_ptr<http_exchange> ex, http_request&&) { parked.park(ex); });
  test_client a(server.port()), b(server.port());
  REQUIRE(a.send(get_request));
  REQUIRE(b.send(get_request));
  REQUIRE(parked.wait_for(2, 2000ms));
  test_client extra(server.port());
  CHECK(extra.wait_closed(2000ms));
  CHECK(server.counters().connections_refused_per_address == 1);
  // Another address is not held back by the first one's connections.
  test_client other(server.port(), "127.0.0.2");
  REQUIRE(other.send(get_request));
  REQUIRE(parked.wait_for(3, 2000ms));
  for (auto& ex : parked.take()) ex->respond({});
  CHECK(a.read_response());
  CHECK(b.read_response());
  CHECK(other.read_response());
  // Once one of the first address's connections closed, it may open another.
  a.close_now();
  CHECK(eventually([&] { return server.counters().connections_open == 2; }));
  test_client again(server.port());
  REQUIRE(again.send(get_request));
  REQUIRE(parked.wait_for(1, 2000ms));
  for (auto& ex : parked.take()) ex->respond({});
  CHECK(again.read_response());
  CHECK(server.counters().connections_refused_per_address == 1);
}

TEST_CASE("http_server: bodies over the in-flight body budget are refused with 503 from their header") {
  auto config = test_config();
  config.max_inflight_body_bytes = 100000;
  http_server server(config, echo);
  // A slow client declares 80 KB and sends 10: its reservation holds the budget.
  test_client slow(server.port());
  REQUIRE(slow.send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 80000\r\n\r\n" + std::string(10000, 'a')));
  CHECK(eventually([&] { return server.counters().body_bytes_inflight == 80000; }));
  // 30 KB more does not fit: 503 router_busy with Retry-After, without the body being read.
  test_client refused(server.port());
  REQUIRE(refused.send("POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 30000\r\n\r\n"));
  auto r = refused.read_response();
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK(r->header("retry-after") == "1");
  CHECK(r->body.find("router_busy") != std::string::npos);
  CHECK(server.counters().body_budget_refusals == 1);
  // 15 KB fits, and a body-less request never counts.
  test_client small(server.port());
  REQUIRE(small.send("POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 15000\r\n\r\n" + std::string(15000, 'c')));
  auto rs = small.read_response();
  REQUIRE(rs);
  CHECK(rs->status == 200);
  REQUIRE(small.send(get_request));
  CHECK(small.read_response());
  // The slow body completes: its bytes go back to the budget, and the refused size fits now.
  REQUIRE(slow.send(std::string(70000, 'a')));
  auto rl = slow.read_response();
  REQUIRE(rl);
  CHECK(rl->status == 200);
  CHECK(rl->body.size() == std::string("POST /a ").size() + 80000);
  CHECK(eventually([&] { return server.counters().body_bytes_inflight == 0; }));
  test_client later(server.port());
  REQUIRE(later.send("POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 30000\r\n\r\n" + std::string(30000, 'b')));
  auto rb = later.read_response();
  REQUIRE(rb);
  CHECK(rb->status == 200);
  // A client that goes away mid-body gives its reservation back too.
  {
    test_client gone(server.port());
    REQUIRE(gone.send("POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 90000\r\n\r\nxyz"));
    CHECK(eventually([&] { return server.counters().body_bytes_inflight == 90000; }));
  }
  CHECK(eventually([&] { return server.counters().body_bytes_inflight == 0; }));
}

TEST_CASE("http_server: close_keep_alive closes idle connections now and every other after its response") {
  parked_exchanges parked;
  http_server server(test_config(), [&](std::shared_ptr<http_exchange> ex, http_request&& req) {
    if (req.path == "/park") {
      parked.park(std::move(ex));
      return;
    }
    echo(std::move(ex), std::move(req));
  });
  test_client idle(server.port()), busy(server.port());
  REQUIRE(idle.send(get_request));
  auto first = idle.read_response();
  REQUIRE(first);
  CHECK(first->header("connection") == "keep-alive");
  REQUIRE(busy.send("GET /park HTTP/1.1\r\nHost: x\r\n\r\n"));
  REQUIRE(parked.wait_for(1, 2000ms));
  server.close_keep_alive();
  CHECK(idle.wait_closed(2000ms));  // between requests: closed at once
  for (auto& ex : parked.take()) ex->respond({});
  auto answered = busy.read_response();  // answered, then closed
  REQUIRE(answered);
  CHECK(answered->header("connection") == "close");
  CHECK(busy.wait_closed(2000ms));
  test_client fresh(server.port());  // still accepted and served, one request per connection
  REQUIRE(fresh.send(get_request));
  auto r = fresh.read_response();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->header("connection") == "close");
  CHECK(fresh.wait_closed(2000ms));
}

TEST_CASE("http_server: binding a taken port throws naming host and port") {
  http_server first(test_config(), echo);
  auto config = test_config();
  config.port = first.port();
  const std::string where = "127.0.0.1:" + std::to_string(first.port());
  CHECK_THROWS_WITH(http_server(config, echo), Catch::Contains(where));
  config.host = "not-an-address.invalid";
  CHECK_THROWS_AS(http_server(config, echo), std::runtime_error);
}

TEST_CASE("http_server: 2000 concurrent connections are all answered with one I/O thread") {
  constexpr size_t n = 2000;
  auto config = test_config();
  config.threads = 1;
  parked_exchanges parked;
  http_server server(config, [&](std::shared_ptr<http_exchange> ex, http_request&& req) {
    if (req.path == "/stream") ex->start_stream(200, {});
    parked.park(std::move(ex));
  });
  const auto t0 = steady::now();
  std::vector<std::unique_ptr<test_client>> clients;
  clients.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<test_client>(server.port()));
    REQUIRE(clients.back()->connected());
    const std::string path = i % 2 ? "/stream" : "/plain";
    REQUIRE(clients.back()->send("GET " + path + " HTTP/1.1\r\nHost: t\r\n\r\n"));
  }
  REQUIRE(parked.wait_for(n, 30000ms));
  CHECK(server.counters().connections_open == n);
  std::thread answerer([&] {
    for (auto& ex : parked.take()) {
      ex->respond({200, "text/plain", {}, "plain"});  // ignored for the streams
      ex->send_event("one");
      ex->send_event("two");
      ex->end_stream();
    }
  });
  size_t ok = 0;
  for (size_t i = 0; i < n; ++i) {
    auto r = clients[i]->read_response();
    if (!r) continue;
    if (i % 2 ? r->body == "data: one\n\ndata: two\n\n" : r->body == "plain") ++ok;
  }
  answerer.join();
  CHECK(ok == n);
  const auto wall = std::chrono::duration<double>(steady::now() - t0).count();
  WARN("2000 connections: " << wall << " s from the first connect to the last response");
  CHECK(server.counters().requests == n);
  CHECK(server.counters().client_disconnects == 0);
}

TEST_CASE("http_server: stop with open connections returns promptly") {
  std::atomic<int> fired{0};
  parked_exchanges parked;
  auto server =
      std::make_unique<http_server>(test_config(), [&](std::shared_ptr<http_exchange> ex, http_request&& req) {
        ex->on_disconnect([&] { ++fired; });
        if (req.path == "/stream") ex->start_stream(200, {});
        parked.park(std::move(ex));
      });
  std::vector<std::unique_ptr<test_client>> clients;
  for (int i = 0; i < 12; ++i) {
    clients.push_back(std::make_unique<test_client>(server->port()));
    if (i % 3 == 1) REQUIRE(clients.back()->send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n"));
    if (i % 3 == 2) REQUIRE(clients.back()->send("GET /stream HTTP/1.1\r\nHost: t\r\n\r\n"));
  }
  REQUIRE(parked.wait_for(8, 2000ms));
  REQUIRE(eventually([&] { return server->counters().connections_open == 12; }));
  const auto t0 = steady::now();
  server->stop();
  CHECK(steady::now() - t0 < 1500ms);
  server->stop();  // idempotent
  for (auto& c : clients) CHECK(c->wait_closed(2000ms));
  CHECK(fired == 8);
  // Exchanges outliving the server are inert.
  for (auto& ex : parked.take()) {
    CHECK(ex->disconnected());
    ex->respond({});
    ex->send_event("x");
  }
  server.reset();
}

namespace {

// A connected socket whose receive buffer is as small as the kernel allows, so that a client
// that stops reading closes its TCP window after a few KB.
int small_window_socket(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int small = 1024;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Streams 1 KB events from its own thread until the exchange is gone or `n` were sent.
struct event_pump {
  std::thread t;
  void start(std::shared_ptr<http_exchange> ex, int n, std::chrono::milliseconds every) {
    t = std::thread([ex = std::move(ex), n, every] {
      const std::string kb(1024, 'x');
      for (int i = 0; i < n && !ex->disconnected(); ++i) {
        ex->send_event(kb);
        std::this_thread::sleep_for(every);
      }
      ex->end_stream();
    });
  }
  // Sends until the server gives the exchange up (`limit` at most), then ends the stream. A pump
  // that ends its stream before the server has processed the events already posted would drop
  // its disconnect callback (an ended response is not abandoned), so a test that waits for the
  // callback must keep the response open until it fires.
  void start_until_disconnect(std::shared_ptr<http_exchange> ex, std::chrono::milliseconds limit) {
    t = std::thread([ex = std::move(ex), limit] {
      const std::string kb(1024, 'x');
      const auto until = steady::now() + limit;
      while (!ex->disconnected() && steady::now() < until) ex->send_event(kb);
      ex->end_stream();
    });
  }
  ~event_pump() {
    if (t.joinable()) t.join();
  }
};

// Reads a chunked stream from `fd` until its terminating chunk (20 s at most), `chunk` bytes at
// a time with `pause` after each read (a slow reader); what arrived.
std::string read_stream_to_end(int fd, size_t chunk, std::chrono::milliseconds pause) {
  std::string got;
  std::vector<char> buf(chunk);
  const auto until = steady::now() + 20s;
  while (got.find("\r\n0\r\n\r\n") == std::string::npos && steady::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const auto n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    got.append(buf.data(), static_cast<size_t>(n));
    std::this_thread::sleep_for(pause);
  }
  return got;
}

}  // namespace

TEST_CASE("http_server: a client that stops reading its stream is closed after the stall timeout") {
  auto cfg = test_config();
  cfg.write_stall_timeout = 300ms;
  cfg.max_stream_buffer_bytes = 64u << 20;  // the stall check, not the buffer cap, ends it
  std::atomic<int> fired{0};
  event_pump pump;
  std::mutex mu;
  http_server server(cfg, [&](std::shared_ptr<http_exchange> ex, http_request&&) {
    ex->on_disconnect([&] { ++fired; });
    ex->start_stream(200, {});
    std::lock_guard lock(mu);
    pump.start(std::move(ex), 5000, 1ms);  // 5 MB in 5 s at most
  });
  const int fd = small_window_socket(server.port());
  REQUIRE(fd >= 0);
  const std::string req = get_request;
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  // The client reads nothing: its window closes, nothing more is acknowledged.
  CHECK(eventually([&] { return fired.load() == 1; }, 4000ms));
  CHECK(server.counters().write_stalls == 1);
  CHECK(server.counters().client_disconnects == 1);
  CHECK(eventually([&] { return server.counters().connections_open == 0; }));
  ::close(fd);
}

TEST_CASE("http_server: a slow client that keeps reading is not cut by the stall check") {
  auto cfg = test_config();
  cfg.write_stall_timeout = 1000ms;
  std::atomic<int> fired{0};
  event_pump pump;
  std::mutex mu;
  http_server server(cfg, [&](std::shared_ptr<http_exchange> ex, http_request&&) {
    ex->on_disconnect([&] { ++fired; });
    ex->start_stream(200, {});
    std::lock_guard lock(mu);
    pump.start(std::move(ex), 200, 0ms);  // 200 KB at once: far more than the window
  });
  const int fd = small_window_socket(server.port());
  REQUIRE(fd >= 0);
  const std::string req = get_request;
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  // Read 2 KB every 10 ms until the terminating chunk: about a second of steady progress.
  const std::string got = read_stream_to_end(fd, 2048, 10ms);
  ::close(fd);
  CHECK(got.find("\r\n0\r\n\r\n") != std::string::npos);  // the whole stream arrived
  CHECK(got.size() > 200u * 1024);
  CHECK(server.counters().write_stalls == 0);
  CHECK(fired.load() == 0);
}

TEST_CASE("http_server: a stream that outgrows the stream buffer is closed as a disconnect") {
  auto cfg = test_config();
  cfg.write_stall_timeout = 60s;  // the buffer cap, not the stall check, ends it
  cfg.max_stream_buffer_bytes = 64u << 10;
  std::atomic<int> fired{0};
  event_pump pump;
  std::mutex mu;
  http_server server(cfg, [&](std::shared_ptr<http_exchange> ex, http_request&&) {
    ex->on_disconnect([&] { ++fired; });
    ex->start_stream(200, {});
    std::lock_guard lock(mu);
    pump.start_until_disconnect(std::move(ex), 15s);  // as fast as it goes
  });
  const int fd = small_window_socket(server.port());
  REQUIRE(fd >= 0);
  const std::string req = get_request;
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  CHECK(eventually([&] { return fired.load() == 1; }, 10000ms));
  CHECK(server.counters().stream_overflows == 1);
  CHECK(server.counters().write_stalls == 0);
  ::close(fd);
}

TEST_CASE("http_server: a catch-up far over the stream buffer is written as the client reads it, in order") {
  auto cfg = test_config();
  cfg.write_stall_timeout = 5s;
  cfg.max_stream_buffer_bytes = 64u << 10;
  std::atomic<int> fired{0};
  std::thread live;
  http_server server(cfg, [&](std::shared_ptr<http_exchange> ex, http_request&&) {
    ex->on_disconnect([&] { ++fired; });
    ex->start_stream(200, {});
    // 2,000 events of ~1 KB at once (32x the cap), then live events behind them from another
    // thread while the catch-up is still being written.
    std::vector<std::string> catch_up;
    for (int i = 0; i < 2000; ++i) catch_up.push_back("c" + std::to_string(i) + std::string(1000, '.'));
    ex->send_events(std::move(catch_up));
    live = std::thread([ex] {
      for (int i = 0; i < 20; ++i) ex->send_event("l" + std::to_string(i));
      ex->end_stream();
    });
  });
  const int fd = small_window_socket(server.port());
  REQUIRE(fd >= 0);
  const std::string req = get_request;
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  const std::string got = read_stream_to_end(fd, 16384, 0ms);
  ::close(fd);
  if (live.joinable()) live.join();
  CHECK(got.find("\r\n0\r\n\r\n") != std::string::npos);  // the stream ended normally
  CHECK(server.counters().stream_overflows == 0);
  CHECK(fired.load() == 0);
  // Every event, in the order of the calls: the catch-up's, then the live ones.
  size_t at = 0;
  bool in_order = true;
  for (int i = 0; i < 2000 && in_order; ++i) {
    at = got.find("data: c" + std::to_string(i) + ".", at);
    in_order = at != std::string::npos;
  }
  for (int i = 0; i < 20 && in_order; ++i) {
    at = got.find("data: l" + std::to_string(i) + "\n", at);
    in_order = at != std::string::npos;
  }
  CHECK(in_order);
}

TEST_CASE("http_server: live events over the cap behind a catch-up still close the stream") {
  auto cfg = test_config();
  cfg.write_stall_timeout = 60s;
  cfg.max_stream_buffer_bytes = 64u << 10;
  std::atomic<int> fired{0};
  event_pump pump;
  std::mutex mu;
  http_server server(cfg, [&](std::shared_ptr<http_exchange> ex, http_request&&) {
    ex->on_disconnect([&] { ++fired; });
    ex->start_stream(200, {});
    ex->send_events(std::vector<std::string>(100, std::string(1000, 'c')));
    std::lock_guard lock(mu);
    pump.start_until_disconnect(std::move(ex), 15s);  // then live events as fast as they go
  });
  const int fd = small_window_socket(server.port());
  REQUIRE(fd >= 0);
  const std::string req = get_request;
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  CHECK(eventually([&] { return fired.load() == 1; }, 10000ms));
  CHECK(server.counters().stream_overflows == 1);
  ::close(fd);
}

TEST_CASE("http_server: on_header refuses a request before its body is read") {
  auto cfg = test_config();
  cfg.on_header = [](const http_request& head) -> std::optional<http_response> {
    if (head.path != "/closed") return std::nullopt;
    return http_response{401, "application/json", {{"X-Why", "no key"}}, "{\"error\":\"no\"}"};
  };
  std::atomic<int> handled{0};
  http_server server(cfg, [&](std::shared_ptr<http_exchange> ex, http_request&& req) {
    ++handled;
    echo(std::move(ex), std::move(req));
  });
  {
    // Announces a 3 MB body and sends none of it: the answer comes anyway, with no 100 Continue.
    test_client c(server.port());
    REQUIRE(c.send("POST /closed HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 3000000\r\n\r\n"));
    auto r = c.read_response();
    REQUIRE(r);
    CHECK(r->status == 401);
    CHECK(r->header("x-why") == "no key");
    CHECK(r->header("connection") == "close");
    CHECK(c.wait_closed(3000ms));
  }
  {
    test_client c(server.port());
    REQUIRE(c.send("POST /open HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"));
    auto r = c.read_response();
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->body == "POST /open hi");
  }
  CHECK(handled.load() == 1);
  CHECK(server.counters().refused_at_header == 1);
}
