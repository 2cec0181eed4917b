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

namespace sy::router {

struct http_request {
  std::string method;                                        // "GET", "POST", ...
  std::string target;                                        // as sent, e.g. "/v1/models?x=1"
  std::string path;                                          // target without the query
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::string remote;                              // peer address "ip:port"
  std::chrono::steady_clock::time_point received;  // when the full request had been read
  bool header_checked = false;                     // http_server_config::on_header ran and let it through

  // First value of a header (name lower-case), or "".
  std::string_view header(std::string_view name) const;
};

struct http_response {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  std::string body;
};

// One request/response on a connection. The response is either respond() once, or
// start_stream() followed by any number of send_event() and one end_stream(). Calls after the
// response ended, or after the client went away, are ignored.
class http_exchange {
 public:
  virtual ~http_exchange() = default;
  virtual void respond(http_response r) = 0;
  // Status + headers of a text/event-stream response (chunked transfer encoding,
  // Cache-Control: no-cache); `headers` are extra headers.
  virtual void start_stream(int status, std::vector<std::pair<std::string, std::string>> headers) = 0;
  // Writes "data: <data>\n\n". `t_received`, when set, is when the data's source arrived in
  // the router: the server observes (write completed - t_received) in on_written.
  virtual void send_event(std::string data, std::chrono::steady_clock::time_point t_received = {}) = 0;
  virtual void end_stream() = 0;
  // Called once, on an I/O thread, when the client closes or resets the connection before the
  // response ended (detected while waiting too, not only on a failed write). Set it before
  // the handler returns; never called after the response ended.
  virtual void on_disconnect(std::function<void()> f) = 0;
  virtual bool disconnected() const = 0;
};

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
  // A client that stops reading: once a response has started, bytes are pending and none of
  // them reached the client (acknowledged by its TCP stack) for this long, the connection is
  // closed as a disconnect (the handler's on_disconnect runs, so the request is cancelled and
  // its KV freed). Progress is measured at the socket, so a slow but reading client is kept.
  std::chrono::milliseconds write_stall_timeout{30000};
  // Stream events queued in the process while a write is in flight; past this the client is
  // not keeping up with its own stream and the connection is closed the same way.
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
  std::atomic<uint64_t> connections_open{0};     // gauge
  std::atomic<uint64_t> connections_refused{0};  // over max_connections
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

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace sy::router
