// Device sampling (kernels/cuda/sampling) against the CPU (docs/cuda-backend.md, "Layout"):
//   - greedy rows equal sy::argmax exactly (ties, NaN, -inf, all-NaN, +inf; odd and 49152 vocabularies);
//   - sampled rows agree with a sort-based host reference of the documented semantics (same key
//     order, same fixed-point masses, same (seed, step) hash), allowing a few rows to differ where
//     the device's expf and the host's differ in the last bit at a boundary;
//   - determinism for the same (seed, step), spread over steps, and the statistics of top-k, top-p
//     (including ties, which go to the lower index), min-p and plain temperature sampling against
//     the softmax probabilities.
// Every run poisons the output ids with -7 first and checks guard values on both sides of them.
// Exits 77 without a device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/sampling.cuh"
#include "tests/gpu/gpu_check.hpp"
#include "worker/engine/sampler.hpp"

namespace {

using sy::cuda::device_sampling;
using sy::gpu_test::suite;

constexpr int32_t k_poison_id = -7;
constexpr int32_t k_guard_id = 0x5a5a5a5a;
constexpr int64_t k_guard_ids = 64;  // int32 guards on each side of the output

uint32_t g_seed = 4321;
uint32_t next_seed() { return g_seed += 7919; }

template <class T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  SY_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n * sizeof(T), 1)));
  return static_cast<T*>(p);
}

// Runs sample_tokens on host logits [n_rows][n_vocab] and params; returns the ids. Checks that no
// output was left poisoned and that the guards around the output are intact.
std::vector<int32_t> sample_on_device(suite& s, cudaStream_t st, const std::vector<float>& logits,
                                      const std::vector<device_sampling>& params, int64_t n_vocab,
                                      const std::string& what) {
  const int64_t n_rows = static_cast<int64_t>(params.size());
  if (static_cast<int64_t>(logits.size()) != n_rows * n_vocab) throw std::logic_error("sample_on_device: shape");
  float* d_logits = device_alloc<float>(logits.size());
  device_sampling* d_params = device_alloc<device_sampling>(params.size());
  int32_t* d_ids = device_alloc<int32_t>(n_rows + 2 * k_guard_ids);
  const size_t ws_bytes = sy::cuda::sample_tokens_workspace(n_rows, n_vocab);
  void* d_ws = nullptr;
  if (ws_bytes) SY_CUDA_CHECK(cudaMalloc(&d_ws, ws_bytes));

  SY_CUDA_CHECK(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  SY_CUDA_CHECK(cudaMemcpy(d_params, params.data(), params.size() * sizeof(device_sampling), cudaMemcpyHostToDevice));
  std::vector<int32_t> ids(n_rows + 2 * k_guard_ids, k_guard_id);
  std::fill(ids.begin() + k_guard_ids, ids.begin() + k_guard_ids + n_rows, k_poison_id);
  SY_CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));

  sy::cuda::sample_tokens(d_logits, n_rows, n_vocab, d_params, d_ids + k_guard_ids, d_ws, ws_bytes, st);
  SY_CUDA_CHECK(cudaStreamSynchronize(st));
  SY_CUDA_CHECK(cudaMemcpy(ids.data(), d_ids, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  cudaFree(d_logits);
  cudaFree(d_params);
  cudaFree(d_ids);
  cudaFree(d_ws);

  bool guards = true;
  for (int64_t i = 0; i < k_guard_ids; ++i)
    guards &= ids[i] == k_guard_id && ids[k_guard_ids + n_rows + i] == k_guard_id;
  s.check(guards, what + ": guard ids intact");
  std::vector<int32_t> out(ids.begin() + k_guard_ids, ids.begin() + k_guard_ids + n_rows);
  int64_t bad = 0;
  for (const int32_t id : out) bad += id < 0 || id >= std::max<int64_t>(n_vocab, 1);
  s.check(bad == 0, what + ": " + std::to_string(bad) + " ids poisoned or out of range");
  return out;
}

// Rows of normal logits, some with many ties, NaN, -inf, and a few degenerate rows.
std::vector<float> messy_logits(int64_t n_rows, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::uniform_int_distribution<int> pct(0, 99);
  std::vector<float> l(n_rows * n_vocab);
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = l.data() + r * n_vocab;
    const int mode = pct(rng);
    for (int64_t i = 0; i < n_vocab; ++i) {
      float v = nd(rng);
      if (mode < 30) v = std::round(v);  // many ties
      const int c = pct(rng);
      row[i] = c < 3 ? NAN : c < 6 ? -INFINITY : v;
    }
    if (mode == 95) std::fill(row, row + n_vocab, NAN);
    if (mode == 96) std::fill(row, row + n_vocab, -INFINITY);
    if (mode == 97) row[n_vocab / 2] = INFINITY;
    if (mode == 98)
      for (int64_t i = 0; i < n_vocab; ++i) row[i] = i % 3 ? NAN : 1.f;  // ties among numbers between NaNs
  }
  if (n_rows > 0) std::fill(l.begin(), l.begin() + n_vocab, NAN);                      // all NaN: the last index
  if (n_rows > 1) std::fill(l.begin() + n_vocab, l.begin() + 2 * n_vocab, -INFINITY);  // all -inf: index 0
  return l;
}

// ---- host reference of the documented device semantics ------------------------------------------

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t draw_bits(uint64_t seed, uint64_t step) {
  return mix64(mix64(seed ^ 0x6a09e667f3bcc909ull) + step * 0x9e3779b97f4a7c15ull);
}

struct reference {
  int32_t token = 0;
  std::set<int32_t> kept;  // what the draw chooses from (empty for greedy rows)
};

reference reference_sample(std::span<const float> l, const device_sampling& p) {
  reference out;
  out.token = sy::argmax(l);
  const float mx = l.empty() ? NAN : l[out.token];
  if (!(p.temperature > 0.f) || !std::isfinite(mx)) return out;
  struct cand {
    uint64_t key, mass;
    float e;
    int32_t id;
  };
  std::vector<cand> c;
  for (size_t i = 0; i < l.size(); ++i) {
    if (!(l[i] > -INFINITY)) continue;
    const float e = std::exp((l[i] - mx) / p.temperature);
    uint32_t bits;
    std::memcpy(&bits, &e, sizeof bits);
    c.push_back({(uint64_t{bits} << 24) | ((1u << 24) - 1 - static_cast<uint32_t>(i)),
                 static_cast<uint64_t>(e * 1099511627776.f), e, static_cast<int32_t>(i)});
  }
  std::sort(c.begin(), c.end(), [](const cand& a, const cand& b) { return a.key > b.key; });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(static_cast<size_t>(p.top_k));
  if (p.top_p < 1.f) {
    uint64_t total = 0;
    for (const auto& x : c) total += x.mass;
    double t = std::ceil(static_cast<double>(p.top_p) * static_cast<double>(total));
    if (!(t >= 1.0)) t = 1.0;
    const uint64_t target = t >= static_cast<double>(total) ? total : static_cast<uint64_t>(t);
    uint64_t cum = 0;
    size_t n = 0;
    while (n < c.size()) {
      cum += c[n++].mass;
      if (cum >= target) break;
    }
    c.resize(n);
  }
  const float floor = p.min_p > 0.f ? std::min(p.min_p, 1.f) : 0.f;
  std::erase_if(c, [&](const cand& x) { return x.e < floor; });
  uint64_t total = 0;
  for (const auto& x : c) {
    total += x.mass;
    if (x.mass) out.kept.insert(x.id);
  }
  const uint64_t target =
      static_cast<uint64_t>((static_cast<unsigned __int128>(draw_bits(p.seed, p.step)) * total) >> 64) + 1;
  uint64_t cum = 0;
  for (const auto& x : c) {
    cum += x.mass;
    if (cum >= target) {
      out.token = x.id;
      break;
    }
  }
  return out;
}

std::vector<double> softmax(const std::vector<float>& logits, float temperature) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((static_cast<double>(logits[i]) - mx) / temperature);
  for (auto& x : p) x /= sum;
  return p;
}

// ---- cases -----------------------------------------------------------------------------------------

void test_greedy(suite& s, cudaStream_t st) {
  for (const int64_t n_vocab : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1000}, int64_t{1023}, int64_t{1025},
                                int64_t{4097}, int64_t{32001}, int64_t{49152}}) {
    const int64_t n_rows = n_vocab >= 32000 ? 96 : 300;
    const std::string what = "greedy vocab " + std::to_string(n_vocab);
    const auto logits = messy_logits(n_rows, n_vocab, next_seed());
    std::vector<device_sampling> params(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) params[r].seed = r;  // a seed must not matter
    const auto ids = sample_on_device(s, st, logits, params, n_vocab, what);
    int64_t bad = 0, first = -1;
    for (int64_t r = 0; r < n_rows; ++r)
      if (ids[r] != sy::argmax({logits.data() + r * n_vocab, static_cast<size_t>(n_vocab)}) && bad++ == 0) first = r;
    s.check(bad == 0,
            what + ": " + std::to_string(bad) + " rows differ from sy::argmax (first " + std::to_string(first) + ")");
  }
}

// Random parameters (including greedy rows) on messy rows, against the host reference.
void test_against_reference(suite& s, cudaStream_t st) {
  std::mt19937 rng(next_seed());
  std::uniform_int_distribution<int> pct(0, 99);
  for (const int64_t n_vocab : {int64_t{5}, int64_t{1000}, int64_t{1025}, int64_t{3001}, int64_t{49152}}) {
    const int64_t n_rows = n_vocab >= 32000 ? 128 : 400;
    const std::string what = "sampled vocab " + std::to_string(n_vocab);
    const auto logits = messy_logits(n_rows, n_vocab, next_seed());
    std::vector<device_sampling> params(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) {
      auto& p = params[r];
      p.temperature = r % 9 == 0 ? 0.f : 0.05f + pct(rng) / 40.f;
      p.seed = 1000 + r;
      p.step = static_cast<uint64_t>(r) * 17;
      switch (r % 7) {
        case 1:
          p.top_k = 1 + pct(rng) * 3;
          break;
        case 2:
          p.top_p = pct(rng) / 100.f;
          break;
        case 3:
          p.min_p = pct(rng) / 100.f;
          break;
        case 4:
          p.top_k = 1 + pct(rng) * 30;
          p.top_p = 0.3f + pct(rng) / 200.f;
          p.min_p = pct(rng) / 300.f;
          break;
        case 5:
          p.top_k = 5000;  // above any candidate cap: must still work
          p.top_p = 0.9f;
          break;
        default:
          break;
      }
    }
    const auto ids = sample_on_device(s, st, logits, params, n_vocab, what);
    int64_t differ = 0, outside = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
      const auto ref = reference_sample({logits.data() + r * n_vocab, static_cast<size_t>(n_vocab)}, params[r]);
      differ += ids[r] != ref.token;
      outside += !ref.kept.empty() && !ref.kept.count(ids[r]);
      if (params[r].temperature == 0.f) s.check(ids[r] == ref.token, what + ": greedy row " + std::to_string(r));
    }
    // Exact agreement except where expf's last bit moves a boundary (expected: none or one).
    s.check(differ * 100 <= n_rows, what + ": " + std::to_string(differ) + " of " + std::to_string(n_rows) +
                                        " rows differ from the host reference");
    s.check(outside * 100 <= n_rows, what + ": " + std::to_string(outside) + " rows drew a token outside the kept set");
  }
}

void test_determinism(suite& s, cudaStream_t st) {
  const int64_t n_vocab = 49152, n_rows = 64;
  std::vector<float> logits;
  std::mt19937 rng(next_seed());
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < n_vocab; ++i) logits.push_back(nd(rng));
  // Rows 32..63 repeat rows 0..31 with the same parameters: same (seed, step) -> same token.
  std::copy(logits.begin(), logits.begin() + 32 * n_vocab, logits.begin() + 32 * n_vocab);
  std::vector<device_sampling> params(n_rows);
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t q = r % 32;
    params[r].temperature = 0.7f + 0.02f * q;
    params[r].top_k = q % 3 == 0 ? 50 : 0;
    params[r].top_p = q % 2 == 0 ? 0.95f : 1.f;
    params[r].seed = 77 + q;
    params[r].step = 5 * q;
  }
  const auto a = sample_on_device(s, st, logits, params, n_vocab, "determinism run 1");
  const auto b = sample_on_device(s, st, logits, params, n_vocab, "determinism run 2");
  s.check(a == b, "same logits, parameters, seed and step give the same tokens on a second launch");
  bool rows_agree = true;
  for (int64_t r = 0; r < 32; ++r) rows_agree &= a[r] == a[r + 32];
  s.check(rows_agree, "same (seed, step) gives the same token at another row of the batch");
  // A single row alone gives the token it got inside the batch.
  const std::vector<float> one(logits.begin() + 5 * n_vocab, logits.begin() + 6 * n_vocab);
  const auto c = sample_on_device(s, st, one, {params[5]}, n_vocab, "determinism single row");
  s.check(c[0] == a[5], "a row sampled alone gives the token it got in the batch");

  // Different steps spread: 100 equal logits (the rest -inf), 256 steps.
  const int64_t n_flat = 1000, n_steps = 256;
  std::vector<float> flat(n_steps * n_flat, -INFINITY);
  std::vector<device_sampling> steps(n_steps);
  for (int64_t r = 0; r < n_steps; ++r) {
    for (int64_t i = 0; i < 100; ++i) flat[r * n_flat + i * 7] = 1.f;
    steps[r].temperature = 1.f;
    steps[r].seed = 12345;
    steps[r].step = static_cast<uint64_t>(r);
  }
  const auto spread = sample_on_device(s, st, flat, steps, n_flat, "spread over steps");
  const std::set<int32_t> distinct(spread.begin(), spread.end());
  bool on_support = true;
  for (const int32_t id : spread) on_support &= id % 7 == 0 && id < 700;
  s.check(on_support, "steps only draw tokens with probability > 0");
  s.check(distinct.size() >= 60, "256 steps over 100 equally likely tokens give " + std::to_string(distinct.size()) +
                                     " distinct tokens (expected ~92)");
}

// Draws `n_draws` times (steps 0..n_draws-1) from one row; returns the count of each id.
std::map<int32_t, int64_t> draw_counts(suite& s, cudaStream_t st, const std::vector<float>& row, device_sampling p,
                                       int64_t n_draws, const std::string& what) {
  const int64_t n_vocab = static_cast<int64_t>(row.size());
  std::vector<float> logits;
  logits.reserve(n_draws * n_vocab);
  std::vector<device_sampling> params(n_draws, p);
  for (int64_t r = 0; r < n_draws; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    params[r].step = static_cast<uint64_t>(r);
  }
  std::map<int32_t, int64_t> counts;
  for (const int32_t id : sample_on_device(s, st, logits, params, n_vocab, what)) ++counts[id];
  return counts;
}

// Frequencies of `ids` against `want` (probabilities), each within `tol`; no other id may appear.
void check_frequencies(suite& s, const std::map<int32_t, int64_t>& counts, const std::map<int32_t, double>& want,
                       int64_t n_draws, double tol, const std::string& what) {
  for (const auto& [id, n] : counts)
    s.check(want.count(id) > 0,
            what + ": drew id " + std::to_string(id) + " (" + std::to_string(n) + " times), which must never be drawn");
  for (const auto& [id, p] : want) {
    const auto it = counts.find(id);
    const double f = it == counts.end() ? 0.0 : static_cast<double>(it->second) / static_cast<double>(n_draws);
    s.check(std::abs(f - p) <= tol, what + ": id " + std::to_string(id) + " frequency " + std::to_string(f) +
                                        ", probability " + std::to_string(p));
  }
}

void test_statistics(suite& s, cudaStream_t st) {
  std::mt19937 rng(next_seed());
  const int64_t n_draws = 3000;
  // 3000 draws: a binomial frequency has sd <= 0.0092; 0.035 is about four of them.
  const double tol = 0.035;

  {  // top_k = 3: only the three largest, in proportion to their softmax.
    const int64_t n_vocab = 4099;
    std::uniform_real_distribution<float> low(-6.f, 0.5f);
    std::vector<float> row(n_vocab);
    for (auto& v : row) v = low(rng);
    const int32_t ids[3] = {17, 4098, 2049};
    const float vals[3] = {2.f, 1.5f, 1.f};
    for (int j = 0; j < 3; ++j) row[ids[j]] = vals[j];
    for (const float t : {1.f, 0.6f}) {
      device_sampling p;
      p.temperature = t;
      p.top_k = 3;
      p.seed = 99;
      const auto pr = softmax({vals[0], vals[1], vals[2]}, t);
      const std::string what = "top_k 3, temperature " + std::to_string(t);
      check_frequencies(s, draw_counts(s, st, row, p, n_draws, what),
                        {{ids[0], pr[0]}, {ids[1], pr[1]}, {ids[2], pr[2]}}, n_draws, tol, what);
    }
  }
  {  // top_p = 0.5 over probabilities 0.3, 0.25, 0.2, 0.15, 0.1: keeps the first two (0.55 >= 0.5).
    const int64_t n_vocab = 49152;
    const int32_t ids[5] = {40000, 3, 777, 49151, 12345};
    const double probs[5] = {0.3, 0.25, 0.2, 0.15, 0.1};
    for (const float rest : {-INFINITY, -1000.f}) {  // rest -inf: few candidates; -1000: all candidates, mass 0
      std::vector<float> row(n_vocab, rest);
      for (int j = 0; j < 5; ++j) row[ids[j]] = static_cast<float>(std::log(probs[j]));
      device_sampling p;
      p.temperature = 1.f;
      p.top_p = 0.5f;
      p.seed = 2024;
      const std::string what = std::string("top_p 0.5, rest ") + (rest < -1e30f ? "-inf" : "-1000");
      check_frequencies(s, draw_counts(s, st, row, p, n_draws, what), {{ids[0], 0.3 / 0.55}, {ids[1], 0.25 / 0.55}},
                        n_draws, tol, what);
    }
  }
  {  // Ties: eight equal logits, top_p = 0.5 keeps the four with the lowest indices.
    const int64_t n_vocab = 2051;
    std::vector<float> row(n_vocab, -1000.f);
    std::vector<int32_t> tied;
    for (int j = 0; j < 8; ++j) tied.push_back(static_cast<int32_t>((j * 257 + 3) % n_vocab));
    for (const int32_t id : tied) row[id] = 2.f;
    std::sort(tied.begin(), tied.end());
    device_sampling p;
    p.temperature = 1.f;
    p.top_p = 0.5f;
    p.seed = 31337;
    check_frequencies(s, draw_counts(s, st, row, p, n_draws, "top_p ties"),
                      {{tied[0], 0.25}, {tied[1], 0.25}, {tied[2], 0.25}, {tied[3], 0.25}}, n_draws, tol,
                      "top_p 0.5 over 8 tied tokens");
  }
  {  // min_p = 0.2 over 0.5, 0.3, 0.15, 0.05: 0.05 < 0.2 * 0.5 is dropped.
    const int64_t n_vocab = 1500;
    std::vector<float> row(n_vocab, -INFINITY);
    const int32_t ids[4] = {1499, 0, 700, 701};
    const double probs[4] = {0.5, 0.3, 0.15, 0.05};
    for (int j = 0; j < 4; ++j) row[ids[j]] = static_cast<float>(std::log(probs[j]));
    device_sampling p;
    p.temperature = 1.f;
    p.min_p = 0.2f;
    p.seed = 8;
    check_frequencies(s, draw_counts(s, st, row, p, n_draws, "min_p"),
                      {{ids[0], 0.5 / 0.95}, {ids[1], 0.3 / 0.95}, {ids[2], 0.15 / 0.95}}, n_draws, tol, "min_p 0.2");
  }
  {  // Plain temperature over the whole vocabulary: four likely tokens and a long tail.
    const int64_t n_vocab = 32001;
    std::normal_distribution<float> tail(-8.f, 1.f);
    std::vector<float> row(n_vocab);
    for (auto& v : row) v = std::min(tail(rng), 0.f);
    const int32_t ids[4] = {5, 31000, 16000, 9};
    const float vals[4] = {6.f, 5.5f, 5.f, 4.f};
    for (int j = 0; j < 4; ++j) row[ids[j]] = vals[j];
    device_sampling p;
    p.temperature = 1.3f;
    p.seed = 5;
    const auto pr = softmax(row, p.temperature);
    std::map<int32_t, double> want;
    double top = 0;
    for (const int32_t id : ids) top += want[id] = pr[id];
    const auto counts = draw_counts(s, st, row, p, n_draws, "temperature only");
    int64_t tail_draws = 0;
    std::map<int32_t, int64_t> top_counts;
    for (const auto& [id, n] : counts) (want.count(id) ? top_counts[id] : tail_draws) += n;
    check_frequencies(s, top_counts, want, n_draws, tol, "temperature 1.3, no filters");
    const double f_tail = static_cast<double>(tail_draws) / n_draws;
    s.check(std::abs(f_tail - (1.0 - top)) <= tol,
            "temperature 1.3 tail frequency " + std::to_string(f_tail) + ", probability " + std::to_string(1.0 - top));
  }
}

void test_misuse(suite& s, cudaStream_t st) {
  bool threw = false;
  try {
    sy::cuda::sample_tokens(nullptr, 4, 1000, nullptr, nullptr, nullptr, sy::cuda::sample_tokens_workspace(4, 1000) - 1,
                            st);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  s.check(threw, "a workspace one byte short is rejected before any launch");
  // Zero rows: nothing to do, nothing launched.
  sy::cuda::sample_tokens(nullptr, 0, 1000, nullptr, nullptr, nullptr, 0, st);
  s.check(sy::cuda::sample_tokens_workspace(0, 1000) == 0, "no workspace for zero rows");
}

}  // namespace

int main() {
  return sy::gpu_test::run("cuda_sampling", [](suite& s) {
    cudaStream_t st = nullptr;
    SY_CUDA_CHECK(cudaStreamCreate(&st));
    test_greedy(s, st);
    test_against_reference(s, st);
    test_determinism(s, st);
    test_statistics(s, st);
    test_misuse(s, st);
    SY_CUDA_CHECK(cudaStreamDestroy(st));
  });
}
