#include "router/base/http_exchange.hpp"

namespace sy::router {

std::string_view http_request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

}  // namespace sy::router
