// Reasoning output of models that think before they answer (Qwen3, the DeepSeek-R1 distills):
// the text they write between `<think>` and `</think>` is the reasoning, returned apart from the
// answer (message.reasoning_content and message.reasoning, delta.* when streamed), never in
// `content` (docs/router.md, "Reasoning output").
//
// The rule, one for the whole text and for a stream of it cut anywhere:
//  * Thinking happens at most once, at the start. It is open from the first byte when the prompt
//    already opened it (a template whose generation prompt ends in `<think>\n`, as the
//    DeepSeek-R1 distills' does: the output holds only `</think>`), or when the model's first
//    non-whitespace text is `<think>` (Qwen3 opens it itself; the tag and the whitespace before it
//    are dropped). Otherwise there is no reasoning and the text is all content, as written; and
//    none at all where the prompt ends just after a closed block (Qwen3's empty one with thinking
//    off, DeepSeek-V3.1's `</think>`: reasoning_of).
//  * `</think>` ends it; the whitespace right after the tag is dropped, the rest is content. A
//    later `<think>` or `</think>` is content.
//  * Thinking never closed (cut by max_tokens) is all reasoning; the content is empty.
//
// Pure functions and one per-choice stream state (owned by the response it formats), like
// tool_calls.hpp; the router's tool-call parser reads only the content part.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace sy {
class tokenizer;
}

namespace sy::router {

// --reasoning-parser: which models' output is split. `automatic` ("auto"): the models whose chat
// template mentions `<think>` or `</think>` (thinking open where the prompt opens it: the
// DeepSeek-R1 distills' generation prompt ends in `<think>\n`); `deepseek_r1`: every model, thinking open from the
// first byte unless the output opens it; `qwen3`: every model, thinking open only where the prompt or the output opens
// it; `none`: no model.
enum class reasoning_parser : uint8_t { automatic, deepseek_r1, qwen3, none };
// The flag's values: "auto", "deepseek_r1", "qwen3", "none"; false for anything else.
bool parse_reasoning_parser(std::string_view name, reasoning_parser& out);

inline constexpr std::string_view k_think_open = "<think>";
inline constexpr std::string_view k_think_close = "</think>";

// Whether the prompt's text ends inside an open thinking block: its last `<think>` is followed
// by nothing but whitespace.
bool prompt_opens_thinking(std::string_view prompt_tail);
// The same for token ids: the last few tokens of the prompt, special tokens rendered.
bool prompt_opens_thinking(const tokenizer& tok, std::span<const int32_t> prompt);
// Whether the prompt's text ends just after a closed thinking block: its last `</think>` is
// followed by nothing but whitespace (Qwen3's empty block with thinking off, DeepSeek-V3.1's
// `<｜Assistant｜></think>`): the answer has no thinking.
bool prompt_closes_thinking(std::string_view prompt_tail);

// The text a worker generates to close a thinking past its budget (sampling_params::
// thinking_budget): "\n</think>\n\n", the tag the split ends the thinking at, on a line of its
// own as the templates write it.
std::string thinking_end_text();

// How one response's text is split.
struct reasoning_spec {
  bool open = false;  // thinking is open before the first byte (the prompt opened it)
};

// How a chat answer splits, for a model whose chat template's source (as its workers sent it) is
// `template_source`, to a request whose prompt is `prompt` and whose thinking switch is
// `thinking` (nullopt: not given): nullopt when it does not (the parser is off for the model, the
// prompt closed the thinking, or thinking was switched off and the prompt does not open it).
std::optional<reasoning_spec> reasoning_of(reasoning_parser p, std::string_view template_source, const tokenizer& tok,
                                           std::span<const int32_t> prompt, std::optional<bool> thinking);

struct reasoning_delta {
  std::string reasoning;
  std::string content;
};

// Splits a choice's text pieces as they come. Whatever the cuts, the concatenated deltas equal
// what one feed of the whole text gives, and nothing is held once `done`.
class reasoning_splitter {
 public:
  explicit reasoning_splitter(reasoning_spec spec = {});
  reasoning_delta feed(std::string_view text, bool done);
  // Thinking happened (opened by the prompt or the output): the response carries the reasoning,
  // and `content` is null while empty.
  bool reasoned() const { return state_ != state::start && state_ != state::plain; }

 private:
  enum class state : uint8_t {
    start,     // output so far is whitespace or a prefix of `<think>`: held
    plain,     // no thinking: everything is content
    thinking,  // inside; held: a suffix that may begin `</think>`
    after,     // just after `</think>`: whitespace dropped
    answer,    // content
  };
  state state_;
  std::string held_;
};

// The whole text at once: feed(text, true) of a fresh splitter.
struct reasoning_split {
  std::string reasoning;
  std::string content;
  bool reasoned = false;
};
reasoning_split split_reasoning(const reasoning_spec& spec, std::string_view text);

// usage.completion_tokens_details.reasoning_tokens: of the generated tokens, those whose text lies
// (at least partly) inside the thinking, tags excluded, by the same rule as above applied to
// the tokens' own texts.
// `done`: `ids` are the whole output. Not done (the usage so far of a stream), tokens that may
// begin `</think>` are not counted yet, as the split holds their text: the count never falls as
// more tokens come.
uint32_t count_reasoning_tokens(const tokenizer& tok, const reasoning_spec& spec, std::span<const int32_t> ids,
                                bool done = true);

}  // namespace sy::router
