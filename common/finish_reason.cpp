#include "common/finish_reason.hpp"

#include "common/enum_names.hpp"

namespace sy {
namespace {

constexpr std::string_view k_names[k_n_finish_reasons] = {"",         "stop",  "length",    "cancelled",
                                                          "deadline", "error", "tool_calls"};

}  // namespace

std::string_view name(finish_reason r) { return enum_name(k_names, r, "?"); }

std::optional<finish_reason> parse_finish_reason(std::string_view s) { return enum_parse<finish_reason>(k_names, s); }

}  // namespace sy
