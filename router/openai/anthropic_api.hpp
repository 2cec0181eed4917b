// The Anthropic Messages API at the edge (docs/router.md, "Anthropic Messages API"): a
// /v1/messages body is translated into the native chat request /v1/chat/completions makes (so
// both share validation, the chat template, admission, queues and the cache), and an answer is
// formatted as an Anthropic message, or as its SSE event sequence, from the same internal events
// the OpenAI formatting takes (openai_response.hpp's format_* pass a response_meta whose `anthropic`
// is set here).
//
// Pure functions, no I/O. The one state, anthropic_state, is a response's stream position
// (blocks opened, stop reason): formatted in order on one thread, one per listener's meta.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "router/openai/openai_request.hpp"
#include "router/openai/openai_response.hpp"
#include "router/openai/tool_calls.hpp"

namespace sy::router {

// Parses a /v1/messages (or, with `count_only`, a /v1/messages/count_tokens) body into the
// native chat request. Errors are the api_errors the OpenAI parser gives (400 naming the field),
// with Anthropic's names for the fields that differ (stop_sequences, tools[i].input_schema).
// count_only: max_tokens is not required (nor read).
std::variant<generation_request, api_error> parse_anthropic_request(std::string_view body, const api_limits& limits,
                                                                    bool count_only = false);

// A response's Anthropic side: what message_start and message_delta say, and the stream's state.
struct anthropic_state {
  uint32_t input_tokens = 0;
  std::vector<std::string> stop_sequences;
  std::optional<tool_call_stream> tools;  // set when tools are offered (meta.tools)
  bool constrained = false;               // decoded under a grammar (a schema, an enforced tool)
  // Set by the dispatcher when the choice ends with "stop": whether its last token was an
  // end-of-generation token (the end of the turn) or not (a stop string, or a grammar's end).
  // Unknown for an answer replayed from the cache or joined after it ended.
  std::optional<bool> ended_on_eog;
  // Set by the dispatcher (or a cache replay) when the choice ends with "stop": the stop string
  // the worker found, as the request gave it. Empty: none named (the end of the turn, a grammar's
  // end, an older worker or cache entry that does not say).
  std::string stop_matched;
  // The prompt tokens the worker's prefix cache served, when known before the stream starts (a
  // cache replay: all of them); a live stream learns them with its last frame, in message_delta.
  std::optional<uint32_t> cached_tokens;
  // Stream position.
  bool started = false;           // message_start sent
  int32_t open_block = -1;        // index of the content block open, -1: none
  bool open_is_text = false;      // the open block is a text block (else tool_use or thinking)
  bool open_is_thinking = false;  // the open block is a thinking block (the model's reasoning)
  int32_t next_block = 0;
  bool called = false;      // a tool_use block went out
  std::string stop_reason;  // set by the choice's last chunk
  std::string stop_sequence;
};

// Marks `meta` as an Anthropic response: `input_tokens` for message_start, the request's stop
// sequences, and the tool-call stream when `meta.tools` is set (call enable_tool_calls first).
void enable_anthropic(response_meta& meta, const generation_request& g, uint32_t input_tokens);

// "end_turn", "max_tokens", "stop_sequence" or "tool_use" for a choice's finish reason. The
// worker reports one reason, "stop", for the end of turn and for a stop string, and names the
// stop string it found (stop_matched): stop_sequence, naming it. Where none is named (a cache
// entry or worker from before), a request that gave stop_sequences and stopped on a token that
// does not end the turn (ended_on_eog false, or unknown) is reported as stop_sequence, naming its
// first sequence, unless it was decoded under a grammar (docs/router.md, "Anthropic Messages API").
std::string anthropic_stop_reason(const anthropic_state& st, sy::finish_reason finish, bool called);

// The formatting openai_response.cpp's functions hand over to when meta.anthropic is set. Each
// stream function returns SSE events with their own `event:` lines (http_exchange::send_event
// writes an event that starts with "event: " as it is); several may be joined by a blank line.
std::string anthropic_response(const response_meta& meta, const std::vector<choice_result>& choices,
                               const usage_info& usage);
// `thinking`: the piece's reasoning (meta.reasoning), streamed as a `thinking` block's
// thinking_delta before the text; the block ends with a signature_delta (empty: nothing signs it).
std::string anthropic_chunk(const response_meta& meta, std::string_view text, sy::finish_reason finish,
                            std::string_view thinking = {});
std::string anthropic_stream_end(const response_meta& meta, const usage_info& usage);
// {"type":"error","error":{"type","message"}}: the body of an error response.
std::string anthropic_error(const api_error& e);
// The same as a stream's `error` event.
std::string anthropic_error_event(const api_error& e);

// POST /v1/messages/count_tokens: {"input_tokens": n}.
std::string format_anthropic_count(size_t input_tokens);

}  // namespace sy::router
