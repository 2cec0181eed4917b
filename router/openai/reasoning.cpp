#include "router/openai/reasoning.hpp"

#include <algorithm>
#include <vector>

#include "common/tokenizer/tokenizer.hpp"

namespace sy::router {
namespace {

constexpr std::string_view k_space = " \t\n\r\v\f";

bool all_space(std::string_view s) { return s.find_first_not_of(k_space) == std::string_view::npos; }

// The length of the longest proper prefix of `tag` that `s` ends with.
size_t partial_tag_at_end(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

std::string thinking_end_text() { return "\n" + std::string(k_think_close) + "\n\n"; }

bool parse_reasoning_parser(std::string_view name, reasoning_parser& out) {
  if (name == "auto") {
    out = reasoning_parser::automatic;
  } else if (name == "deepseek_r1") {
    out = reasoning_parser::deepseek_r1;
  } else if (name == "qwen3") {
    out = reasoning_parser::qwen3;
  } else if (name == "none") {
    out = reasoning_parser::none;
  } else {
    return false;
  }
  return true;
}

bool prompt_opens_thinking(std::string_view prompt_tail) {
  const size_t at = prompt_tail.rfind(k_think_open);
  return at != std::string_view::npos && all_space(prompt_tail.substr(at + k_think_open.size()));
}

bool prompt_closes_thinking(std::string_view prompt_tail) {
  const size_t at = prompt_tail.rfind(k_think_close);
  return at != std::string_view::npos && all_space(prompt_tail.substr(at + k_think_close.size()));
}

namespace {

// The prompt's last tokens as text, special tokens rendered: `<think>\n` or `</think>\n\n` is one
// to a few tokens; a tokenizer without them as tokens spells them in at most one token per byte.
std::string prompt_tail(const tokenizer& tok, std::span<const int32_t> prompt) {
  constexpr size_t k_tail_tokens = 16;
  const auto tail = prompt.subspan(prompt.size() - std::min(prompt.size(), k_tail_tokens));
  return tok.decode(tail, /*render_special=*/true);
}

}  // namespace

bool prompt_opens_thinking(const tokenizer& tok, std::span<const int32_t> prompt) {
  return prompt_opens_thinking(prompt_tail(tok, prompt));
}

std::optional<reasoning_spec> reasoning_of(reasoning_parser p, std::string_view template_source, const tokenizer& tok,
                                           std::span<const int32_t> prompt, std::optional<bool> thinking) {
  if (p == reasoning_parser::none) return std::nullopt;
  // A format name (--chat-template NAME) mentions no tag: such a model needs the flag. A source
  // that only drops `</think>` from past turns (the DeepSeek-R1 distills' first template) counts.
  if (p == reasoning_parser::automatic && template_source.find(k_think_open) == std::string_view::npos &&
      template_source.find(k_think_close) == std::string_view::npos)
    return std::nullopt;
  const std::string tail = prompt_tail(tok, prompt);
  if (prompt_closes_thinking(tail)) return std::nullopt;  // Qwen3's empty block, DeepSeek-V3.1's </think>
  const bool opened = prompt_opens_thinking(tail);
  if (thinking == false && !opened) return std::nullopt;  // switched off
  return reasoning_spec{opened || p == reasoning_parser::deepseek_r1};
}

reasoning_splitter::reasoning_splitter(reasoning_spec spec) : state_(spec.open ? state::thinking : state::start) {}

reasoning_delta reasoning_splitter::feed(std::string_view text, bool done) {
  reasoning_delta d;
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(text);
  std::string_view rest = buf;
  for (;;) {
    switch (state_) {
      case state::start: {
        const size_t first = rest.find_first_not_of(k_space);
        const std::string_view from = first == std::string_view::npos ? std::string_view{} : rest.substr(first);
        if (from.substr(0, k_think_open.size()) == k_think_open) {
          state_ = state::thinking;
          rest = from.substr(k_think_open.size());
          continue;
        }
        if (from.size() < k_think_open.size() && k_think_open.substr(0, from.size()) == from && !done) {
          held_ = std::string(rest);  // whitespace, or the start of `<think>`: not decided yet
          return d;
        }
        state_ = state::plain;
        d.content.append(rest);
        return d;
      }
      case state::plain:
      case state::answer:
        d.content.append(rest);
        return d;
      case state::thinking: {
        const size_t at = rest.find(k_think_close);
        if (at != std::string_view::npos) {
          d.reasoning.append(rest.substr(0, at));
          rest = rest.substr(at + k_think_close.size());
          state_ = state::after;
          continue;
        }
        const size_t keep = done ? 0 : partial_tag_at_end(rest, k_think_close);
        d.reasoning.append(rest.substr(0, rest.size() - keep));
        held_ = std::string(rest.substr(rest.size() - keep));
        return d;
      }
      case state::after: {
        const size_t first = rest.find_first_not_of(k_space);
        if (first == std::string_view::npos) return d;  // whitespace after the tag: dropped
        state_ = state::answer;
        rest = rest.substr(first);
        continue;
      }
    }
  }
}

reasoning_split split_reasoning(const reasoning_spec& spec, std::string_view text) {
  reasoning_splitter s(spec);
  reasoning_delta d = s.feed(text, true);
  return {std::move(d.reasoning), std::move(d.content), s.reasoned()};
}

uint32_t count_reasoning_tokens(const tokenizer& tok, const reasoning_spec& spec, std::span<const int32_t> ids,
                                bool done) {
  std::string text;
  std::vector<size_t> ends;  // each token's end in text
  ends.reserve(ids.size());
  for (const int32_t id : ids) {
    text += tok.token_bytes(id);
    ends.push_back(text.size());
  }
  size_t begin = 0;  // the thinking's bytes: [begin, end)
  if (!spec.open) {
    const size_t first = text.find_first_not_of(k_space);
    if (first == std::string::npos || text.compare(first, k_think_open.size(), k_think_open) != 0) return 0;
    begin = first + k_think_open.size();
  }
  size_t end = std::min(text.find(k_think_close, begin), text.size());
  if (!done && end == text.size()) end -= partial_tag_at_end(text, k_think_close);
  uint32_t n = 0;
  size_t start = 0;
  for (const size_t e : ends) {
    if (e > start && start < end && e > begin) ++n;
    start = e;
  }
  return n;
}

}  // namespace sy::router
