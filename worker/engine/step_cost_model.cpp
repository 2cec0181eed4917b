#include "worker/engine/step_cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace sy {
namespace {

// fixed, prompt fixed, per decode row, per prompt row, per 1024 attended pairs
constexpr int k_features = 5;
constexpr int k_per_prompt = 3;
using vec = std::array<double, k_features>;

vec features(const step_shape& s) {
  return {1.0, s.n_prompt > 0 ? 1.0 : 0.0, static_cast<double>(s.n_decode), static_cast<double>(s.n_prompt),
          static_cast<double>(s.attended_pairs) / 1024.0};
}

// The normal equations of all the features, summed once over the observations: every subset's
// least squares is solved from them (the refit runs after every step while a budget is on).
struct normal_equations {
  double xtx[k_features][k_features] = {};
  vec xty{};
  double yty = 0;
};

template <typename Obs>
normal_equations accumulate(const Obs& obs) {
  normal_equations n;
  for (const auto& o : obs) {
    const vec x = features(o.shape);
    for (int i = 0; i < k_features; ++i) {
      for (int j = 0; j < k_features; ++j) n.xtx[i][j] += x[i] * x[j];
      n.xty[i] += x[i] * o.ms;
    }
    n.yty += o.ms * o.ms;
  }
  return n;
}

// Least squares over the features in `use` (the others held at 0), by Gaussian elimination with
// a small ridge so a nearly singular system stays finite. Returns the coefficients and the sum
// of squared residuals (y'y - 2 c'X'y + c'X'Xc), or nothing when the system is singular.
std::optional<std::pair<vec, double>> solve(const normal_equations& n, const std::array<bool, k_features>& use) {
  int idx[k_features];
  int m = 0;
  for (int f = 0; f < k_features; ++f)
    if (use[f]) idx[m++] = f;
  double a[k_features][k_features + 1] = {};
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < m; ++j) a[i][j] = n.xtx[idx[i]][idx[j]];
    a[i][m] = n.xty[idx[i]];
  }
  for (int i = 0; i < m; ++i) a[i][i] += 1e-9 * (1.0 + a[i][i]);
  for (int c = 0; c < m; ++c) {
    int p = c;
    for (int r = c + 1; r < m; ++r)
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    if (std::abs(a[p][c]) < 1e-12) return std::nullopt;
    for (int j = 0; j <= m; ++j) std::swap(a[c][j], a[p][j]);
    for (int r = 0; r < m; ++r) {
      if (r == c) continue;
      const double k = a[r][c] / a[c][c];
      for (int j = c; j <= m; ++j) a[r][j] -= k * a[c][j];
    }
  }
  vec coef{};
  for (int i = 0; i < m; ++i) coef[idx[i]] = a[i][m] / a[i][i];
  double sse = n.yty;
  for (int i = 0; i < k_features; ++i) {
    sse -= 2 * coef[i] * n.xty[i];
    for (int j = 0; j < k_features; ++j) sse += coef[i] * n.xtx[i][j] * coef[j];
  }
  if (!std::isfinite(sse)) return std::nullopt;
  return std::pair{coef, sse};
}

}  // namespace

void step_cost_model::observe(const step_shape& s, double ms) {
  if (s.n_tokens() <= 0 || s.n_decode < 0 || s.n_prompt < 0 || !std::isfinite(ms) || ms < 0) return;
  obs_.push_back({s, ms});
  if (obs_.size() > k_window) obs_.pop_front();
  refit();
}

void step_cost_model::refit() {
  if (obs_.size() < k_min_observations) return;
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
  bool prompts = false;
  for (const auto& o : obs_) {
    lo = std::min(lo, o.shape.n_tokens());
    hi = std::max(hi, o.shape.n_tokens());
    prompts = prompts || o.shape.n_prompt > 0;
  }
  // All steps of (nearly) one size say nothing about the cost per token, and steps without a
  // prompt row nothing about what one costs.
  if (hi - lo < 4 || !prompts) return;
  // The best non-negative fit among the feature sets that keep the per-prompt-token cost (an
  // active set of the other four features, enumerated: 16 small solves).
  const normal_equations n = accumulate(obs_);
  std::optional<std::pair<vec, double>> best;
  for (unsigned mask = 0; mask < (1u << k_features); ++mask) {
    if (((mask >> k_per_prompt) & 1u) == 0) continue;  // always in: the budget divides by it
    std::array<bool, k_features> use{};
    for (int f = 0; f < k_features; ++f) use[f] = ((mask >> f) & 1u) != 0;
    const auto r = solve(n, use);
    if (!r || r->first[k_per_prompt] <= 0) continue;
    if (std::any_of(r->first.begin(), r->first.end(), [](double c) { return c < 0; })) continue;
    if (!best || r->second < best->second) best = r;
  }
  if (!best) return;
  const vec& c = best->first;
  step_cost fit{c[0], c[1], c[2], c[3], c[4], 0.0};
  std::vector<double> under;  // measured - predicted, of the steps with decodes and prompt rows
  for (const auto& o : obs_)
    if (o.shape.n_decode > 0 && o.shape.n_prompt > 0) under.push_back(o.ms - fit.predict(o.shape));
  if (under.size() >= k_min_margin_steps) {
    const auto k = static_cast<size_t>(k_margin_quantile * static_cast<double>(under.size() - 1));
    std::nth_element(under.begin(), under.begin() + static_cast<std::ptrdiff_t>(k), under.end());
    fit.margin_ms = std::max(0.0, under[k]);
  }
  fit_ = fit;
}

int32_t prefill_tokens_within(const step_cost& cost, const step_shape& decodes, int64_t prompt_pos, double max_step_ms,
                              int32_t min_chunk, int32_t max_tokens) {
  const double per_prompt_token =
      cost.per_prompt_ms + cost.per_kpair_ms * static_cast<double>(std::max<int64_t>(prompt_pos, 0)) / 1024.0;
  const double left = max_step_ms - cost.margin_ms - cost.predict(decodes) - cost.prompt_fixed_ms;
  int64_t n =
      per_prompt_token > 0 ? static_cast<int64_t>(std::floor(std::max(left, 0.0) / per_prompt_token)) : max_tokens;
  n = std::max<int64_t>(n, min_chunk);
  return static_cast<int32_t>(std::clamp<int64_t>(n, 0, max_tokens));
}

}  // namespace sy
