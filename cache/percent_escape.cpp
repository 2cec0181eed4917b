#include "cache/percent_escape.hpp"

#include <charconv>

namespace sy::cache {

std::string percent_escape(std::string_view s, char separator) {
  constexpr char k_hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    if (c == '%' || c == separator) {
      const auto b = static_cast<unsigned char>(c);
      out += '%';
      out += k_hex[b >> 4];
      out += k_hex[b & 0xf];
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string percent_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      unsigned v = 0;
      auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
      if (ec == std::errc() && p == s.data() + i + 3) {
        out.push_back(static_cast<char>(v));
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace sy::cache
