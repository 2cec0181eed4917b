// What one HTTP request and its answer are to the layers above the socket: the parsed request,
// a plain response, and the exchange a handler answers through (at once or later, from any
// thread). The server (router/http/http_server.hpp) implements the exchange; the dispatcher and
// the API formatting answer through it without seeing the server.
#pragma once

#include <chrono>
#include <functional>
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
  // Writes "data: <data>\n\n" ("<data>\n\n" when data starts with "event: ": an event with its
  // own field lines, docs/router.md, "Anthropic Messages API"). `t_received`, when set, is when the data's source
  // arrived in the router: the server observes (write completed - t_received) in on_written.
  virtual void send_event(std::string data, std::chrono::steady_clock::time_point t_received = {}) = 0;
  // A stream's catch-up, all known at once (a cached answer replayed, what a joining request
  // missed of a running generation): each "data: <event>" is written as the client takes the
  // bytes before it, so a long catch-up does not count against max_stream_buffer_bytes (it is
  // paced by write completions, and a client that stops reading still meets the stall check).
  // Events sent after it follow it in order. This default (for exchanges without a socket)
  // sends them one by one.
  virtual void send_events(std::vector<std::string> data) {
    for (auto& d : data) send_event(std::move(d));
  }
  virtual void end_stream() = 0;
  // Called once, on an I/O thread, when the client closes or resets the connection before the
  // response ended (detected while waiting too, not only on a failed write); never called after
  // the response ended. Set after the client went away (a handler that answers from another
  // thread, later), it runs at once on the caller's thread.
  virtual void on_disconnect(std::function<void()> f) = 0;
  virtual bool disconnected() const = 0;
};

}  // namespace sy::router
