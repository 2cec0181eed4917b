// Spans out over OTLP/HTTP (JSON): a bounded queue the request path only appends to (never
// blocking: a full queue drops the span and counts it), drained by one background thread that
// POSTs batches to the collector. A failed POST drops its batch and counts it too. stop() gives
// the thread a short time to send what is queued. docs/router.md, "Tracing".
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "router/tracing/otlp_span.hpp"

namespace sy::router {

struct otlp_exporter_config {
  std::string endpoint;  // http://HOST:PORT/PATH (plain HTTP; no TLS)
  std::string service_name = "switchyard-router";
  std::size_t queue_capacity = 4096;  // spans waiting; beyond, dropped
  std::size_t batch_size = 512;       // a POST as soon as this many wait
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds timeout{2000};  // connect, send and receive, each
};

// Sends one JSON body; true when the collector answered 2xx.
using otlp_post_fn = std::function<bool(const std::string& body)>;

// A blocking HTTP/1.1 POST to `endpoint` (Content-Type: application/json, Connection: close).
bool http_post_json(const std::string& endpoint, const std::string& body, std::chrono::milliseconds timeout);
// Throws std::invalid_argument naming what is wrong when `endpoint` is not http://HOST[:PORT]/PATH.
void check_otlp_endpoint(const std::string& endpoint);

class otlp_exporter {
 public:
  // `post` null: http_post_json to config.endpoint.
  explicit otlp_exporter(otlp_exporter_config config, otlp_post_fn post = nullptr);
  ~otlp_exporter();
  otlp_exporter(const otlp_exporter&) = delete;
  otlp_exporter& operator=(const otlp_exporter&) = delete;

  // Queues one finished span; false (and counted as dropped) when the queue is full or stopped.
  bool submit(span_record span);
  // Sends what is queued within `grace`, then ends the thread; what remains is dropped.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));

  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  std::uint64_t exported() const { return exported_.load(std::memory_order_relaxed); }

 private:
  void run();

  otlp_exporter_config config_;
  otlp_post_fn post_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<span_record> queue_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point stop_deadline_{};
  std::atomic<std::uint64_t> dropped_{0}, exported_{0};
  std::thread thread_;
};

}  // namespace sy::router
