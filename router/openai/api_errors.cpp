#include "router/openai/api_errors.hpp"

#include <algorithm>
#include <cmath>

#include "router/openai/anthropic_api.hpp"

namespace sy::router {

api_error make_error(int status, std::string type, std::string code, std::string message, std::string param) {
  api_error e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

std::string format_error(api_family family, const api_error& e) {
  return family == api_family::anthropic ? anthropic_error(e) : format_error(e);
}

int64_t retry_after_seconds(const api_error& e) {
  const bool retryable = e.status == 429 || e.status == 503;
  if (!(e.retry_after_s > 0)) return retryable ? 1 : 0;  // also NaN
  return static_cast<int64_t>(std::clamp(std::ceil(e.retry_after_s - 1e-6), 1.0, 1e9));
}

http_response error_response(const api_error& e, api_family family, std::string_view request_id) {
  http_response r;
  r.status = e.status;
  r.body = format_error(family, e);
  if (!request_id.empty()) r.headers.emplace_back("X-Request-Id", std::string(request_id));
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  if (const int64_t s = retry_after_seconds(e)) r.headers.emplace_back("Retry-After", std::to_string(s));
  return r;
}

}  // namespace sy::router
