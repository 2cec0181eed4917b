// What a step costs, learned from the steps the engine ran: the model behind the scheduler's
// step-time budget (`scheduler_config::max_step_ms`, `serve --max-step-ms`).
//
// A batched forward streams the weights once per kernel path and multiplies every row through
// them. On the CPU backend generated-token rows (decodes) and prompt rows take different paths
// (the integer kernels on the quantized weights, the bf16 panel GEMM), so a step with prompt
// rows pays a second pass over the weights; each row then costs its path's per-row time, plus
// its attention context (a cost per attended key). So a step's time is modelled as
//     ms = fixed + [prompt rows > 0] * prompt_fixed + per_decode * decode rows
//          + per_prompt * prompt rows + per_kpair * attended_pairs / 1024
// and fitted by least squares (non-negative, slightly damped so two steps of one shape do not
// make a wild fit) over the last `k_window` steps. Measured on a 2-core EPYC (docs/worker.md,
// "Step-time budget"), one cost per token for both kinds of row under-predicted the small mixed
// steps a budget makes by ~40 %: the second weight pass is what a small prompt chunk costs most.
// The fit adapts to the machine, the model, the thread count and the device without a
// calibration run; it knows nothing until `k_min_observations` steps of different sizes, some
// with prompt rows, have been seen, and then the budget applies.
// A least-squares fit predicts a step's mean time, and half the steps take longer. So the fit
// also carries a margin: the 95th percentile of how much it under-predicted recent steps that
// carried both decodes and prompt rows (the steps a budget sizes), and the budget keeps that much
// aside, so that `max_step_ms` bounds nearly every such step rather than their average.
//
// Pure logic: no clock, no threads; the engine feeds it (plan shape, measured milliseconds).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>

namespace sy {

struct step_shape {
  int64_t n_decode = 0;        // rows of generated tokens (positions past the request's prompt)
  int64_t n_prompt = 0;        // rows of prompt tokens (chunks, admissions)
  int64_t attended_pairs = 0;  // sum over rows of the keys each attends to (its position + 1)
  int64_t n_tokens() const { return n_decode + n_prompt; }
};

struct step_cost {
  double fixed_ms = 0;
  double prompt_fixed_ms = 0;  // paid once by a step with any prompt row
  double per_decode_ms = 0;
  double per_prompt_ms = 0;
  double per_kpair_ms = 0;  // per 1024 attended (query, key) pairs
  double margin_ms = 0;     // kept aside by a budget: see above (not part of predict)
  double predict(const step_shape& s) const {
    return fixed_ms + (s.n_prompt > 0 ? prompt_fixed_ms : 0.0) + per_decode_ms * static_cast<double>(s.n_decode) +
           per_prompt_ms * static_cast<double>(s.n_prompt) +
           per_kpair_ms * static_cast<double>(s.attended_pairs) / 1024.0;
  }
};

class step_cost_model {
 public:
  static constexpr size_t k_window = 256;
  static constexpr size_t k_min_observations = 8;
  static constexpr size_t k_min_margin_steps = 8;  // mixed steps needed before a margin is kept
  static constexpr double k_margin_quantile = 0.95;

  void observe(const step_shape& s, double ms);
  // The fitted costs, or nothing while too few steps (or steps all of one size, or none with
  // prompt rows) were seen. Coefficients are never negative, and the per-prompt-token cost is
  // positive (the budget divides by it).
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
// far) under `max_step_ms` less the fit's margin, prompt tokens being attended at about position
// `prompt_pos` (the step pays prompt_fixed for having any). At least `min_chunk` (progress for prompts whatever the
// fit says), at most `max_tokens`.
int32_t prefill_tokens_within(const step_cost& cost, const step_shape& decodes, int64_t prompt_pos, double max_step_ms,
                              int32_t min_chunk, int32_t max_tokens);

}  // namespace sy
