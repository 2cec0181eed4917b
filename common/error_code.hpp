// Why a request (or a message) was refused or failed, declared once for the engine, the wire and
// the router. Text appears only on the wire (the `error` message, common/wire/protocol) and in the
// router's OpenAI error bodies, through name() / parse_error_code().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sy {

enum class error_code : uint8_t {
  other,              // a code this build does not know (sent by a newer peer): a worker fault
  bad_message,        // a message that could not be decoded, or is not accepted by its receiver
  duplicate_request,  // the request id is already live on that worker
  unknown_version,    // hello/welcome of another protocol version
  invalid_request,    // the request is malformed or out of range: the client's fault
  overloaded,         // the worker accepts nothing new (draining)
  // The worker failed while running the request (its step threw: a device error, an
  // allocation); the worker goes on serving others.
  internal_error,
  // The engine's: prompt + max_tokens needs more KV blocks than the worker has. The worker
  // reports it to routers as invalid_request (it cannot fit there, whatever the load).
  exceeds_kv_capacity,
  // An embed to a worker not started with --embeddings (the router answers 501).
  embeddings_not_supported,
};
inline constexpr size_t k_n_error_codes = 9;

// The enumerator's name: the wire spelling.
std::string_view name(error_code c);
// Inverse of name() (exact match); error_code::other for anything else.
error_code parse_error_code(std::string_view s);

}  // namespace sy
