#include "router/dispatch/retry_budget.hpp"

#include <cmath>

namespace sy::router {

retry_budget::bucket& retry_budget::current(double now_s) {
  const double width = cfg_.window_s / static_cast<double>(k_buckets);
  const auto slice = static_cast<int64_t>(std::floor(now_s / width));
  bucket& b = buckets_[static_cast<size_t>(((slice % static_cast<int64_t>(k_buckets)) + k_buckets) % k_buckets)];
  if (b.slice != slice) b = bucket{slice, 0, 0};
  return b;
}

void retry_budget::totals(double now_s, uint64_t& requests, uint64_t& retries) const {
  const double width = cfg_.window_s / static_cast<double>(k_buckets);
  const auto now_slice = static_cast<int64_t>(std::floor(now_s / width));
  requests = retries = 0;
  for (const bucket& b : buckets_) {
    if (b.slice < 0 || now_slice - b.slice >= static_cast<int64_t>(k_buckets)) continue;  // outside the window
    requests += b.requests;
    retries += b.retries;
  }
}

void retry_budget::on_request(double now_s) { current(now_s).requests++; }

bool retry_budget::try_retry(double now_s) {
  uint64_t requests = 0, retries = 0;
  totals(now_s, requests, retries);
  const double allowed = cfg_.min_retries + cfg_.ratio * static_cast<double>(requests);
  if (static_cast<double>(retries) + 1 > allowed) {
    refused_++;
    return false;
  }
  current(now_s).retries++;
  granted_++;
  return true;
}

}  // namespace sy::router
