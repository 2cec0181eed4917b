// The router's HTTP/1.1 front: asynchronous (Boost.Beast over Asio) so that thousands of
// connections, most of them long SSE streams, cost a socket and a buffer each, not a thread.
//
// Boost headers stay inside http_server.cpp; this header is plain C++ so the rest of the
// router compiles fast.
//
// Threads: the server runs `threads` I/O threads of its own. The handler is called on one of
// them and must not block; it may answer at once or later from any thread through the
// exchange, whose methods are all thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "router/base/http_exchange.hpp"

namespace sy::router {

struct http_server_config {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see port())
  int threads = 1;
  size_t max_body_bytes = 4u << 20;                 // larger -> 413, connection closed
  size_t max_header_bytes = 16u << 10;              // larger -> 431
  std::chrono::milliseconds header_timeout{10000};  // to read a request's headers -> closed
  std::chrono::milliseconds body_timeout{30000};    // to read its body -> 408, closed
  std::chrono::milliseconds idle_timeout{60000};    // keep-alive between requests -> closed
  size_t max_connections = 20000;                   // beyond: accepted and closed at once (counted)
  // Open connections from one client address (IP, any port); beyond, accepted and closed at
  // once (counted). 0: no cap. Behind a proxy or ingress every client shares its address.
  size_t max_connections_per_address = 0;
  // Bytes of request bodies being read at once, over every connection: a request whose declared
  // body (a chunked one counts as max_body_bytes) does not fit is answered 503 `router_busy`
  // with Retry-After from its header, without reading the body. 0: no budget.
  size_t max_inflight_body_bytes = 0;
  // A client that stops reading: once a response has started, bytes are pending and none of
  // them reached the client (acknowledged by its TCP stack) for this long, the connection is
  // closed as a disconnect (the handler's on_disconnect runs, so the request is cancelled and
  // its KV freed). Progress is measured at the socket, so a slow but reading client is kept.
  std::chrono::milliseconds write_stall_timeout{30000};
  // Stream events queued in the process while a write is in flight; past this the client is
  // not keeping up with its own stream and the connection is closed the same way. A catch-up
  // (http_exchange::send_events) is paced by the client instead and is not counted.
  size_t max_stream_buffer_bytes = 1u << 20;
  // Observes seconds from send_event's t_received to the write's completion (any I/O thread).
  std::function<void(double)> on_written;
  // Called on an I/O thread when a request's header is complete, before its body is read
  // (`head` has no body): a response refuses the request at once (the connection closes after
  // it, unread body bytes are drained), so that authentication and cheap admission cost no
  // body read, parse or tokenization. Must not block; std::nullopt lets the request go on.
  std::function<std::optional<http_response>(const http_request& head)> on_header;
};

// Monotonic counters, readable from any thread.
struct http_counters {
  std::atomic<uint64_t> connections_accepted{0};
  std::atomic<uint64_t> connections_open{0};                 // gauge
  std::atomic<uint64_t> connections_refused{0};              // over max_connections
  std::atomic<uint64_t> connections_refused_per_address{0};  // over max_connections_per_address
  std::atomic<uint64_t> body_budget_refusals{0};             // 503: over max_inflight_body_bytes
  std::atomic<uint64_t> body_bytes_inflight{0};              // gauge: reserved by bodies being read
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> bad_requests{0};        // unparsable HTTP, oversized header/body
  std::atomic<uint64_t> timeouts{0};            // header/body/idle deadlines
  std::atomic<uint64_t> client_disconnects{0};  // before the response ended
  std::atomic<uint64_t> write_stalls{0};        // closed: nothing reached the client for write_stall_timeout
  std::atomic<uint64_t> stream_overflows{0};    // closed: over max_stream_buffer_bytes queued
  std::atomic<uint64_t> refused_at_header{0};   // answered by on_header, body not read
};

using http_handler = std::function<void(std::shared_ptr<http_exchange>, http_request&&)>;

class http_server {
 public:
  // Binds and starts the I/O threads; throws std::runtime_error naming host:port when the
  // address cannot be bound.
  http_server(http_server_config config, http_handler handler);
  ~http_server();  // stop()
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  int port() const;  // the bound port
  const http_counters& counters() const;
  // Stops accepting, closes every connection, joins the threads. Idempotent.
  void stop();
  // A server about to go (SIGTERM): from now on every response says `Connection: close` and its
  // connection closes after it, and connections idle between requests close now, so that pooled
  // keep-alive clients open their next connection elsewhere instead of reusing this one until
  // it refuses them. Still accepts and serves. Thread-safe, idempotent.
  void close_keep_alive();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace sy::router
