// How fast one model's workers clear its queue, for the queue wait admission estimates
// (docs/router.md, "Queue wait estimate"). Work is counted in the queue's own unit — a request's
// queue tokens (prompt + max_tokens per choice) — as it is done: the prompt when the first token
// comes, each generated token, and what is left of the request when it ends (a request that stops
// early or fails clears its whole weight from the queue). The rate is measured only over windows
// in which the model's queue never emptied: then every worker slot was taken, and what was done
// is what the workers can do. A window with requests waiting for nothing to finish (no worker
// yet, long prefills) tells nothing and is dropped; a window that was not saturated throughout
// only shows the capacity is at least what it did. Until two saturated windows have been
// measured the rate is unknown and no wait is estimated: a burst on an idle cluster is never
// refused on the first requests' prefill.
//
// Pure bookkeeping: times are passed in. Owned by the dispatcher's thread.
#pragma once

#include <cstdint>
#include <optional>

namespace sy::router {

class service_rate {
 public:
  static constexpr double k_window_s = 1.0;
  static constexpr uint32_t k_min_samples = 2;

  // Work done, in queue tokens.
  void done(double tokens) { window_tokens_ += tokens; }
  // Called on each dispatcher tick after dispatching: `saturated` when requests of the model are
  // still queued (no worker of it had a free slot).
  void tick(double now_s, bool saturated);
  // Seconds until `queued_tokens` of queued work is done at the measured rate; nothing while the
  // rate is unknown.
  std::optional<double> wait_s(double queued_tokens) const;
  double tokens_per_s() const { return samples_ >= k_min_samples ? rate_ : 0; }

 private:
  double rate_ = 0;  // queue tokens per second while saturated (EWMA of windows)
  uint32_t samples_ = 0;
  double window_start_s_ = -1;  // -1: no tick yet
  double window_tokens_ = 0;
  bool window_saturated_ = true;
};

}  // namespace sy::router
