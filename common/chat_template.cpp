// ChatML rendering, recognised from the model's Jinja source rather than by running Jinja.
#include "common/chat_template.hpp"

#include "common/gguf.hpp"

#include <stdexcept>

namespace sy {

namespace {

constexpr std::string_view k_im_start = "<|im_start|>";
constexpr std::string_view k_im_end = "<|im_end|>";

// Undoes the escapes a Jinja string literal may use (\n, \t, \\, \', \").
std::string unescape_jinja(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      default:
        out += e;
        break;  // \\, \', \" and anything else: the character itself
    }
  }
  return out;
}

// The fixed system prompt a ChatML template writes as one string literal, e.g.
//   '<|im_start|>system\nYou are a helpful AI assistant ...<|im_end|>\n'
// which templates emit when the conversation does not start with a system message. A system
// header built from an expression ('<|im_start|>system\n' + messages[0]['content']) does not
// count: its text up to <|im_end|> leaves the literal. Empty when there is none.
std::string find_default_system(std::string_view src) {
  const std::string_view header = "<|im_start|>system";
  for (size_t at = src.find(header); at != std::string_view::npos; at = src.find(header, at + 1)) {
    if (at == 0) continue;
    const char quote = src[at - 1];
    if (quote != '\'' && quote != '"') continue;
    size_t body = at + header.size();
    if (src.substr(body, 2) == "\\n") {
      body += 2;
    } else if (src.substr(body, 1) == "\n") {
      body += 1;
    } else {
      continue;
    }
    const size_t end = src.find(k_im_end, body);
    if (end == std::string_view::npos) continue;
    const std::string_view text = src.substr(body, end - body);
    // The literal must run unbroken to <|im_end|>: no closing quote (an unescaped one) and no
    // Jinja syntax inside.
    bool literal = text.find("{{") == std::string_view::npos && text.find("{%") == std::string_view::npos;
    for (size_t i = 0; literal && i < text.size(); ++i) {
      if (text[i] == '\\') {
        ++i;
      } else if (text[i] == quote) {
        literal = false;
      }
    }
    if (literal && !text.empty()) return unescape_jinja(text);
  }
  return {};
}

}  // namespace

chat_template chat_template::from_jinja(std::string_view jinja_source) {
  if (jinja_source.find(k_im_start) == std::string_view::npos) {
    throw std::runtime_error("unsupported chat template");
  }
  chat_template t;
  t.format = chat_format::chatml;
  t.default_system = find_default_system(jinja_source);
  return t;
}

chat_template chat_template::from_gguf(const gguf::file& f) {
  return from_jinja(f.get_string("tokenizer.chat_template"));
}

std::string chat_template::apply(const std::vector<chat_message>& messages, bool add_generation_prompt) const {
  std::string out;
  auto turn = [&](std::string_view role, std::string_view content) {
    out.append(k_im_start).append(role).append("\n").append(content).append(k_im_end).append("\n");
  };
  // Like the SmolLM2 template, the default goes in front of the first message only, so an
  // empty conversation gets none.
  if (!messages.empty() && messages.front().role != "system" && !default_system.empty()) {
    turn("system", default_system);
  }
  for (const chat_message& m : messages) turn(m.role, m.content);
  if (add_generation_prompt) out.append(k_im_start).append("assistant\n");
  return out;
}

}  // namespace sy
