// JSON string text for the parts that build JSON without a JSON library (sy_common and the HTTP
// server have none): the one escaper. `"` and `\` are escaped, \n \r \t \b \f by their short
// names, other control characters as \u00XX; everything else, UTF-8 included, is written as is.
#pragma once

#include <string>
#include <string_view>

namespace sy {

// Appends `s` escaped for the inside of a JSON string literal (no quotes).
void append_json_escaped(std::string& out, std::string_view s);
// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);

}  // namespace sy
