// Token sampling from one row of logits.
//
// Order (as vLLM and Hugging Face): repetition penalty -> (temperature 0: argmax) -> top-k ->
// softmax with temperature -> top-p -> min-p -> draw with a seeded generator. (llama.cpp applies
// the temperature last, which changes what top-p and min-p keep when temperature != 1.)
// Same seed, same logits -> same token sequence. NaN logits count as -inf; callers validate
// parameters (sy::validate, common/sampling_params.hpp) before constructing a sampler.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/sampling_params.hpp"
#include "common/tokenizer/tokenizer.hpp"

namespace sy {

// Log-probabilities (natural log, of the model's distribution before any sampling transform,
// as vLLM reports them) of one sampled token and the `n_top` most likely tokens.
struct token_logprobs_info {
  token_id token = 0;
  float logprob = 0.f;
  std::vector<std::pair<token_id, float>> top;  // most likely first
};
// `logits` must be the raw logits (before the sampler changes them).
token_logprobs_info logprobs_of(std::span<const float> logits, token_id chosen, int32_t n_top);

class sampler {
 public:
  explicit sampler(const sampling_params& p);
  // `logits` (n_vocab) is modified in place. `history` is the sequence so far (prompt and
  // generated) for the repetition penalty.
  token_id sample(std::span<float> logits, std::span<const token_id> history);
  // Advances the generator past the draws of `n` samples (each non-greedy sample draws once):
  // a stream resumed after n tokens then draws what it would have.
  void skip_samples(uint64_t n) {
    if (p_.temperature > 0.f) rng_.discard(n);
  }

 private:
  sampling_params p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, token_id>> cand_;
  std::vector<float> weights_;  // exp((logit - max) / temperature) of the row being sampled
  std::vector<token_id> recent_;
};

token_id argmax(std::span<const float> logits);

}  // namespace sy
