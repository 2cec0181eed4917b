// The one percent-escape of names in separated Redis keys and hash fields
// (cache/percent_escape.hpp): the exact bytes existing keys hold, and the round trip.
#include "cache/percent_escape.hpp"

#include <catch2/catch.hpp>

#include <initializer_list>
#include <string>

using sy::cache::percent_escape;
using sy::cache::percent_unescape;

TEST_CASE("percent_escape writes '%' and the separator as upper-case %XX", "[percent_escape]") {
  // The forms stored keys already use: responses ("sy:v1:resp:<tenant>:<id>") and analytics
  // fields ("<event>|<tenant>|<model>").
  CHECK(percent_escape("a:b%", ':') == "a%3Ab%25");
  CHECK(percent_escape("glo|bex%", '|') == "glo%7Cbex%25");
  // Only the given separator is escaped; every other byte, UTF-8 and NUL included, is kept.
  CHECK(percent_escape("a|b:c", ':') == "a|b%3Ac");
  CHECK(percent_escape("a|b:c", '|') == "a%7Cb:c");
  const std::string odd("t\0\xc3\xa9 x", 6);
  CHECK(percent_escape(odd, ':') == odd);
  CHECK(percent_escape("", ':').empty());
  CHECK(percent_escape("%%", '|') == "%25%25");
  CHECK(percent_escape("\x7f", '\x7f') == "%7F");
}

TEST_CASE("percent_unescape inverts percent_escape for any separator", "[percent_escape]") {
  for (const char sep : {':', '|', '/'})
    for (const std::string& s :
         std::initializer_list<std::string>{"", "plain", "a:b|c%d", "%25", "%%:|", "100%", std::string("\0:%", 3)}) {
      INFO("separator " << sep << ", name " << s);
      const std::string escaped = percent_escape(s, sep);
      CHECK(escaped.find(sep) == std::string::npos);
      CHECK(percent_unescape(escaped) == s);
    }
  // A '%' without two hex digits after it is kept as it is.
  CHECK(percent_unescape("100%") == "100%");
  CHECK(percent_unescape("%zz%4") == "%zz%4");
  CHECK(percent_unescape("%7c") == "|");
}
