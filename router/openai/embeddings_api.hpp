// POST /v1/embeddings (docs/router.md, "Embeddings API"), at the edge like the rest of the
// OpenAI API (docs/engineering.md, "Parse at the edge"): the request body parsed and checked into
// an embedding_request, and the response body formatted here. Past this file the router handles
// token ids (routed_request::embed) and the worker's float vectors (proto::embeddings).
//
// Pure functions, no I/O, no state: callable from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "router/openai/openai_request.hpp"

namespace sy::router {

// Inputs per request at most (OpenAI's limit; proto::k_max_embed_inputs on the wire).
inline constexpr size_t k_max_embedding_inputs = 2048;

// A validated /v1/embeddings request.
struct embedding_request {
  std::string model;  // required, non-empty
  // `input`: a string, an array of strings, an array of token ids, or an array of arrays of
  // token ids. Exactly one of texts / token_inputs is filled, with 1..k_max_embedding_inputs
  // entries, none empty.
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> token_inputs;
  bool base64 = false;      // encoding_format "base64" (little-endian float32 bytes), else "float"
  uint32_t dimensions = 0;  // 0: not given; else >= 1 (the worker checks it is the model's size)
  // As for generations: lower is more urgent; seconds until the deadline; seconds it may wait in
  // the router's queue.
  std::optional<int32_t> priority;
  std::optional<double> timeout_s;
  std::optional<double> queue_timeout_s;
  std::string user;  // informational, ignored

  size_t n_inputs() const { return texts.empty() ? token_inputs.size() : texts.size(); }
};

// Parses and validates a body. Errors (OpenAI's shape, status 400): malformed JSON or not an
// object -> "invalid_json"; a field of the wrong type -> "invalid_type"; an empty input, an empty
// string in the list, more than k_max_embedding_inputs inputs, an unknown encoding_format or a
// dimensions below 1 -> "invalid_value"; no model or input -> "missing_required_parameter".
std::variant<embedding_request, api_error> parse_embedding_request(std::string_view body, const api_limits& limits);

// {"object":"list","data":[{"object":"embedding","index":i,"embedding":[...] | "<base64>"}],
//  "model":...,"usage":{"prompt_tokens":N,"total_tokens":N}}. Floats are written in their
// shortest form that reads back as the same float.
std::string format_embeddings(std::string_view model, const std::vector<std::vector<float>>& data, bool base64,
                              uint32_t prompt_tokens);

// The little-endian float32 bytes of `v`, base64-encoded (RFC 4648, with padding).
std::string base64_floats(std::span<const float> v);

}  // namespace sy::router
