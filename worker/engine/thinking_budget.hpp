// A thinking budget (sampling_params::thinking_budget): a request whose thinking runs past N
// generated tokens has it closed by the worker, which generates the end-of-thinking text's tokens
// (sampling_params::thinking_end, "\n</think>\n\n" from the router) in place of what it samples,
// then samples the answer as usual — as vLLM's thinking_token_budget and llama.cpp's reasoning
// budget close it (docs/worker.md, "Thinking budget").
//
// One per request, fed every output token in order: the tokens are counted from the first one
// generated (a `<think>` the model writes itself counts too), and the thinking counts as closed
// once the output holds thinking_end's text without its surrounding whitespace (`</think>`), so a
// model that closes it in time is never touched. Pure: no clock, no engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.hpp"

namespace sy {

class thinking_budget {
 public:
  // `budget` >= 1 and `end_text` with something besides whitespace (validate() of sampling_params).
  thinking_budget(int32_t budget, const std::string& end_text, const tokenizer& vocab);

  // The output token to emit where `sampled` was sampled: `sampled` itself, or the next token of
  // the end text while the budget closes the thinking.
  token_id pick(token_id sampled);
  // An output token already emitted (a resumed stream's, replayed at submit).
  void replay(token_id t) { observe(t); }

  bool closed() const { return state_ == state::closed; }
  int32_t forced() const { return forced_; }  // end-text tokens generated in place of sampled ones

 private:
  void observe(token_id t);

  enum class state : uint8_t { open, closing, closed };
  const tokenizer& vocab_;
  int32_t budget_;
  std::vector<token_id> end_tokens_;  // thinking_end, tokenized as output text
  std::string tag_;                   // thinking_end without its surrounding whitespace
  std::string tail_;                  // the output's last bytes, shorter than tag_
  int32_t n_ = 0;                     // output tokens so far
  size_t next_end_ = 0;               // closing: the end token to emit next
  int32_t forced_ = 0;
  state state_ = state::open;
};

}  // namespace sy
