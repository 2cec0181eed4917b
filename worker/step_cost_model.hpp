// What a step costs, learned from the steps the engine ran: the model behind the scheduler's
// step-time budget (`scheduler_config::max_step_ms`, `serve --max-step-ms`).
//
// A batched forward streams the weights once (a fixed cost), multiplies every row of the batch
// through them (a cost per token, decode rows and prompt rows alike) and reads each row's
// attention context (a cost per attended key). So a step's time is modelled as
//     ms = fixed + per_token * n_tokens + per_kpair * attended_pairs / 1024
// and fitted by least squares (slightly damped, so two steps of one shape do not make a wild fit)
// over the last `k_window` steps. The fit adapts to the machine, the model, the thread count and
// the device without a calibration run; it knows nothing until `k_min_observations` steps of
// different sizes have been seen, and then the budget applies.
//
// Pure logic: no clock, no threads; the engine feeds it (plan shape, measured milliseconds).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>

namespace sy {

struct step_shape {
  int64_t n_tokens = 0;        // rows of the batch: decode tokens + prompt chunk tokens
  int64_t attended_pairs = 0;  // sum over rows of the keys each attends to (its position + 1)
};

struct step_cost {
  double fixed_ms = 0;
  double per_token_ms = 0;
  double per_kpair_ms = 0;  // per 1024 attended (query, key) pairs
  double predict(const step_shape& s) const {
    return fixed_ms + per_token_ms * static_cast<double>(s.n_tokens) +
           per_kpair_ms * static_cast<double>(s.attended_pairs) / 1024.0;
  }
};

class step_cost_model {
 public:
  static constexpr size_t k_window = 256;
  static constexpr size_t k_min_observations = 8;

  void observe(const step_shape& s, double ms);
  // The fitted costs, or nothing while too few steps (or steps all of one size) were seen.
  // Coefficients are never negative, and the per-token cost is positive.
  std::optional<step_cost> fit() const { return fit_; }
  size_t n_observations() const { return obs_.size(); }

 private:
  struct observation {
    step_shape shape;
    double ms;
  };
  void refit();

  std::deque<observation> obs_;
  std::optional<step_cost> fit_;
};

// Prompt tokens that fit in a step that already carries `decodes` (the decode rows scheduled so
// far) under `max_step_ms`, prompt tokens being attended at about position `prompt_pos`. At least
// `min_chunk` (progress for prompts whatever the fit says), at most `max_tokens`.
int32_t prefill_tokens_within(const step_cost& cost, const step_shape& decodes, int64_t prompt_pos, double max_step_ms,
                              int32_t min_chunk, int32_t max_tokens);

}  // namespace sy
