// Parts of the JSON Schema compiler (common/structured/json_schema.cpp) that each have their own file: string
// `pattern`/`format` (json_schema_strings.cpp), integer ranges (json_schema_numbers.cpp) and
// property keys (json_schema_keys.cpp).
// Internal to sy_json_schema; every failure throws json_schema_error naming the keyword's path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/structured/grammar.hpp"
#include "common/structured/json_schema.hpp"

namespace sy::json_schema_parts {

// The one form of a refusal: "json_schema at PATH: WHAT".
[[noreturn]] void fail(const std::string& path, const std::string& what);

// The content of a JSON string (between the quotes, JSON-escaped) whose value matches `pattern`
// as a whole (see json_schema_strings.cpp for the regex subset). `min_len`/`max_len` (-1: none) are
// the schema's minLength/maxLength: accepted only when every match already has such a length.
grammar::sequence string_pattern(grammar::grammar& g, std::string_view pattern, const std::string& path, int min_len,
                                 int max_len, const json_schema_limits& limits);
// Likewise for a string `format` (date, time, date-time, uuid, email, hostname, ipv4, ipv6).
grammar::sequence string_format(grammar::grammar& g, std::string_view format, const std::string& path, int min_len,
                                int max_len, const json_schema_limits& limits);

// Decimal integers in [lo, hi] (absent: the 16-digit bound the plain integer rule has), no
// leading zeros, no "-0". `lo > hi` is refused at `path`.
inline constexpr int64_t k_max_integer = 9999999999999999;  // 16 digits
grammar::element integer_range(grammar::grammar& g, std::optional<int64_t> lo, std::optional<int64_t> hi,
                               const std::string& path);

// One shape of an unescaped character of a JSON string: a lead byte from `lead`, then one byte
// from each of `rest` (ASCII but `"` and `\`, and well-formed multi-byte UTF-8, RFC 3629).
struct utf8_shape {
  grammar::byte_set lead;
  std::vector<grammar::byte_set> rest;
};
const std::vector<utf8_shape>& unescaped_char_shapes();

// The key of an additional property, quotes included: a JSON string whose value is none of `names`
// (the listed properties). `chr`: the rule of one character of a JSON string.
grammar::element key_except(grammar::grammar& g, const std::vector<std::string>& names, grammar::element chr,
                            const std::string& path);

}  // namespace sy::json_schema_parts
