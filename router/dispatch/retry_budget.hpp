// The cluster's retry budget (docs/reliability.md, retry storms): re-dispatches after a worker
// failed a request are allowed while, over the last `window_s`, retries < `min_retries` +
// `ratio` x first attempts. A few workers failing leaves every request its retry; a failure that
// follows requests around the cluster (a query of death, every worker broken) cannot multiply the
// load — past the budget a failed request ends with its error. (Finagle's RetryBudget and
// Envoy's retry_budget bound retries the same way: a share of requests plus a floor.)
//
// Pure bookkeeping: times are passed in. Owned by the dispatcher's thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace sy::router {

struct retry_budget_config {
  double ratio = 0.2;         // retries per first attempt, over the window
  uint32_t min_retries = 10;  // retries always allowed per window (a quiet cluster still retries)
  double window_s = 10.0;
};

class retry_budget {
 public:
  explicit retry_budget(retry_budget_config cfg = {}) : cfg_(cfg) {}

  // A request's first dispatch.
  void on_request(double now_s);
  // Asks for one retry: true (and counted) when the budget allows it.
  bool try_retry(double now_s);

  uint64_t refused() const { return refused_; }
  uint64_t granted() const { return granted_; }

 private:
  // The window in k_buckets slices; a slice older than the window is reset before reuse.
  static constexpr size_t k_buckets = 10;
  struct bucket {
    int64_t slice = -1;  // floor(t / slice width) it counts, -1: never used
    uint64_t requests = 0, retries = 0;
  };
  bucket& current(double now_s);
  void totals(double now_s, uint64_t& requests, uint64_t& retries) const;

  retry_budget_config cfg_;
  std::array<bucket, k_buckets> buckets_{};
  uint64_t refused_ = 0, granted_ = 0;
};

}  // namespace sy::router
