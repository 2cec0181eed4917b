// The response cache key (docs/cache.md, "What is cached"): a SHA-256 over a canonical byte
// encoding of everything that determines a response — tenant namespace, model, endpoint, the
// prompt tokens after templating and every output-affecting sampling parameter.
//
// Key layout: "sy:v1:r:" + tenant_namespace + ":" + 64 lowercase hex digits.
// The namespace is both a readable prefix (so an operator can SCAN or drop one tenant's entries)
// and part of the hashed bytes. Tenants that share a namespace share entries; the router chooses
// the namespace (per tenant, or per opted-in tenant group).
//
// Canonical encoding (version tag "sy-response-key-v2", then the fields in declaration order,
// each sampling field as its name then its value):
// strings as u64 little-endian length + bytes; integers little-endian at their declared width;
// bools as one byte 0/1; floats by their IEEE-754 bit pattern with -0.0 mapped to 0.0 and every
// NaN mapped to one quiet NaN; vectors as u64 count + elements; stop strings in the given order.
// (v1 listed the sampling fields by hand, in another order: its entries are misses for v2
// routers and age out by their TTL.)
// Every field is encoded verbatim: the key does not know which parameters the sampler ignores
// (e.g. `seed` when !has_seed, `logprobs` when !want_logprobs). Callers that want such requests
// to share an entry normalise those fields first; a caller that does not merely gets extra misses,
// never a wrong hit.
//
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/sampling_params.hpp"
#include "common/sha256.hpp"

namespace sy::cache {

struct key_input {
  std::string tenant_namespace;
  std::string model;
  uint8_t endpoint = 0;                // 0: /v1/completions, 1: /v1/chat/completions
  std::vector<int32_t> prompt_tokens;  // after chat templating
  // Every field, through sampling_params' own list (visit_fields), so a sampling field added
  // there is in the key without an edit here. Stop strings keep the request's order.
  sampling_params sampling;
  int32_t n = 1;
  bool want_logprobs = false, echo = false;
  // Structured outputs (proto::wire_constraint): encoded after `stop`, and only when kind is set.
  std::string constraint_kind, constraint_schema;
  // Tool calling (tools, tool_choice, parallel_tool_calls as one canonical text; empty: none):
  // they decide how the text is returned (content or tool_calls), so they split the key even
  // where the prompt and the constraint are the same. Encoded last, and only when set.
  std::string tools;
};

// "sy:v1:r:<tenant_namespace>:<sha256 hex>".
std::string make_key(const key_input& in);

// Lowercase hex SHA-256 of the model and the prompt tokens only (nothing tenant- or
// parameter-specific): groups repeats of the same prompt for the top-K analytics.
std::string prompt_hash(const key_input& in);

// The canonical bytes make_key hashes (exposed for tests and debugging).
std::string canonical_bytes(const key_input& in);

// Lowercase hex SHA-256 (common/sha256.hpp), the digest of every key.
using sy::sha256_hex;

}  // namespace sy::cache
