// Single-sequence generation loop over the CPU forward: prompt in, streamed text out.
// (The batching engine of the serving worker drives cpu_forward itself; this is the CLI's,
// the tests' and the benchmark's path.)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/finish_reason.hpp"
#include "worker/engine/sampler.hpp"
#include "worker/model/cpu_forward.hpp"
#include "worker/model/kv_arena.hpp"

namespace sy {

struct generation_result {
  std::vector<token_id> tokens;  // generated ids (including a final EOS, if any)
  std::string text;              // generated text, stop string excluded
  // stop (EOS or a stop string), length or cancelled
  sy::finish_reason finish_reason = sy::finish_reason::none;
  int64_t n_prompt = 0;
  double prompt_ms = 0;  // prefill time
  double decode_ms = 0;  // time for all tokens after the first
};

class generator {
 public:
  // `kv`: the KV cache's element type (f16, or q8_0 as `serve --kv-type q8_0` keeps it).
  generator(const llama_model& model, cpu::thread_pool& pool, int64_t n_ctx, int64_t block_size = 16,
            cpu::kv_type kv = cpu::kv_type::f16);

  // `on_text` gets each UTF-8-complete text delta; returning false cancels.
  // Throws std::invalid_argument when the prompt is empty or does not fit the context.
  generation_result generate(std::span<const token_id> prompt, const sampling_params& params,
                             const std::function<bool(std::string_view)>& on_text = {});

  // Logits of every position of `tokens` (teacher forcing), n_vocab per row.
  std::vector<float> score(std::span<const token_id> tokens, int64_t chunk = 512);

  int64_t n_ctx() const { return n_ctx_; }

 private:
  const llama_model& model_;
  cpu_forward fwd_;
  kv_arena kv_;
  std::vector<int32_t> block_ids_;
  int64_t n_ctx_;
};

}  // namespace sy
