// The OpenAI-compatible HTTP API at the edge (docs/engineering.md, "Parse at the edge"): request
// bodies are parsed and validated here into native structs, and every response body, stream
// chunk and error body is formatted here. Nothing past this file sees raw JSON.
//
// Pure functions, no I/O, no state: callable from any thread. The one exception: format_chunk
// advances the tool-call stream state a response's meta carries (meta.tool_streams).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/chat_template.hpp"
#include "common/protocol.hpp"
#include "router/reasoning.hpp"
#include "router/tool_calls.hpp"

namespace sy::router {

// An error as the client sees it: HTTP status + OpenAI error body
// {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}.
struct api_error {
  int status = 400;
  std::string type = "invalid_request_error";  // invalid_request_error, authentication_error,
                                               // permission_error, not_found_error,
                                               // rate_limit_error, overloaded_error, server_error
  std::string code;                            // machine-readable, e.g. "invalid_type", "model_not_found"; may be empty
  std::string param;    // the offending field ("max_tokens", "messages[1].content"); may be empty
  std::string message;  // names the field and what was wrong
  // When to retry, in seconds (0: the responder's default; router/api_errors.hpp says which
  // statuses carry Retry-After).
  double retry_after_s = 0;
};

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
  std::string user;                 // OpenAI "user", informational
  std::optional<bool> cache;        // "cache": false opts out of the response cache (no lookup, no store)

  // response_format (chat and completions): {"type": "text"} (the default), {"type":
  // "json_object"}, or {"type": "json_schema", "json_schema": {"name", "schema", "strict",
  // "description"}}. The schema is compiled here (common/json_schema.hpp) so what cannot be
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

// ---- Responses ---------------------------------------------------------------------------------

// One generated token with its log-probabilities, as text (the caller renders token ids).
struct token_logprobs {
  std::string token;  // the token's text (may be a partial UTF-8 sequence: bytes are escaped)
  float logprob = 0.f;
  std::vector<std::pair<std::string, float>> top;  // most likely first
};

struct choice_result {
  choice_result() = default;
  // Listed as {index, text, finish, logprobs} (and the stop string) without missing-initializer warnings.
  choice_result(int32_t at, std::string piece, sy::finish_reason finish, std::vector<token_logprobs> lps = {},
                std::string stop_string = {})
      : index(at),
        text(std::move(piece)),
        finish_reason(finish),
        logprobs(std::move(lps)),
        stop(std::move(stop_string)) {}

  int32_t index = 0;
  std::string text;
  // stop, length (tool_calls is derived here from meta.tools); written as name() in the JSON.
  sy::finish_reason finish_reason = sy::finish_reason::none;
  std::vector<token_logprobs> logprobs;  // when requested
  // The stop string that ended it (finish_reason stop), as its worker named it; empty: none (the
  // end of the turn, a grammar's end). Written as vLLM's choice.stop_reason, null when empty.
  std::string stop;
};

struct usage_info {
  usage_info() = default;
  // {prompt, completion, cached} as before reasoning_tokens (no missing-initializer warnings where
  // the three are listed).
  usage_info(uint32_t prompt, uint32_t completion, uint32_t cached = 0)
      : prompt_tokens(prompt), completion_tokens(completion), cached_tokens(cached) {}

  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint32_t cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens
  // usage.completion_tokens_details.reasoning_tokens, given for responses that split reasoning.
  std::optional<uint32_t> reasoning_tokens;
};

struct anthropic_state;  // router/anthropic_api.hpp
struct responses_state;  // router/responses_api.hpp

struct response_meta {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  std::string model;
  int64_t created = 0;  // unix seconds
  endpoint kind = endpoint::completions;
  bool want_logprobs = false;
  // Chat with tools offered (enable_tool_calls): the text is parsed into message.tool_calls
  // (delta.tool_calls when streamed). tool_streams is the one mutable part, each choice's stream
  // state: a response's chunks are formatted in order on one thread, and every listener of a
  // generation (leader, coalesced follower, cache replay) has a meta of its own.
  std::shared_ptr<const tool_parse_spec> tools;
  std::shared_ptr<std::map<int32_t, tool_call_stream>> tool_streams;
  // Chat from a model that thinks (enable_reasoning): the text is split into reasoning and content
  // (router/reasoning.hpp) before anything else reads it; the streams are mutable as above.
  std::shared_ptr<const reasoning_spec> reasoning;
  std::shared_ptr<std::map<int32_t, reasoning_splitter>> reasoning_streams;
  // An Anthropic Messages response (router/anthropic_api.hpp, enable_anthropic): every format_*
  // below writes Anthropic's shapes instead; the state is the stream's, mutable like tool_streams.
  std::shared_ptr<anthropic_state> anthropic;
  // A Responses API response (router/responses_api.hpp, enable_responses): the same, in that
  // API's shapes (a `response` object; its SSE event sequence).
  std::shared_ptr<responses_state> responses;
};

// Sets meta.tools (and fresh stream state) when `g` offers tools to a model of format `f`.
void enable_tool_calls(response_meta& meta, const generation_request& g, chat_format f);

// Sets meta.reasoning (and fresh stream state) for a chat request: `spec` is how its text splits.
void enable_reasoning(response_meta& meta, reasoning_spec spec);

// Non-streamed body: "text_completion" or "chat.completion" with choices and usage; each choice
// carries vLLM's stop_reason (choice_result::stop, null when none).
std::string format_response(const response_meta& meta, const std::vector<choice_result>& choices,
                            const usage_info& usage);

// One SSE chunk's JSON (without "data: " and the blank line): "text_completion" (completions)
// or "chat.completion.chunk" (chat: "delta" holds {"role":"assistant"} when `first`, "content"
// when text is non-empty; with meta.tools, the content and delta.tool_calls of
// tool_call_stream, and finish_reason "tool_calls" for "stop" once a call went out).
// finish_reason is null while none. `usage`, when given, is the usage so far
// (stream_options.continuous_usage_stats). The choice's last chunk (finish set) also carries
// vLLM's stop_reason: `stop`, the stop string that ended it, or null; earlier chunks have none.
// usage_chunk: "choices": [] and "usage" set (stream_options.include_usage).
std::string format_chunk(const response_meta& meta, int32_t index, std::string_view text, bool first,
                         sy::finish_reason finish, const std::vector<token_logprobs>& logprobs,
                         const usage_info* usage = nullptr, std::string_view stop = {});
std::string format_usage_chunk(const response_meta& meta, const usage_info& usage);

// {"error": {...}} — also the payload of a terminal SSE error event.
std::string format_error(const api_error& e);
// The error body in the shape of meta's API (Anthropic's {"type":"error",...} or the above).
std::string format_error(const response_meta& meta, const api_error& e);
// A stream's last events after its chunks: the usage chunk (include_usage) and [DONE]; for
// Anthropic, message_delta and message_stop.
std::vector<std::string> format_stream_end(const response_meta& meta, const usage_info& usage, bool include_usage);
// A stream's terminal error: the error event and [DONE]; for Anthropic, an `error` event.
std::vector<std::string> format_stream_error(const response_meta& meta, const api_error& e);

// GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by","root",
// "max_model_len"}]}, one card per served name; GET /v1/models/{id}: one card.
struct model_card {
  std::string id;    // the name clients use (the model's id or an alias)
  std::string root;  // the model's id (its file's name)
  int64_t created = 0;
  uint32_t max_model_len = 0;
};
std::string format_models(const std::vector<model_card>& models);
std::string format_model(const model_card& model);

// GET /version: {"version": "<Switchyard's version>"} (the CMake project's version).
std::string format_version();

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

// {"count", "max_model_len", "tokens", "token_strs"?}; `token_strs` is left out when empty.
std::string format_tokenize(const std::vector<int32_t>& ids, uint32_t max_model_len,
                            const std::vector<std::string>& token_strs);

// POST /detokenize: {"model"?, "tokens": [ids]}.
struct detokenize_request {
  std::string model;  // empty: the one model served
  std::vector<int32_t> tokens;
};
std::variant<detokenize_request, api_error> parse_detokenize_request(std::string_view body, const api_limits& limits);
// {"prompt": text} (vLLM), with llama-server's "content" holding the same text.
std::string format_detokenize(std::string_view text);

}  // namespace sy::router
