#include "worker/engine/sampler.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/simd.hpp"

namespace sy {

namespace {

// out = the k largest finite values of v as (value, index), largest first (ties: lower index
// first). A min-heap of the best seen so far; the row is scanned 8 at a time and a chunk with
// nothing above the heap's worst is skipped with one compare.
void top_finite(std::span<const float> v, size_t k, std::vector<std::pair<float, token_id>>& out) {
  auto better = [](const std::pair<float, token_id>& a, const std::pair<float, token_id>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  out.clear();
  const float* w = v.data();
  const int64_t n = static_cast<int64_t>(v.size());
  int64_t i = 0;
  for (; i < n && out.size() < k; ++i)
    if (std::isfinite(w[i])) {
      out.emplace_back(w[i], static_cast<token_id>(i));
      std::push_heap(out.begin(), out.end(), better);
    }
  auto consider = [&](int64_t j) {
    // Scanning by increasing index, an equal value never beats the worst kept.
    if (w[j] > out.front().first && std::isfinite(w[j])) {
      std::pop_heap(out.begin(), out.end(), better);
      out.back() = {w[j], static_cast<token_id>(j)};
      std::push_heap(out.begin(), out.end(), better);
    }
  };
  if (k > 0 && out.size() == k) {
    for (; i < n && i % 8 != 0; ++i) consider(i);
    for (; i + 8 <= n; i += 8) {
      const __m256 thr = _mm256_set1_ps(out.front().first);
      int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(w + i), thr, _CMP_GT_OQ));
      while (m) {
        consider(i + __builtin_ctz(static_cast<unsigned>(m)));
        m &= m - 1;
      }
    }
    for (; i < n; ++i) consider(i);
  }
  std::sort(out.begin(), out.end(), better);
}

token_id argmax_scalar(std::span<const float> logits) {
  // NaN never wins (comparisons with NaN are false).
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best] || std::isnan(logits[best])) best = i;
  return static_cast<token_id>(best);
}

}  // namespace

token_id argmax(std::span<const float> logits) {
  // The largest non-NaN value 8 lanes at a time (max_ps returns its second operand when the
  // first is NaN), then its first index: the same answer as the scalar loop. Rows whose maximum
  // is -inf (all -inf or NaN) take the scalar loop, which defines those cases.
  const size_t n = logits.size();
  const float* x = logits.data();
  __m256 m = _mm256_set1_ps(-INFINITY);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float mx = _mm_cvtss_f32(h);
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  if (mx == -INFINITY) return argmax_scalar(logits);
  const __m256 vm = _mm256_set1_ps(mx);
  size_t j = 0;
  for (; j + 8 <= n; j += 8)
    if (const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), vm, _CMP_EQ_OQ)))
      return static_cast<token_id>(j + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(hit))));
  for (; j < n; ++j)
    if (x[j] == mx) return static_cast<token_id>(j);
  return argmax_scalar(logits);
}

token_logprobs_info logprobs_of(std::span<const float> logits, token_id chosen, int32_t n_top) {
  token_logprobs_info out;
  out.token = chosen;
  if (logits.empty()) return out;
  // log_softmax over the finite logits (NaN/inf-safe: non-finite entries get -inf), 8 at a time.
  const float* x = logits.data();
  const size_t n = logits.size();
  auto finite8 = [](__m256 v) {  // |v| < inf, false for NaN
    return _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), v), _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
  };
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    vmax = _mm256_max_ps(_mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, finite8(v)), vmax);
  }
  float mx = cpu::hmax(vmax);
  for (; i < n; ++i)
    if (std::isfinite(x[i])) mx = std::max(mx, x[i]);
  if (!std::isfinite(mx)) mx = 0;  // no finite logit at all: every log-probability is -inf below
  __m256 acc = _mm256_setzero_ps();
  const __m256 vmx = _mm256_set1_ps(mx);
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_add_ps(acc, _mm256_and_ps(cpu::exp256(_mm256_sub_ps(v, vmx)), finite8(v)));
  }
  double sum = cpu::hsum(acc);
  for (; i < n; ++i)
    if (std::isfinite(x[i])) sum += std::exp(static_cast<double>(x[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum > 0 ? sum : 1.0));
  auto lp = [&](token_id t) {
    const float v = t >= 0 && static_cast<size_t>(t) < n ? x[t] : -INFINITY;
    return std::isfinite(v) ? v - lse : -INFINITY;
  };
  out.logprob = lp(chosen);
  if (n_top <= 0) return out;
  // The n_top most likely finite tokens, best first (ties: lower id first).
  std::vector<std::pair<float, token_id>> best;
  top_finite(logits, static_cast<size_t>(n_top), best);
  for (const auto& [v, t] : best) out.top.emplace_back(t, v - lse);
  return out;
}

sampler::sampler(const sampling_params& p) : p_(p) { rng_.seed(p.has_seed ? p.seed : std::random_device{}()); }

token_id sampler::sample(std::span<float> logits, std::span<const token_id> history) {
  const int64_t n_vocab = static_cast<int64_t>(logits.size());
  if (n_vocab == 0) return 0;
  if (p_.repetition_penalty != 1.f && p_.repetition_penalty > 0.f && p_.repeat_last_n != 0) {
    const size_t window = p_.repeat_last_n < 0 ? history.size() : std::min<size_t>(history.size(), p_.repeat_last_n);
    recent_.assign(history.end() - window, history.end());
    std::sort(recent_.begin(), recent_.end());
    recent_.erase(std::unique(recent_.begin(), recent_.end()), recent_.end());
    for (token_id t : recent_) {
      if (t < 0 || t >= n_vocab) continue;
      float& l = logits[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
  }
  const token_id best = argmax(logits);
  const float mx = logits[best];
  // Greedy; and the degenerate rows (all -inf/NaN, or +inf present) have one sensible answer.
  if (p_.temperature <= 0.f || !std::isfinite(mx)) return best;

  // Weights w = exp((logit - max) / temperature) over the whole row, 8 at a time (w = 1 at the
  // max; NaN and -inf get 0, as do weights that underflow: those could never be drawn).
  const float inv_t = 1.f / p_.temperature;
  weights_.resize(static_cast<size_t>(n_vocab));
  float* w = weights_.data();
  double total = 0;  // their sum
  {
    const __m256 vmx = _mm256_set1_ps(mx), vinv = _mm256_set1_ps(inv_t);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n_vocab; i += 8) {
      const __m256 l = _mm256_loadu_ps(logits.data() + i);
      const __m256 finite = _mm256_cmp_ps(l, _mm256_set1_ps(-INFINITY), _CMP_GT_OQ);  // false for NaN
      const __m256 e = _mm256_and_ps(cpu::exp256(_mm256_mul_ps(_mm256_sub_ps(l, vmx), vinv)), finite);
      _mm256_storeu_ps(w + i, e);
      acc = _mm256_add_ps(acc, e);
    }
    total = cpu::hsum(acc);
    for (; i < n_vocab; ++i) {
      w[i] = logits[i] > -INFINITY ? std::exp((logits[i] - mx) * inv_t) : 0.f;
      total += w[i];
    }
  }
  const bool top_p = p_.top_p<1.f, top_k = p_.top_k> 0 && p_.top_k < n_vocab;
  if (!top_k && !top_p && p_.min_p <= 0.f) {  // the whole row: draw in index order
    std::uniform_real_distribution<double> u(0.0, total);
    double r = u(rng_);
    token_id last = best;
    for (int64_t i = 0; i < n_vocab; ++i) {
      if (w[i] <= 0.f) continue;
      last = static_cast<token_id>(i);
      r -= w[i];
      if (r <= 0) return last;
    }
    return last;
  }
  // Candidates, most likely first (ties: lower id first): the top k; for top-p alone a growing
  // prefix until it holds top_p of the mass (the same set a full sort gives: the order is total).
  if (top_k) {
    top_finite(weights_, static_cast<size_t>(p_.top_k), cand_);
  } else if (top_p) {
    for (size_t k = 64;; k *= 4) {
      top_finite(weights_, k, cand_);
      double mass = 0;
      for (const auto& c : cand_) mass += c.first;
      if (mass >= p_.top_p * total || cand_.size() < k) break;
    }
  } else {  // min-p alone: only what can pass its floor (the largest weight is the argmax's)
    cand_.clear();
    const float floor = std::max(w[best] * p_.min_p, std::numeric_limits<float>::min());
    for (int64_t i = 0; i < n_vocab; ++i)
      if (w[i] >= floor) cand_.emplace_back(w[i], static_cast<token_id>(i));
  }
  if (top_p) {  // of the whole row's mass, or of the top k's (renormalised after top-k)
    double mass = total;
    if (top_k) {
      mass = 0;
      for (const auto& c : cand_) mass += c.first;
    }
    double cum = 0;
    size_t n = 0;
    while (n < cand_.size()) {
      cum += cand_[n++].first;
      if (cum >= p_.top_p * mass) break;
    }
    cand_.resize(std::max<size_t>(n, 1));
  }
  if (p_.min_p > 0.f) {  // relative to the most likely candidate
    float wmax = 0;
    for (const auto& c : cand_) wmax = std::max(wmax, c.first);
    const float floor = wmax * p_.min_p;
    cand_.erase(std::remove_if(cand_.begin(), cand_.end(), [&](const auto& c) { return c.first < floor; }),
                cand_.end());
  }
  double sum = 0;
  for (const auto& c : cand_) sum += c.first;
  if (cand_.empty() || !(sum > 0)) return best;
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng_);
  for (const auto& c : cand_) {
    r -= c.first;
    if (r <= 0) return c.second;
  }
  return cand_.back().second;
}

}  // namespace sy
