// UTF-8 repair as the router's JSON and the streaming decoder apply it (common/utf8.hpp): each
// maximal ill-formed subpart becomes one U+FFFD, the Unicode Standard's recommended practice
// (Unicode 15, section 3.9, table 3-8 is the first case below).
#include <catch2/catch.hpp>
#include <string>

#include "common/utf8.hpp"

using sy::text::append_valid_utf8;
using sy::text::valid_utf8;

namespace {
const std::string r = "\xEF\xBF\xBD";  // U+FFFD
}

TEST_CASE("utf8: each maximal ill-formed subpart becomes one U+FFFD") {
  CHECK(valid_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64") ==
        "a" + r + r + r + "b" + r + "c" + r + r + "d");
  CHECK(valid_utf8("\xED\xA0\x80") == r + r + r);          // a surrogate: no prefix of it is well formed
  CHECK(valid_utf8("\xC0\xAF") == r + r);                  // an overlong form
  CHECK(valid_utf8("\xF4\x90\x80\x80") == r + r + r + r);  // above U+10FFFF
  CHECK(valid_utf8("h\xC3\xA9llo \xF0\x9F\x9A\x80") == "h\xC3\xA9llo \xF0\x9F\x9A\x80");  // valid: unchanged
}

TEST_CASE("utf8: a truncated tail is held back for the next bytes only when asked") {
  std::string out;
  CHECK(append_valid_utf8("a\xE2\x82", out, /*hold_tail=*/true) == 1);
  CHECK(out == "a");
  out.clear();
  CHECK(append_valid_utf8("a\xE2\x82", out, /*hold_tail=*/false) == 3);
  CHECK(out == "a" + r);
  out.clear();
  CHECK(append_valid_utf8("a\xE2\x82\xAC", out, /*hold_tail=*/true) == 4);  // completed: U+20AC
  CHECK(out == "a\xE2\x82\xAC");
}
