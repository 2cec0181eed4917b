#include "common/error_code.hpp"

#include "common/enum_names.hpp"

namespace sy {
namespace {

constexpr std::string_view k_names[k_n_error_codes] = {
    "other",      "bad_message",    "duplicate_request",   "unknown_version",         "invalid_request",
    "overloaded", "internal_error", "exceeds_kv_capacity", "embeddings_not_supported"};

}  // namespace

std::string_view name(error_code c) { return enum_name(k_names, c, k_names[0]); }

error_code parse_error_code(std::string_view s) {
  return enum_parse<error_code>(k_names, s).value_or(error_code::other);
}

}  // namespace sy
