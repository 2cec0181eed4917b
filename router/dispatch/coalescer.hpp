// Request coalescing: an identical cacheable request (same cache key) that arrives while one is
// generating does not start a second generation; it listens to the running one (a stream first
// gets what was produced so far, then the rest as it comes; a non-streamed one the whole answer).
// The coalescer is the index — cache key -> generating request, coalesced request -> the request
// it listens to — and the join; the listeners themselves live in the request
// (active_request.hpp), which every answer goes through. Owned by the dispatcher's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "router/dispatch/active_request.hpp"

namespace sy::router {

class coalescer {
 public:
  // The request generating under `key`, if any.
  std::optional<uint64_t> generating(const std::string& key) const;
  // `a` generates for its cache key (its request's; none: nothing to do).
  void lead(const active_request& a);
  // `r` listens to `a` (which generates under r's key) from now on.
  void join(active_request& a, std::shared_ptr<routed_request> r);
  // The request a coalesced request listens to; it no longer does (its client went away).
  std::optional<uint64_t> leave(uint64_t id);
  // The request a coalesced request listens to.
  std::optional<uint64_t> listening_to(uint64_t id) const;
  // `a` left the dispatcher's tables: its key and its listeners' entries go.
  void forget(const active_request& a);
  uint64_t coalesced() const { return coalesced_; }

 private:
  std::unordered_map<std::string, uint64_t> by_key_;   // cache key -> generating request
  std::unordered_map<uint64_t, uint64_t> listens_to_;  // coalesced request -> its generation's
  uint64_t coalesced_ = 0;
};

}  // namespace sy::router
