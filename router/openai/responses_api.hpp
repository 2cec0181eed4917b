// The OpenAI Responses API at the edge (docs/router.md, "Responses API"): a /v1/responses body
// is translated into the native chat request /v1/chat/completions makes (so both share
// validation, the chat template, admission, queues, structured outputs, tool calls and the
// reasoning split), and an answer is formatted as a `response` object, or as its SSE event
// sequence, from the same internal events the OpenAI formatting takes (openai_response.hpp's format_*
// pass a response_meta whose `responses` is set here).
//
// Parsing is in two steps because a follow-up's conversation lives in the response store:
// parse_responses_request validates the body alone; responses_generation then builds the chat
// request from the stored conversation (`history`, possibly empty) and this request's input.
//
// Pure functions, no I/O. The one state, responses_state, is a response's stream position and
// the output it built: formatted in order on one thread, one per listener's meta.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "router/openai/openai_request.hpp"
#include "router/openai/openai_response.hpp"
#include "router/openai/tool_calls.hpp"

namespace sy::router {

// A validated /v1/responses body, before its conversation is known.
struct responses_request {
  std::string model;
  std::string previous_response_id;  // empty: none
  bool store = true;                 // the API's default
  bool stream = false;
  // This request's input as a JSON array of items in their stored form: {"type":"message","role",
  // "content":[{"type":"input_text"|"output_text","text"}]}, {"type":"function_call","call_id",
  // "name","arguments"}, {"type":"function_call_output","call_id","output"}. Reasoning items given
  // back as input are dropped (the chat templates drop past thinking too).
  std::string input_items;
  std::string instructions;  // a first system message when non-empty
  // The chat request's fields other than `messages` (a JSON object), ready for the OpenAI parser.
  std::string chat_fields;
  // The request's parameters as a response object echoes them (a JSON object): instructions,
  // max_output_tokens, metadata, parallel_tool_calls, previous_response_id, store, temperature,
  // text, tool_choice, tools, top_p, truncation, user, reasoning.
  std::string echo;
};

// Validates a body. 400 naming the field for what is malformed and for what this router does
// not do (built-in tools, background, include, conversation, prompt, reasoning.effort, ...).
std::variant<responses_request, api_error> parse_responses_request(std::string_view body, const api_limits& limits);

// The conversation a follow-up continues, from a stored record (responses_record): the record's
// conversation followed by its response's output items, as a JSON array of items. nullopt when
// the record does not read (then it is treated as not found).
std::optional<std::string> responses_history(std::string_view record);
// The response object inside a stored record (GET /v1/responses/{id}); nullopt as above.
std::optional<std::string> responses_stored_response(std::string_view record);

// The native chat request: `instructions`, then the items of `history` (a JSON array, "" or
// "[]" for none) and of the input, as chat messages. Errors are the OpenAI parser's, with the
// Responses API's field names (input, max_output_tokens, text.format, tools[i].parameters).
std::variant<generation_request, api_error> responses_generation(const responses_request& r, std::string_view history,
                                                                 const api_limits& limits);

// "resp_" + 32 random hex digits.
std::string new_response_id();

// One output item as it is built (a stream's, or a whole response's).
struct responses_item {
  enum class kind : uint8_t { message, function_call, reasoning };
  kind type = kind::message;
  std::string id;
  std::string text;           // message: its output_text; reasoning: its reasoning_text; call: the arguments
  std::string name, call_id;  // function_call
  // message, with include "message.output_text.logprobs": its output_text's logprobs (every
  // generated token's, the thinking's included, as on the chat route).
  std::vector<token_logprobs> logprobs;
  bool done = false;
};

// A response's Responses-API side: what it echoes, what it keeps, and the stream's state.
struct responses_state {
  int64_t created_at = 0;
  std::string echo;                       // responses_request::echo
  std::string conversation;               // history + this input (a JSON array): stored with the response
  bool store = false;                     // the response is to be stored (the router has a store)
  std::optional<tool_call_stream> tools;  // set when tools are offered (meta.tools)
  // Stream position.
  uint32_t sequence = 0;  // the next event's sequence_number
  bool started = false;   // response.created and response.in_progress sent
  std::vector<responses_item> items;
  int32_t open = -1;                                   // index of the item open, -1: none
  sy::finish_reason finish = sy::finish_reason::none;  // the choice's, set by its last chunk
  std::vector<token_logprobs> pending_logprobs;        // received before the message item's next delta
  // The finished response object, set when the whole response or its last stream event is
  // formatted: what the store keeps (responses_record).
  std::string final_response;
};

// Marks `meta` as a Responses API response (call enable_tool_calls and enable_reasoning first):
// meta.id must be the response id.
void enable_responses(response_meta& meta, const responses_request& r, std::string_view history, bool store);

// The formatting openai_response.cpp's functions hand over to when meta.responses is set. Stream
// functions return SSE events with their own `event:` lines, a blank line apart.
std::string responses_response(const response_meta& meta, const std::vector<choice_result>& choices,
                               const usage_info& usage);
std::string responses_chunk(const response_meta& meta, std::string_view text, sy::finish_reason finish,
                            std::string_view thinking = {}, const std::vector<token_logprobs>& logprobs = {});
std::string responses_stream_end(const response_meta& meta, const usage_info& usage);
// A stream's terminal error: an `error` event, then response.failed.
std::string responses_error_event(const response_meta& meta, const api_error& e);

// What the store keeps of a finished response: {"response": <the response object>,
// "conversation": <history + input items>}.
std::string responses_record(const responses_state& st);

// GET /v1/responses/{id}/input_items: the record's conversation (the earlier turns' items too)
// as {"object": "list", "data", "first_id", "last_id", "has_more"}, each item with an id made
// of the response's and its place; `desc` (the API's default order) newest first; at most
// `limit` items after the one whose id is `after` (empty: from the start). nullopt when the
// record does not read.
std::optional<std::string> format_input_items(std::string_view record, std::string_view response_id, bool desc,
                                              size_t limit, std::string_view after);

// DELETE /v1/responses/{id}: {"id", "object": "response.deleted", "deleted": true}.
std::string format_responses_deleted(std::string_view id);

}  // namespace sy::router
