#include "router/base/api_error.hpp"

#include <algorithm>
#include <cmath>

#include "common/json_text.hpp"
#include "common/utf8.hpp"

namespace sy::router {
namespace {

// A JSON string literal of `s`, or null when it is empty and `empty_is_null`.
void append_string(std::string& out, std::string_view s, bool empty_is_null = false) {
  if (empty_is_null && s.empty()) {
    out += "null";
    return;
  }
  out += '"';
  if (text::utf8_valid(s)) {
    append_json_escaped(out, s);
  } else {
    append_json_escaped(out, text::utf8_sanitize(s));
  }
  out += '"';
}

}  // namespace

api_error make_error(int status, std::string type, std::string code, std::string message, std::string param) {
  api_error e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

std::string format_error(const api_error& e) {
  std::string out = R"({"error":{"message":)";
  append_string(out, e.message);
  out += R"(,"type":)";
  append_string(out, e.type);
  out += R"(,"param":)";
  append_string(out, e.param, true);
  out += R"(,"code":)";
  append_string(out, e.code, true);
  out += "}}";
  return out;
}

int64_t retry_after_seconds(const api_error& e) {
  const bool retryable = e.status == 429 || e.status == 503;
  if (!(e.retry_after_s > 0)) return retryable ? 1 : 0;  // also NaN
  return static_cast<int64_t>(std::clamp(std::ceil(e.retry_after_s - 1e-6), 1.0, 1e9));
}

http_response error_response(const api_error& e, std::string_view request_id) {
  http_response r;
  r.status = e.status;
  r.body = format_error(e);
  if (!request_id.empty()) r.headers.emplace_back("X-Request-Id", std::string(request_id));
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  if (const int64_t s = retry_after_seconds(e)) r.headers.emplace_back("Retry-After", std::to_string(s));
  return r;
}

}  // namespace sy::router
