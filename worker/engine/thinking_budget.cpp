#include "worker/engine/thinking_budget.hpp"

#include <string_view>

namespace sy {

namespace {
constexpr std::string_view k_space = " \t\n\r";
}

thinking_budget::thinking_budget(int32_t budget, const std::string& end_text, const tokenizer& vocab)
    : vocab_(vocab),
      budget_(budget),
      end_tokens_(vocab.encode(end_text, {.add_special = false, .parse_special = true})) {
  const size_t first = end_text.find_first_not_of(k_space);
  if (first != std::string::npos) tag_ = end_text.substr(first, end_text.find_last_not_of(k_space) + 1 - first);
  if (end_tokens_.empty() || tag_.empty()) state_ = state::closed;  // nothing to close with: never acts
}

token_id thinking_budget::pick(token_id sampled) {
  if (state_ == state::open && n_ >= budget_) state_ = state::closing;
  if (state_ != state::closing) {
    observe(sampled);
    return sampled;
  }
  const token_id t = end_tokens_[next_end_++];
  ++n_;
  ++forced_;
  if (next_end_ == end_tokens_.size()) state_ = state::closed;
  return t;
}

void thinking_budget::observe(token_id t) {
  ++n_;
  if (state_ != state::open) return;
  tail_ += vocab_.token_bytes(t, /*render_special=*/true);
  if (tail_.find(tag_) != std::string::npos) {
    state_ = state::closed;
    tail_.clear();
    return;
  }
  if (tail_.size() >= tag_.size()) tail_.erase(0, tail_.size() - (tag_.size() - 1));
}

}  // namespace sy
