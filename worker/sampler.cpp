#include "worker/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace sy {

token_id argmax(std::span<const float> logits) {
  return static_cast<token_id>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

sampler::sampler(const sampling_params& p) : p_(p) {
  rng_.seed(p.has_seed ? p.seed : std::random_device{}());
}

token_id sampler::sample(std::span<float> logits, std::span<const token_id> history) {
  const int64_t n_vocab = static_cast<int64_t>(logits.size());
  if (p_.repetition_penalty != 1.f && p_.repeat_last_n != 0) {
    const size_t window = p_.repeat_last_n < 0 ? history.size()
                                               : std::min<size_t>(history.size(), p_.repeat_last_n);
    std::unordered_set<token_id> seen(history.end() - window, history.end());
    for (token_id t : seen) {
      if (t < 0 || t >= n_vocab) continue;
      float& l = logits[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
  }
  if (p_.temperature <= 0.f) return argmax(logits);

  cand_.clear();
  cand_.reserve(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) cand_.emplace_back(logits[i], static_cast<token_id>(i));
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) {
    keep = static_cast<size_t>(p_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
    cand_.resize(keep);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax with temperature over the kept candidates (sorted, largest first).
  const float mx = cand_[0].first;
  double sum = 0;
  for (auto& c : cand_) {
    c.first = std::exp((c.first - mx) / p_.temperature);
    sum += c.first;
  }
  for (auto& c : cand_) c.first = static_cast<float>(c.first / sum);
  if (p_.top_p < 1.f) {
    double cum = 0;
    size_t n = 0;
    while (n < cand_.size()) {
      cum += cand_[n].first;
      ++n;
      if (cum >= p_.top_p) break;
    }
    cand_.resize(std::max<size_t>(n, 1));
  }
  if (p_.min_p > 0.f) {
    const float floor = cand_[0].first * p_.min_p;
    size_t n = 1;
    while (n < cand_.size() && cand_[n].first >= floor) ++n;
    cand_.resize(n);
  }
  double total = 0;
  for (const auto& c : cand_) total += c.first;
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (const auto& c : cand_) {
    r -= c.first;
    if (r <= 0) return c.second;
  }
  return cand_.back().second;
}

}  // namespace sy
