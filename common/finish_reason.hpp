// Why a request (or one choice of it) ended, declared once for the engine, the wire, the router
// and its metrics. Text appears only where it leaves the process: the tokens message
// (common/wire/protocol), OpenAI JSON (router/openai/openai_response), metric labels and the cache's stored
// responses, each through name() / parse_finish_reason().
//
// To add a reason: append it before k_n_finish_reasons' end and give it a name below; a peer
// that does not know the name refuses the tokens message carrying it (invalid_field), so a new
// reason a worker sends needs routers that know it first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sy {

enum class finish_reason : uint8_t {
  none,        // not finished ("" on the wire, null in JSON)
  stop,        // EOS or a stop string
  length,      // max_tokens output tokens generated
  cancelled,   // the client went away, or the engine was told to stop it
  deadline,    // its deadline passed before it completed
  error,       // the engine gave up on it
  tool_calls,  // the router read the output as tool calls (OpenAI); never sent by a worker
};
inline constexpr size_t k_n_finish_reasons = 7;

// "" for none, else the enumerator's name: the wire and JSON spelling.
std::string_view name(finish_reason r);
// Inverse of name() (exact match); nullopt for anything else.
std::optional<finish_reason> parse_finish_reason(std::string_view s);

}  // namespace sy
