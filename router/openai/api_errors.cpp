#include "router/openai/api_errors.hpp"

#include "router/openai/anthropic_api.hpp"

namespace sy::router {

std::string format_error(api_family family, const api_error& e) {
  return family == api_family::anthropic ? anthropic_error(e) : format_error(e);
}

http_response error_response(const api_error& e, api_family family, std::string_view request_id) {
  http_response r = error_response(e, request_id);
  if (family != api_family::openai) r.body = format_error(family, e);
  return r;
}

}  // namespace sy::router
