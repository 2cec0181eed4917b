// What the router's dispatcher tests share: a client connection that records every call made on
// it. The tokenizer a worker's welcome carries (the router builds its model entry from it) is the
// tiny in-memory vocabulary of tiny_vocab.hpp, so these tests need no model file.
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/wire/protocol.hpp"
#include "router/base/http_exchange.hpp"
#include "tests/unit/tiny_vocab.hpp"

namespace sy::test {

using header_list = std::vector<std::pair<std::string, std::string>>;

// A client connection: records every call the dispatcher makes on it, in order.
class fake_exchange final : public router::http_exchange {
 public:
  void respond(router::http_response r) override {
    maybe_throw();
    log.push_back("respond");
    responses.push_back(std::move(r));
  }
  void start_stream(int status, header_list headers) override {
    maybe_throw();
    if (throw_start_stream) throw std::runtime_error("fake_exchange: cannot start the stream");
    log.push_back("start_stream");
    stream_status = status;
    stream_headers = std::move(headers);
  }
  void send_event(std::string data, std::chrono::steady_clock::time_point) override {
    maybe_throw();
    log.push_back("send_event");
    events.push_back(std::move(data));
  }
  void end_stream() override { log.push_back("end_stream"); }
  void on_disconnect(std::function<void()> f) override { on_gone_ = std::move(f); }
  bool disconnected() const override { return gone; }

  nlohmann::json body(size_t i = 0) const { return nlohmann::json::parse(responses.at(i).body); }
  nlohmann::json event(size_t i) const { return nlohmann::json::parse(events.at(i)); }

  std::vector<std::string> log;  // "respond", "start_stream", "send_event", "end_stream"
  std::vector<router::http_response> responses;
  int stream_status = 0;
  header_list stream_headers;
  std::vector<std::string> events;
  bool gone = false;                // the client went away
  bool throw_calls = false;         // respond/start_stream/send_event throw (a failed allocation, say)
  bool throw_start_stream = false;  // only start_stream throws

 private:
  void maybe_throw() const {
    if (throw_calls) throw std::runtime_error("fake_exchange: write failed");
  }
  std::function<void()> on_gone_;
};

inline std::string header(const header_list& headers, const std::string& name) {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return "";
}

}  // namespace sy::test
