// A minimal HTTP/1.1 endpoint for Prometheus scrapes and probes, on its own thread: one poll loop
// over every open connection, so a client that stalls holds up no probe behind it. Everything
// else gets 404; a client has 2 s to send its request and 2 s to take the answer.
//   GET /metrics  render()
//   GET /health   200 while this thread answers (liveness: the process is up, whatever its phase)
//   GET /ready    200 when not_ready() is empty, else 503 with its text (readiness)
// The callbacks run on that thread and must be thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace sy {

class metrics_http {
 public:
  // Binds host:port (port 0 picks a free one); throws std::runtime_error when it cannot.
  metrics_http(const std::string& host, int port, std::function<std::string()> render,
               std::function<std::string()> not_ready);
  ~metrics_http();
  int port() const { return port_; }

 private:
  void serve();
  std::string answer(const std::string& request) const;  // the whole response to one request
  int fd_ = -1;
  int port_ = 0;
  std::function<std::string()> render_;
  std::function<std::string()> not_ready_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace sy
