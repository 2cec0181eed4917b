// A finished generation as the response cache stores it, and its binary encoding.
//
// The response is kept as the pieces of text a live stream sent, so a hit on a `stream: true`
// request can be replayed as SSE chunks of the same shape; a non-streaming hit concatenates them.
//
// Encoding (version 3, all integers little-endian):
//   "SYRC" u8 version=3 | u8 endpoint | str model | u32 prompt_tokens | u32 completion_tokens |
//   u32 cached_tokens | u32 reasoning_tokens | f64 generation_s (IEEE bits) | i64 created_unix_s |
//   u32 n_choices { u32 n_deltas { str delta }* | str finish_reason | str logprobs_json | str stop }* |
//   u64 FNV-1a-64 of every preceding byte
// where str = u32 length + bytes, and a finish_reason is stored as its name (common/finish_reason:
// "stop", "length", ...; "" for none). decode() accepts exactly this (no trailing bytes) and
// returns nullopt for anything else — truncated, garbage, bit-flipped, another version, a finish
// reason this build does not know — never throws and never allocates more than the input could
// describe. Earlier versions are still read, with the fields they lack at their defaults:
// version 2 (no choice's stop string: empty) and version 1 (also no reasoning_tokens: 0).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/finish_reason.hpp"

namespace sy::cache {

struct stored_response {
  uint8_t endpoint = 0;  // 0: /v1/completions, 1: /v1/chat/completions
  std::string model;
  struct choice {
    std::vector<std::string> deltas;  // text pieces as streamed, in order; concatenation = full text
    sy::finish_reason finish_reason = sy::finish_reason::none;  // none: unfinished (not storable)
    std::string logprobs_json;                                  // opaque to the cache; may be empty
    std::string stop;  // finish stop on a stop string: that string (empty: none named)
    bool operator==(const choice&) const = default;
  };
  std::vector<choice> choices;
  uint32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  // Of completion_tokens, those inside the model's thinking (router/openai/reasoning.hpp).
  uint32_t reasoning_tokens = 0;
  double generation_s = 0;     // wall time the original generation took (for "device-seconds saved")
  int64_t created_unix_s = 0;  // when the entry was made; response_cache::store stamps it when 0

  bool operator==(const stored_response&) const = default;

  std::string text(size_t choice_index) const;  // the concatenated deltas of one choice
};

// Why decode() refused its input.
enum class decode_error : uint8_t {
  malformed,              // truncated, garbage, bit-flipped, another version, trailing bytes
  unknown_finish_reason,  // well-formed, but a choice's finish reason is no name this build knows
};
inline constexpr size_t k_n_decode_errors = 2;
std::string_view name(decode_error e);

std::string encode(const stored_response& r);
// nullopt, with the reason in *why when given, for anything but an encoding as above.
std::optional<stored_response> decode(std::string_view bytes, decode_error* why = nullptr);

}  // namespace sy::cache
