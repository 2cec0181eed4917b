#include "router/dispatch/service_rate.hpp"

#include <algorithm>

namespace sy::router {

void service_rate::tick(double now_s, bool saturated) {
  if (window_start_s_ < 0) {  // the first tick opens the first window; work before it is dropped
    window_start_s_ = now_s;
    window_tokens_ = 0;
    window_saturated_ = saturated;
    return;
  }
  window_saturated_ = window_saturated_ && saturated;
  const double span = now_s - window_start_s_;
  if (span < k_window_s - 1e-9) return;  // ten 100 ms ticks make a window
  const double rate = window_tokens_ / span;
  if (window_tokens_ > 0) {
    if (window_saturated_) {
      rate_ = samples_ == 0 ? rate : 0.7 * rate_ + 0.3 * rate;
      samples_++;
    } else if (samples_ > 0) {
      rate_ = std::max(rate_, rate);  // the workers did at least this much
    }
  }
  window_start_s_ = now_s;
  window_tokens_ = 0;
  window_saturated_ = saturated;
}

std::optional<double> service_rate::wait_s(double queued_tokens) const {
  if (samples_ < k_min_samples || rate_ <= 0) return std::nullopt;
  return std::max(0.0, queued_tokens) / rate_;
}

}  // namespace sy::router
