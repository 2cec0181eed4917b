// OpenAI tool calling at the edge: the validated `tools` / `tool_choice` of a chat request, the
// JSON Schema that enforces `required` and a named choice (decoded under the structured-output
// grammar), and the model's text turned back into `tool_calls`, whole or as a stream.
//
// What the model writes: under an enforced choice, the call object {"name": N, "arguments": {...}}
// (an array of them for `required` with parallel_tool_calls), nothing else; under `auto`, free
// text in which calls are found by the family's markers (chat_template.hpp tool_call_style), or
// a text that is nothing but a call object (or an array of them). Text without a call that parses
// and names a declared function is ordinary content.
//
// Pure functions and one per-choice stream state (owned by the response it formats).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/chat_template.hpp"

namespace sy::router {

enum class tool_choice_mode : uint8_t { none, automatic, required, named };

// The tool fields of a chat request, as openai_request.cpp validated them.
struct tool_request {
  std::vector<chat_tool> tools;
  tool_choice_mode choice = tool_choice_mode::none;  // "auto" when tools are given without a choice
  std::string named;                                 // choice named: the function it names
  bool parallel = true;                              // parallel_tool_calls

  // Tools are offered to the model (rendered into the prompt, calls parsed out of the text).
  bool active() const { return !tools.empty() && choice != tool_choice_mode::none; }
  // The output is a call by construction (the grammar).
  bool enforced() const { return choice == tool_choice_mode::required || choice == tool_choice_mode::named; }
  // Everything above as one canonical text (the response cache key); "" when not active.
  std::string cache_text() const;
};

// The JSON Schema an enforced choice decodes under: {"name": {"const": N}, "arguments": the
// function's parameters} (properties in that order, both required, nothing else), for the named
// function or anyOf every tool; for `required` with parallel calls, an array of at least one.
std::string tool_call_schema(const tool_request& t);

// What a response's text is parsed with.
struct tool_parse_spec {
  tool_call_style style = tool_call_style::hermes;
  bool constrained = false;  // the text is the schema's document (an enforced choice)
  bool parallel = true;      // else only the first call is kept
  std::vector<std::string> names;
};
tool_parse_spec make_parse_spec(const tool_request& t, chat_format f);

struct parsed_tool_call {
  std::string name;
  std::string arguments;  // JSON text of an object
};
struct tool_output {
  std::vector<parsed_tool_call> calls;
  std::string content;       // the text around the calls (all of it when there are none)
  bool has_content = false;  // false: "content": null
};
// Constrained text cut by max_tokens gives the calls complete before the cut (the one cut short is
// dropped) and no content.
tool_output parse_tool_output(const tool_parse_spec& spec, std::string_view text);

// "call_" + 24 hex digits from the response id, the choice and the call's position: the same
// for every chunk of one response, different between responses.
std::string tool_call_id(std::string_view response_id, int32_t choice, size_t index);

// One call's part of a stream chunk: `name` (and the id) in its first delta, then fragments of
// `arguments` whose concatenation is the arguments of parse_tool_output on the whole text.
struct tool_call_delta {
  size_t index = 0;
  bool first = false;
  std::string name;
  std::string arguments;
};
struct tool_stream_delta {
  std::string content;
  std::vector<tool_call_delta> calls;
};

// Turns a choice's text pieces into content and call deltas. Constrained text streams each call's
// name as soon as it is complete and its arguments as they are written; under `auto` content
// streams until a call marker (or a text that opens like a call object), and the calls go out
// whole when the choice ends. What streams out adds up to parse_tool_output of the whole text.
class tool_call_stream {
 public:
  explicit tool_call_stream(tool_parse_spec spec) : spec_(std::move(spec)) {}
  tool_stream_delta feed(std::string_view text, bool done);
  bool called() const { return announced_ > 0; }  // finish_reason "tool_calls"

 private:
  void feed_constrained(tool_stream_delta& d);
  void feed_free(tool_stream_delta& d, bool done);

  tool_parse_spec spec_;
  std::string buf_;                // the text so far
  size_t emitted_ = 0;             // free text: bytes of buf_ sent as content
  bool holding_ = false;           // free text: everything held until the end
  size_t announced_ = 0;           // calls whose name went out
  std::vector<size_t> args_sent_;  // constrained: per call, the end of the arguments sent
};

}  // namespace sy::router
