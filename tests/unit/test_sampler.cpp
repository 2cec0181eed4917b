// Sampling and stop strings, on synthetic logits (no model needed).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "worker/engine/sampler.hpp"
#include "worker/engine/stop_matcher.hpp"

using namespace sy;

namespace {
std::vector<float> logits_of(std::initializer_list<float> v) { return std::vector<float>(v); }

std::vector<token_id> draw(const sampling_params& p, const std::vector<float>& base, int n) {
  sampler s(p);
  std::vector<token_id> out;
  for (int i = 0; i < n; ++i) {
    auto l = base;
    out.push_back(s.sample(l, out));
  }
  return out;
}
}  // namespace

TEST_CASE("greedy picks the largest logit") {
  sampling_params p;
  sampler s(p);
  auto l = logits_of({0.1f, 2.f, -1.f, 1.9f});
  CHECK(s.sample(l, {}) == 1);
}

TEST_CASE("argmax: the first largest non-NaN logit, whatever the row length, ties, NaN and infinities") {
  // The definition: the scalar scan in which NaN never wins.
  auto reference = [](const std::vector<float>& l) {
    size_t best = 0;
    for (size_t i = 1; i < l.size(); ++i)
      if (l[i] > l[best] || std::isnan(l[best])) best = i;
    return static_cast<token_id>(best);
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-5.f, 5.f);
  const float nan = std::nanf(""), inf = INFINITY;
  for (size_t n : {1u, 7u, 8u, 9u, 31u, 64u, 1000u}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> l(n);
      for (auto& v : l) v = std::round(u(rng));  // small integers: many ties
      const int kind = trial % 8;
      for (size_t i = 0; i < n; ++i) {
        const float r = u(rng);
        if (kind == 1 && r > 3.f) l[i] = nan;
        if (kind == 2 && r > 3.f) l[i] = -inf;
        if (kind == 3 && r > 4.5f) l[i] = inf;
        if (kind == 4) l[i] = r > 0 ? nan : -inf;  // nothing finite
        if (kind == 5) l[i] = nan;                 // all NaN
        if (kind == 6) l[i] = -inf;                // all -inf
      }
      if (kind == 7) l[0] = nan;  // a NaN first
      INFO("n " << n << " kind " << kind);
      CHECK(argmax(l) == reference(l));
    }
  }
}

TEST_CASE("on a full-size row, draws follow the filtered softmax computed in double") {
  // 1000 tokens (the vectorised paths), logits with a long tail and a few NaN/-inf entries.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> base(1000);
  for (auto& v : base) v = nd(rng);
  base[3] = std::nanf("");
  base[4] = -INFINITY;
  struct filter {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
  };
  for (const filter f : {filter{1.f, 0, 1.f, 0.f}, filter{0.7f, 0, 0.9f, 0.f}, filter{1.f, 20, 1.f, 0.f},
                         filter{1.f, 0, 1.f, 0.1f}, filter{1.2f, 50, 0.8f, 0.05f}}) {
    INFO("temperature " << f.temperature << " top_k " << f.top_k << " top_p " << f.top_p << " min_p " << f.min_p);
    // The reference: sort by logit (ties by id), softmax in double, then top-k, top-p, min-p.
    std::vector<int> order;
    for (int i = 0; i < 1000; ++i)
      if (base[i] > -INFINITY) order.push_back(i);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return base[a] > base[b] || (base[a] == base[b] && a < b); });
    if (f.top_k > 0) order.resize(f.top_k);
    std::vector<double> prob;
    double z = 0;
    for (int i : order) z += std::exp((base[i] - base[order[0]]) / f.temperature);
    for (int i : order) prob.push_back(std::exp((base[i] - base[order[0]]) / f.temperature) / z);
    size_t keep = prob.size();
    if (f.top_p < 1.f) {
      double cum = 0;
      for (keep = 0; keep < prob.size();) {
        cum += prob[keep++];
        if (cum >= f.top_p) break;
      }
    }
    while (keep > 1 && prob[keep - 1] < prob[0] * f.min_p) --keep;
    std::map<int, double> want;
    double kept = 0;
    for (size_t j = 0; j < keep; ++j) kept += prob[j];
    for (size_t j = 0; j < keep; ++j) want[order[j]] = prob[j] / kept;

    sampling_params p;
    p.temperature = f.temperature;
    p.top_k = f.top_k;
    p.top_p = f.top_p;
    p.min_p = f.min_p;
    p.has_seed = true;
    p.seed = 9;
    sampler s(p);
    std::map<int, int> seen;
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
      auto l = base;
      ++seen[s.sample(l, {})];
    }
    for (const auto& [tok, count] : seen) {
      INFO("token " << tok);
      REQUIRE(want.count(tok));  // never outside the filtered set
    }
    for (const auto& [tok, q] : want) {  // frequencies within 5 standard deviations
      const double sd = std::sqrt(q * (1 - q) / n);
      INFO("token " << tok << " p " << q);
      CHECK(std::fabs(seen[tok] / double(n) - q) <= 5 * sd + 1e-4);
    }
  }
}

TEST_CASE("same seed gives the same tokens / another seed other tokens") {
  sampling_params p;
  p.temperature = 1.f;
  p.seed = 42;
  p.has_seed = true;
  std::vector<float> base(50);
  for (int i = 0; i < 50; ++i) base[i] = 0.05f * i;
  const auto a = draw(p, base, 64), b = draw(p, base, 64);
  CHECK(a == b);
  p.seed = 43;
  CHECK(draw(p, base, 64) != a);
}

TEST_CASE("top-k / top-p and min-p restrict the candidates") {
  std::vector<float> base = {3.f, 2.9f, 2.8f, 0.f, -1.f, -2.f};
  sampling_params p;
  p.temperature = 1.f;
  p.has_seed = true;
  std::map<token_id, int> seen;
  SECTION("top-k 2") {
    p.top_k = 2;
    for (token_id t : draw(p, base, 400)) ++seen[t];
    CHECK(seen.size() == 2);
    CHECK(seen.count(0) == 1);
    CHECK(seen.count(1) == 1);
  }
  SECTION("top-p small keeps only the best") {
    p.top_p = 0.05f;
    for (token_id t : draw(p, base, 200)) ++seen[t];
    CHECK(seen.size() == 1);
    CHECK(seen.count(0) == 1);
  }
  SECTION("min-p 0.5 drops tokens under half the best probability") {
    p.min_p = 0.5f;
    for (token_id t : draw(p, base, 400)) ++seen[t];
    CHECK(seen.size() == 3);  // 2.9 and 2.8 are within e^-0.5 of 3.0; 0 is not
  }
  SECTION("high temperature reaches the tail, low temperature does not") {
    p.temperature = 5.f;
    for (token_id t : draw(p, base, 600)) ++seen[t];
    CHECK(seen.size() == 6);
    seen.clear();
    p.temperature = 0.05f;
    for (token_id t : draw(p, base, 200)) ++seen[t];
    CHECK(seen[0] > 150);
  }
}

TEST_CASE("repetition penalty steers greedy away from repeated tokens") {
  sampling_params p;
  p.repetition_penalty = 1.5f;
  sampler s(p);
  auto l = logits_of({2.f, 1.6f, 0.f});
  std::vector<token_id> hist = {0};
  CHECK(s.sample(l, hist) == 1);  // 2.0 / 1.5 < 1.6
}

TEST_CASE("stop strings cut the text and hold back only possible prefixes") {
  stop_matcher m({"###", "END"});
  std::string out;
  out += m.push("Hello #");
  CHECK(out == "Hello ");  // "#" could start "###"
  out += m.push("# wor");
  CHECK(out == "Hello ## wor");  // "## " cannot be a prefix any more
  out += m.push("ld E");
  CHECK(out == "Hello ## world ");
  out += m.push("NDING");
  CHECK(m.stopped());
  CHECK(out == "Hello ## world ");
  CHECK(m.push("more").empty());
  CHECK(m.flush().empty());
  CHECK(m.matched() == "END");

  stop_matcher earliest({"b", "ab", "abc"});
  CHECK(earliest.push("xabcd") == "x");  // "ab" and "abc" start first; of those "ab" is listed first
  CHECK(earliest.matched() == "ab");
  stop_matcher same_place({"abc", "ab"});
  CHECK(same_place.push("abcd").empty());
  CHECK(same_place.matched() == "abc");

  stop_matcher none({});
  CHECK(none.push("abc") == "abc");
  stop_matcher tail({"xyz"});
  CHECK(tail.push("abcx") == "abc");
  CHECK(tail.flush() == "x");  // generation ended: the held text is released
  CHECK(tail.matched().empty());
}

TEST_CASE("NaN and infinite logits give a defined token") {
  sampling_params p;
  p.temperature = 0.7f;
  p.top_p = 0.9f;
  p.has_seed = true;
  sampler s(p);
  for (int i = 0; i < 200; ++i) {
    auto with_nan = logits_of({std::nanf(""), 1.f, 3.f, std::nanf("")});
    const token_id t = s.sample(with_nan, {});
    REQUIRE((t == 1 || t == 2));  // NaN entries are never drawn
  }
  auto all_neg_inf = logits_of({-INFINITY, -INFINITY, -INFINITY});
  const token_id t = s.sample(all_neg_inf, {});
  CHECK((t >= 0 && t < 3));
  auto pos_inf = logits_of({0.f, INFINITY, 5.f});
  CHECK(s.sample(pos_inf, {}) == 1);
  std::vector<float> empty;
  CHECK(s.sample(empty, {}) == 0);
}

TEST_CASE("logprobs: log-softmax of the raw logits, top alternatives most likely first") {
  const std::vector<float> logits = {1.f, 3.f, 2.f, NAN, 0.f};
  const auto r = sy::logprobs_of(logits, 2, 3);
  double z = 0;
  for (const float v : {1.f, 3.f, 2.f, 0.f}) z += std::exp(v);
  CHECK(r.token == 2);
  CHECK(r.logprob == Approx(2.0 - std::log(z)).margin(1e-5));
  REQUIRE(r.top.size() == 3);
  CHECK(r.top[0].first == 1);
  CHECK(r.top[1].first == 2);
  CHECK(r.top[2].first == 0);
  CHECK(r.top[0].second == Approx(3.0 - std::log(z)).margin(1e-5));
  double total = 0;  // probabilities of every finite token sum to one
  for (int t : {0, 1, 2, 4}) total += std::exp(sy::logprobs_of(logits, t, 0).logprob);
  CHECK(total == Approx(1.0).margin(1e-5));
  CHECK(std::isinf(sy::logprobs_of(logits, 3, 0).logprob));  // the NaN logit has probability 0
  CHECK(sy::logprobs_of(logits, 1, 0).top.empty());
}
