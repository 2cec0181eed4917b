// How an error reaches a client (docs/router.md, "Errors and Retry-After"): one api_error, one
// responder (router/base/api_error.hpp). Here the body is formatted by the request's API family
// (OpenAI's {"error": {...}} or Anthropic's {"type":"error","error":{...}}); the status,
// X-Request-Id, WWW-Authenticate and Retry-After headers are the same for every family.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "router/base/api_error.hpp"
#include "router/base/http_exchange.hpp"
#include "router/openai/openai_request.hpp"

namespace sy::router {

// Which API's shapes a route answers errors in (the /v1/messages routes: Anthropic's).
enum class api_family : uint8_t { openai, anthropic };

// The error body in `family`'s shape.
std::string format_error(api_family family, const api_error& e);

// The HTTP response for `e` (router/base/api_error.hpp's error_response) with the family's body.
http_response error_response(const api_error& e, api_family family, std::string_view request_id);

}  // namespace sy::router
