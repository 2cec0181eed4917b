#include "common/json_text.hpp"

namespace sy {

void append_json_escaped(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (const auto u = static_cast<unsigned char>(c); u < 0x20) {
          out.append("\\u00").append(1, hex[u >> 4]).append(1, hex[u & 15]);
        } else {
          out += c;
        }
    }
  }
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  append_json_escaped(out, s);
  return out + "\"";
}

}  // namespace sy
