// The router's one error model (docs/router.md, "Errors and Retry-After"): an api_error, built by
// make_error, answered by error_response. It lives in base/ so that every layer answers errors
// the same way — the HTTP server's own refusals (a body too large, malformed HTTP, no room to
// read a body) as much as the routes' — without including the client APIs above it. The routes
// answer through router/openai/api_errors.hpp, which adds the API family (Anthropic's shape).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "router/base/http_exchange.hpp"

namespace sy::router {

// An error as the client sees it: HTTP status + OpenAI error body
// {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}.
struct api_error {
  int status = 400;
  std::string type = "invalid_request_error";  // invalid_request_error, authentication_error,
                                               // permission_error, not_found_error,
                                               // rate_limit_error, overloaded_error, server_error,
                                               // timeout_error
  std::string code;                            // machine-readable, e.g. "invalid_type", "model_not_found"; may be empty
  std::string param;    // the offending field ("max_tokens", "messages[1].content"); may be empty
  std::string message;  // names the field and what was wrong
  // When to retry, in seconds (0: the responder's default; retry_after_seconds says which
  // statuses carry Retry-After).
  double retry_after_s = 0;
};

api_error make_error(int status, std::string type, std::string code, std::string message, std::string param = "");

// {"error": {...}} (OpenAI's shape, the router's default) — also the payload of a terminal SSE
// error event. Invalid UTF-8 in the strings becomes U+FFFD.
std::string format_error(const api_error& e);

// The Retry-After seconds of `e`, 0 for none: every 429 and 503 carries one, and so does any
// error that names retry_after_s; whole seconds, rounded up, at least 1 (1 when none is named).
int64_t retry_after_seconds(const api_error& e);

// The HTTP response for `e`: status, format_error's body, X-Request-Id (when not empty),
// WWW-Authenticate on 401, Retry-After as retry_after_seconds says.
http_response error_response(const api_error& e, std::string_view request_id);

}  // namespace sy::router
