// Percent-escaping of the names (tenants, models) that go into separated Redis keys and hash
// fields: "sy:v1:resp:<tenant>:<id>" (':'), "<event>|<tenant>|<model>" ('|'). '%' and the
// separator become "%XX" (two upper-case hex digits) and every other byte is kept, so a name can
// never split its key and two names never share an escaped form.
#pragma once

#include <string>
#include <string_view>

namespace sy::cache {

// `s` with '%' written as "%25" and `separator` as its "%XX" (':' -> "%3A", '|' -> "%7C").
std::string percent_escape(std::string_view s, char separator);

// The inverse, whatever the separator: each '%' followed by two hex digits becomes that byte; a
// '%' without them is kept as it is.
std::string percent_unescape(std::string_view s);

}  // namespace sy::cache
