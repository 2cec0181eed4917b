// How an error reaches a client (docs/router.md, "Errors and Retry-After"): one api_error, one
// responder. The body is formatted by the request's API family (OpenAI's {"error": {...}} or
// Anthropic's {"type":"error","error":{...}}); the status, X-Request-Id, WWW-Authenticate and
// Retry-After headers are the same for every family.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "router/base/http_exchange.hpp"
#include "router/openai/openai_request.hpp"

namespace sy::router {

// Which API's shapes a route answers errors in (the /v1/messages routes: Anthropic's).
enum class api_family : uint8_t { openai, anthropic };

api_error make_error(int status, std::string type, std::string code, std::string message, std::string param = "");

// The error body in `family`'s shape.
std::string format_error(api_family family, const api_error& e);

// The Retry-After seconds of `e`, 0 for none: every 429 and 503 carries one, and so does any
// error that names retry_after_s; whole seconds, rounded up, at least 1 (1 when none is named).
int64_t retry_after_seconds(const api_error& e);

// The HTTP response for `e`: status, the family's body, X-Request-Id (when not empty),
// WWW-Authenticate on 401, Retry-After as retry_after_seconds says.
http_response error_response(const api_error& e, api_family family, std::string_view request_id);

}  // namespace sy::router
