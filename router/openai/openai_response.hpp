// The OpenAI-compatible HTTP API at the edge, its responses: every response body, stream chunk and
// error body is formatted here from native structs (requests: router/openai/openai_request.hpp).
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
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/finish_reason.hpp"
#include "common/tokenizer/chat_template.hpp"
#include "router/openai/openai_request.hpp"
#include "router/openai/reasoning.hpp"
#include "router/openai/tool_calls.hpp"

namespace sy::router {

// ---- Responses ---------------------------------------------------------------------------------

// One generated token with its log-probabilities, as text (the caller renders token ids).
struct token_logprobs {
  std::string token;  // the token's text (may be a partial UTF-8 sequence: bytes are escaped)
  float logprob = 0.f;
  std::vector<std::pair<std::string, float>> top;  // most likely first
};

// Tokens with their log-probabilities in the chat shape, which the Responses API's output_text
// shares: [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}].
nlohmann::ordered_json token_logprobs_json(const std::vector<token_logprobs>& lps);

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

struct anthropic_state;  // router/openai/anthropic_api.hpp
struct responses_state;  // router/openai/responses_api.hpp

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
  // (router/openai/reasoning.hpp) before anything else reads it; the streams are mutable as above.
  std::shared_ptr<const reasoning_spec> reasoning;
  std::shared_ptr<std::map<int32_t, reasoning_splitter>> reasoning_streams;
  // An Anthropic Messages response (router/openai/anthropic_api.hpp, enable_anthropic): every format_*
  // below writes Anthropic's shapes instead; the state is the stream's, mutable like tool_streams.
  std::shared_ptr<anthropic_state> anthropic;
  // A Responses API response (router/openai/responses_api.hpp, enable_responses): the same, in that
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

// format_error(const api_error&), {"error": {...}}: router/base/api_error.hpp.
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

// ---- Tokenizer endpoints (vLLM's shapes) --------------------------------------------------------

// {"count", "max_model_len", "tokens", "token_strs"?}; `token_strs` is left out when empty.
std::string format_tokenize(const std::vector<int32_t>& ids, uint32_t max_model_len,
                            const std::vector<std::string>& token_strs);

// {"prompt": text} (vLLM), with llama-server's "content" holding the same text.
std::string format_detokenize(std::string_view text);

}  // namespace sy::router
