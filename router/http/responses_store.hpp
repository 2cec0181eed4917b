// Stored responses of the Responses API (docs/router.md, "Responses API"): a finished
// response and the conversation that led to it, kept in the Redis the response cache uses, on
// its threads and connections (cache_service::submit), so that a follow-up can name it in
// `previous_response_id` and GET / DELETE /v1/responses/{id} can read or remove it.
//
//   sy:v1:resp:<tenant>:<id>   string  responses_record (JSON), EX --responses-ttl-s
//
// Keys are per tenant (its name, ':' and '%' percent-escaped): another tenant's id is not found.
// With --cache-mac-key-file each value is sealed like a cache entry (cache/entry_mac.hpp): a
// value written or moved by anyone without the key reads as not found.
//
// Read-your-writes: a response to be stored is not answered (nor its stream ended) until its
// write has returned (responses_exchange), so a client's next request finds it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "router/base/http_exchange.hpp"
#include "router/dispatch/cache_service.hpp"

namespace sy::router {

struct responses_state;

class responses_store {
 public:
  enum class outcome : uint8_t { ok, not_found, unavailable };

  responses_store(cache_service& cache, std::chrono::seconds ttl) : cache_(cache), ttl_(ttl) {}

  // `done` runs once, on a cache thread (or here when the queue is full: unavailable). ok comes
  // with the record.
  void get(std::string_view tenant, const std::string& id, std::function<void(outcome, std::string)> done);
  // `done(stored)`; a failed write is counted (switchyard_router_responses_store_failures_total).
  void put(std::string_view tenant, const std::string& id, std::string record, std::function<void(bool)> done);
  // ok: deleted; not_found: there was nothing under the id.
  void remove(std::string_view tenant, const std::string& id, std::function<void(outcome)> done);

  static std::string key(std::string_view tenant, std::string_view id);
  std::string render_metrics() const;

 private:
  struct counters {
    std::atomic<uint64_t> stored{0}, store_failures{0}, read_failures{0};
  };
  cache_service& cache_;
  std::chrono::seconds ttl_;
  // Shared with the jobs on the cache threads, which may outlive this object at shutdown.
  std::shared_ptr<counters> n_ = std::make_shared<counters>();
};

// The exchange a Responses API request is answered through: it drops the empty events a chunk
// with nothing to say formats to, and, when `save` is set, holds the finished response (its
// body, or its stream's last events and end) until save(record, then) calls `then` — after the
// store's write returned, whatever it returned.
std::shared_ptr<http_exchange> responses_exchange(
    std::shared_ptr<http_exchange> inner, std::shared_ptr<responses_state> st,
    std::function<void(std::string record, std::function<void()> then)> save);

}  // namespace sy::router
