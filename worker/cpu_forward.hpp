// The Llama forward pass on the CPU over a ragged batch: every token of every sequence in the
// step goes through each weight matrix together; attention reads K/V through each sequence's
// block table in the kv_arena.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/tokenizer.hpp"
#include "worker/kv_arena.hpp"
#include "worker/llama_model.hpp"

namespace sy {

struct batch_seq {
  std::span<const token_id> tokens;    // new tokens of this step
  int64_t pos0 = 0;                    // position of tokens[0]; K/V for [0, pos0) are cached
  std::span<const int32_t> block_ids;  // block table covering [0, pos0 + tokens.size())
  bool all_logits = false;             // logits for every token, else only the last
  bool logits = true;                  // false: no logits at all (a mid-prompt chunk)
  // Positions < n_prompt are prompt tokens (prefill kernels: bf16 panel GEMM), the rest are
  // generated tokens (integer GEMV on the quantized weights) — fixed per position, so a
  // token's numerics are the same alone, batched, chunked, cached or recomputed.
  int64_t n_prompt = 0;
};

class cpu_forward {
 public:
  cpu_forward(const llama_model& model, cpu::thread_pool& pool) : model_(model), pool_(pool) {}

  // Runs the batch, writes K/V of the new tokens into `kv`, and fills `logits` with one row of
  // n_vocab per requested token, in batch order. Token ids must be < n_vocab (checked by the
  // caller at admission; asserted here).
  void run(std::span<const batch_seq> batch, kv_arena& kv, std::vector<float>& logits);

 private:
  const llama_model& model_;
  cpu::thread_pool& pool_;
  // Activations, [n_tokens][width]; reused across steps.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, tmp_, gate_, up_;
  std::vector<float> scores_;  // per thread: n_ctx floats
};

}  // namespace sy
