// Fuzzes the OpenAI request parser (router/openai/openai_request.hpp), the first code a client's body
// reaches: /v1/chat/completions and /v1/completions (response_format's schema compiled by
// common/structured/json_schema included), /tokenize and /detokenize. The first byte picks the parser, the
// rest is the body. Parsing must never throw or crash; a refusal must be a 4xx whose error body
// formats.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <variant>

#include "router/openai/openai_request.hpp"
#include "router/openai/openai_response.hpp"

namespace router = sy::router;

namespace {

// A refusal is the client's fault: a 4xx with a code, formatted into an error body.
void check_refusal(const router::api_error& e) {
  if (e.status < 400 || e.status > 499 || e.code.empty()) std::abort();
  if (router::format_error(e).empty()) std::abort();
}

template <class T>
void check(const std::variant<T, router::api_error>& r) {
  if (const auto* e = std::get_if<router::api_error>(&r)) check_refusal(*e);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Small limits so the fuzzer reaches every "over the limit" branch with short inputs.
  router::api_limits limits;
  limits.max_prompt_bytes = 256;
  limits.max_messages = 8;
  switch (data[0] % 4) {
    case 0:
      check(router::parse_generation_request(router::endpoint::chat_completions, body, limits));
      break;
    case 1:
      check(router::parse_generation_request(router::endpoint::completions, body, limits));
      break;
    case 2:
      check(router::parse_tokenize_request(body, limits));
      break;
    default:
      check(router::parse_detokenize_request(body, limits));
      break;
  }
  return 0;
}
