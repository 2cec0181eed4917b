// The sampling parameters of one request, declared once: the router fills them from the OpenAI
// request (router/openai/openai_request), the submit message carries them as they are (proto::wire_sampling
// names this struct), the response-cache key hashes them (cache/cache_key) and the engine's
// sampler reads them (worker/engine/sampler).
//
// The field list is written once, in visit_fields(): the protocol encodes and decodes the struct
// through it (the wire keys are the names it gives) and the cache key hashes every field it
// visits, so a field added here and to visit_fields() is on the wire and in the key at once.
// tests/unit/test_sampling_params.cpp fails when a field is added to the struct but not to the
// list. One validate() holds the ranges, used by the router after parsing, by the protocol
// decoder and by the engine's submit.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/sampling_draw.hpp"

namespace sy {

inline constexpr size_t k_max_stop_strings = 32;   // sampling_params::stop
inline constexpr size_t k_max_stop_bytes = 1024;   // each stop string
inline constexpr int32_t k_max_top_logprobs = 20;  // sampling_params::logprobs

struct sampling_params {
  float temperature = 0.f;         // >= 0; 0: greedy
  int32_t top_k = 0;               // >= 0; 0: off
  float top_p = 1.f;               // (0, 1]; 1: off
  float min_p = 0.f;               // [0, 1]; 0: off
  float repetition_penalty = 1.f;  // > 0; 1: off (llama.cpp/HF style: divide positive logits)
  int32_t repeat_last_n = 64;      // >= 0; tokens the penalty looks back over
  uint64_t seed = 0;               // used only when has_seed
  bool has_seed = false;           // without a seed, the sampler draws one from random_device
  int32_t max_tokens = 256;        // >= 1; completion tokens at most
  std::vector<std::string> stop;   // <= k_max_stop_strings, each non-empty and <= k_max_stop_bytes;
                                   // not included in the output
  bool ignore_eos = false;
  int32_t logprobs = 0;  // [0, k_max_top_logprobs]; > 0: report each sampled token's log-probability
                         // and this many top alternatives
  // A thinking budget (vLLM's thinking_token_budget, Anthropic's budget_tokens): after this many
  // generated tokens, a thinking the output has not closed with `thinking_end` (its text without
  // the whitespace around it) is closed by generating thinking_end's tokens in place of what is
  // sampled; the answer follows (worker/thinking_budget.hpp). >= 0; 0: none. thinking_end is
  // non-empty when the budget is set, <= k_max_stop_bytes.
  int32_t thinking_budget = 0;
  std::string thinking_end;

  bool operator==(const sampling_params&) const = default;
};

// Bounds a reader enforces on a field while decoding it (the protocol's msgpack reader), before
// validate() runs: elements of a vector, bytes of each string. Unbounded by default.
struct field_bounds {
  size_t max_n = std::numeric_limits<size_t>::max();
  size_t max_bytes = std::numeric_limits<size_t>::max();
};

// Calls v(name, field, bounds) for every field of `p`, in declaration order. `P` is
// sampling_params or const sampling_params. The names are the wire keys: never rename one.
template <class P, class V>
requires std::same_as<std::remove_const_t<P>, sampling_params>
void visit_fields(P& p, V&& v) {
  v("temperature", p.temperature, field_bounds{});
  v("top_k", p.top_k, field_bounds{});
  v("top_p", p.top_p, field_bounds{});
  v("min_p", p.min_p, field_bounds{});
  v("repetition_penalty", p.repetition_penalty, field_bounds{});
  v("repeat_last_n", p.repeat_last_n, field_bounds{});
  v("seed", p.seed, field_bounds{});
  v("has_seed", p.has_seed, field_bounds{});
  v("max_tokens", p.max_tokens, field_bounds{});
  v("stop", p.stop, field_bounds{.max_n = k_max_stop_strings, .max_bytes = k_max_stop_bytes});
  v("ignore_eos", p.ignore_eos, field_bounds{});
  v("logprobs", p.logprobs, field_bounds{});
  v("thinking_budget", p.thinking_budget, field_bounds{});
  v("thinking_end", p.thinking_end, field_bounds{.max_bytes = k_max_stop_bytes});
}

// The first parameter out of range: `field` as visit_fields() names it (with an index for a
// stop string, "stop[2]"), `message` says why ("outside (0, 1]").
struct sampling_error {
  std::string field;
  std::string message;
};
std::optional<sampling_error> validate(const sampling_params& p);

// The draw a backend sampler makes for a row of this request: `seed` is the request's (drawn by
// the engine when it has none), `step` the tokens it has sampled so far.
inline sampling_draw draw_of(const sampling_params& p, uint64_t seed, uint64_t step) {
  return {
      .temperature = p.temperature, .top_k = p.top_k, .top_p = p.top_p, .min_p = p.min_p, .seed = seed, .step = step};
}

// The seed of choice `index` of a request with n > 1 choices: choice 0 keeps the request's seed
// (n = 1 and the first of n give the same text), every other choice a seed mixed from (seed,
// index), so that choices of neighbouring seeds are unrelated (seed + index would make choice 1 of
// seed s choice 0 of seed s + 1). splitmix64's finalizer, fixed bit for bit.
inline uint64_t choice_seed(uint64_t seed, uint32_t index) {
  if (index == 0) return seed;
  uint64_t z = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t{index} + 1));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace sy
