// The OpenAI-compatible HTTP API at the edge, its requests (docs/engineering.md, "Parse at the
// edge"): request bodies are parsed and validated here into native structs, and a bad one becomes
// an api_error. Nothing past this file sees a request's raw JSON; the responses are formatted in
// router/openai/openai_response.hpp.
//
// Pure functions, no I/O, no state: callable from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/tokenizer/chat_template.hpp"
#include "common/wire/protocol.hpp"
#include "router/base/api_error.hpp"
#include "router/openai/tool_calls.hpp"

namespace sy::router {

api_error bad_request(std::string param, std::string message, std::string code = "invalid_value");
// 404 not_found_error, e.g. code "model_not_found".
api_error not_found(std::string code, std::string message, std::string param = "");

enum class endpoint : uint8_t { completions, chat_completions };

// Limits the edge enforces (router flags).
struct api_limits {
  int32_t max_n = 8;                 // choices per request
  int32_t max_tokens_cap = 1 << 20;  // larger max_tokens is a 400 (context is checked later)
  size_t max_prompt_bytes = 1u << 20;
  size_t max_messages = 1024;
  size_t max_stop = 4;  // like OpenAI
  int32_t max_top_logprobs = 20;
};

// A validated /v1/completions or /v1/chat/completions request.
struct generation_request {
  endpoint kind = endpoint::completions;
  std::string model;  // required, non-empty

  // completions: exactly one of prompt_text / prompt_tokens (a string, or an array of token
  // ids; a one-element array holding either is accepted too). chat: messages (non-empty).
  std::string prompt_text;
  std::vector<int32_t> prompt_tokens;
  bool prompt_is_tokens = false;
  std::vector<chat_message> messages;  // content given as a string or as an array of
                                       // {"type":"text","text":...} parts (joined)
  // chat_template_kwargs (vLLM, SGLang): an object of template variables. `enable_thinking`
  // (Qwen3's name) and `thinking` (DeepSeek-V3.1's), bools, are one switch, as llama.cpp has one:
  // honoured by templates that switch thinking (chat_template::apply), whichever name they read;
  // given both, they must agree. Other keys are accepted and have no effect, as in a Jinja
  // template that does not read them. A top-level `enable_thinking` (the simple form some
  // clients send) is read the same way; the kwargs' value wins. Not given (nullopt): each
  // template's default. Off, the response has no reasoning unless the prompt still opens it.
  std::optional<bool> thinking;

  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions only: prepend the prompt to the text
  // stream_options.continuous_usage_stats (vLLM's): every chunk carries the usage so far. On its
  // own too: per-chunk usage implies usage; the final usage chunk still needs include_usage.
  bool continuous_usage = false;

  // temperature [0,2], top_p (0,1], top_k (-1 or 0: off), min_p [0,1], repetition_penalty (0,2],
  // presence/frequency penalties accepted in [-2,2] and ignored, seed (any int64, stored as
  // uint64), max_tokens / max_completion_tokens (>= 1; the latter wins when both are given),
  // stop (string or array of <= max_stop non-empty strings), ignore_eos, logprobs:
  //   completions: "logprobs": int in [0, max_top_logprobs] (null/absent: off)
  //   chat: "logprobs": bool, "top_logprobs": int in [0, max_top_logprobs]
  // sampling.logprobs holds the number of top alternatives; want_logprobs says whether the
  // client asked for logprobs at all (chat "logprobs": true with top_logprobs 0 is valid).
  proto::wire_sampling sampling;
  bool max_tokens_given = false;  // else the router fills in what the context allows
  bool want_logprobs = false;

  // Switchyard extensions (vLLM spells priority the same way): lower is more urgent.
  std::optional<int32_t> priority;
  std::optional<double> timeout_s;  // "timeout": seconds until the request's deadline, > 0
  // "queue_timeout": seconds it may wait in the router's queue, > 0; only shortens the tenant's
  // or the router's queue timeout (docs/router.md, "Queue timeout").
  std::optional<double> queue_timeout_s;
  std::string user;           // OpenAI "user", informational
  std::optional<bool> cache;  // "cache": false opts out of the response cache (no lookup, no store)

  // response_format (chat and completions): {"type": "text"} (the default), {"type":
  // "json_object"}, or {"type": "json_schema", "json_schema": {"name", "schema", "strict",
  // "description"}}. The schema is compiled here (common/structured/json_schema.hpp) so what cannot be
  // enforced is a 400 naming the keyword; the worker compiles it again to decode under it.
  proto::wire_constraint constraint;

  // Chat only: `tools` (type function: name, description, parameters), `tool_choice` ("none",
  // "auto", "required" or {"type":"function","function":{"name"}}) and `parallel_tool_calls`.
  // Parameters are checked to be objects; under an enforced choice they are compiled too (a
  // keyword the grammar cannot enforce is a 400 naming it) and `constraint` holds the call
  // schema (tool_call_schema), so response_format must then be text. Messages may be role
  // "tool" (tool_call_id, content) and assistant messages may carry `tool_calls`.
  tool_request tools;
};

// Parses and validates a request body. Unknown fields are ignored (as OpenAI does). Errors:
// malformed JSON or a body that is not an object -> 400 code "invalid_json"; wrong type ->
// 400 "invalid_type" naming the field; value out of range -> 400 "invalid_value"; missing
// required field -> 400 "missing_required_parameter". (Strings must be valid UTF-8: the JSON
// parser rejects the rest.)
std::variant<generation_request, api_error> parse_generation_request(endpoint kind, std::string_view body,
                                                                     const api_limits& limits);

// ---- Tokenizer endpoints (vLLM's shapes; llama-server's field names accepted) -------------------

// POST /tokenize: {"model"?, "prompt": "..." | "messages": [...], "add_special_tokens"?,
// "add_generation_prompt"?, "return_token_strs"?}. llama-server's "content" is read as "prompt"
// and its "add_special" as "add_special_tokens".
struct tokenize_request {
  std::string model;  // empty: the one model served
  bool is_chat = false;
  std::string prompt;                  // !is_chat
  std::vector<chat_message> messages;  // is_chat: as /v1/chat/completions reads them
  std::optional<bool> thinking;        // is_chat: chat_template_kwargs, as there
  bool add_special_tokens = true;      // prompt: BOS (and EOS) as the model adds them
  bool add_generation_prompt = true;   // messages
  bool return_token_strs = false;
};
std::variant<tokenize_request, api_error> parse_tokenize_request(std::string_view body, const api_limits& limits);

// POST /detokenize: {"model"?, "tokens": [ids]}.
struct detokenize_request {
  std::string model;  // empty: the one model served
  std::vector<int32_t> tokens;
};
std::variant<detokenize_request, api_error> parse_detokenize_request(std::string_view body, const api_limits& limits);

}  // namespace sy::router
