#include "worker/step_cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sy {
namespace {

constexpr int k_features = 3;  // fixed, per token, per 1024 attended pairs
using vec = std::array<double, k_features>;

vec features(const step_shape& s) {
  return {1.0, static_cast<double>(s.n_tokens), static_cast<double>(s.attended_pairs) / 1024.0};
}

// Least squares over the features in `use` (the others held at 0), by Gaussian elimination on
// the normal equations with a small ridge so a nearly singular system stays finite. Returns the
// coefficients and the sum of squared residuals, or nothing when the system is singular.
template <typename Obs>
std::optional<std::pair<vec, double>> solve(const Obs& obs, const std::array<bool, k_features>& use) {
  int idx[k_features];
  int m = 0;
  for (int f = 0; f < k_features; ++f)
    if (use[f]) idx[m++] = f;
  double a[k_features][k_features + 1] = {};
  for (const auto& o : obs) {
    const vec x = features(o.shape);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < m; ++j) a[i][j] += x[idx[i]] * x[idx[j]];
      a[i][m] += x[idx[i]] * o.ms;
    }
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
  double sse = 0;
  for (const auto& o : obs) {
    const vec x = features(o.shape);
    double pred = 0;
    for (int f = 0; f < k_features; ++f) pred += coef[f] * x[f];
    sse += (pred - o.ms) * (pred - o.ms);
  }
  if (!std::isfinite(sse)) return std::nullopt;
  return std::pair{coef, sse};
}

}  // namespace

void step_cost_model::observe(const step_shape& s, double ms) {
  if (s.n_tokens <= 0 || !std::isfinite(ms) || ms < 0) return;
  obs_.push_back({s, ms});
  if (obs_.size() > k_window) obs_.pop_front();
  refit();
}

void step_cost_model::refit() {
  if (obs_.size() < k_min_observations) return;
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
  for (const auto& o : obs_) lo = std::min(lo, o.shape.n_tokens), hi = std::max(hi, o.shape.n_tokens);
  // All steps of (nearly) one size say nothing about the cost per token.
  if (hi - lo < 4) return;
  // The best non-negative fit among the feature sets that keep the per-token cost (an active set
  // of three features, enumerated).
  constexpr std::array<std::array<bool, k_features>, 4> sets{
      {{true, true, true}, {true, true, false}, {false, true, true}, {false, true, false}}};
  std::optional<std::pair<vec, double>> best;
  for (const auto& use : sets) {
    const auto r = solve(obs_, use);
    if (!r || r->first[1] <= 0 || r->first[0] < 0 || r->first[2] < 0) continue;
    if (!best || r->second < best->second) best = r;
  }
  if (best) fit_ = step_cost{best->first[0], best->first[1], best->first[2]};
}

int32_t prefill_tokens_within(const step_cost& cost, const step_shape& decodes, int64_t prompt_pos, double max_step_ms,
                              int32_t min_chunk, int32_t max_tokens) {
  const double per_prompt_token =
      cost.per_token_ms + cost.per_kpair_ms * static_cast<double>(std::max<int64_t>(prompt_pos, 0)) / 1024.0;
  const double left = max_step_ms - cost.predict(decodes);
  int64_t n =
      per_prompt_token > 0 ? static_cast<int64_t>(std::floor(std::max(left, 0.0) / per_prompt_token)) : max_tokens;
  n = std::max<int64_t>(n, min_chunk);
  return static_cast<int32_t>(std::clamp<int64_t>(n, 0, max_tokens));
}

}  // namespace sy
