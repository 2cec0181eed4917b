// Chat formats recognised from a template's Jinja source and rendered as llama.cpp renders them
// (see chat_template.hpp).
#include "common/tokenizer/chat_template.hpp"

#include "common/gguf.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace sy {

namespace {

struct format_name {
  chat_format format;
  std::string_view name;
};

// The one table of names (llama.cpp's), in the order messages list them.
constexpr std::array<format_name, 16> k_format_names = {{
    {chat_format::chatml, "chatml"},
    {chat_format::llama3, "llama3"},
    {chat_format::llama2, "llama2"},
    {chat_format::llama2_sys, "llama2-sys"},
    {chat_format::llama2_sys_bos, "llama2-sys-bos"},
    {chat_format::llama2_sys_strip, "llama2-sys-strip"},
    {chat_format::mistral_v1, "mistral-v1"},
    {chat_format::mistral_v3, "mistral-v3"},
    {chat_format::mistral_v3_tekken, "mistral-v3-tekken"},
    {chat_format::mistral_v7, "mistral-v7"},
    {chat_format::mistral_v7_tekken, "mistral-v7-tekken"},
    {chat_format::phi3, "phi3"},
    {chat_format::phi4, "phi4"},
    {chat_format::zephyr, "zephyr"},
    {chat_format::gemma, "gemma"},
    {chat_format::deepseek3, "deepseek3"},
}};

constexpr std::string_view k_im_start = "<|im_start|>";
constexpr std::string_view k_im_end = "<|im_end|>";
constexpr std::string_view k_im_sep = "<|im_sep|>";                       // Phi-4: between the role and the content
constexpr std::string_view k_empty_thinking = "<think>\n\n</think>\n\n";  // Qwen3, enable_thinking false
constexpr std::string_view k_think_close = "</think>";
constexpr std::string_view k_ds_user = "<｜User｜>";
constexpr std::string_view k_ds_assistant = "<｜Assistant｜>";
constexpr std::string_view k_ds_end = "<｜end▁of▁sentence｜>";
constexpr std::string_view k_ds_open_thinking = "<think>\n";  // DeepSeek-R1's generation prompt ends in it
constexpr std::string_view k_think_open = "<think>";          // DeepSeek-V3.1 thinking; Qwen3 past turns
// What marks DeepSeek-V3.1's template, as llama.cpp's chat handlers (common/chat.cpp) find it.
constexpr std::string_view k_ds_v31_marker = "message['prefix'] is defined and message['prefix'] and thinking";

// ---- Recognition ---------------------------------------------------------------------------------

// What a source is, by llama.cpp's rules: one of our formats, or the name of a llama.cpp format
// we do not render (empty when llama.cpp recognises none either).
struct detected {
  chat_format format = chat_format::unsupported;
  std::string_view other;
};

detected ours(chat_format f) { return {f, {}}; }
detected theirs(std::string_view llama_cpp_name) { return {chat_format::unsupported, llama_cpp_name}; }

// llama.cpp's llm_chat_detect_template rules, in its order, as far as its DeepSeek-V3 rule: every
// earlier rule decides which of our formats a source is, including the rules for formats we do
// not render (a source with <|im_start|> and <end_of_utterance> is smolvlm, not ChatML). The rules after it
// can only name formats we do not render, so a source none of these match is left unnamed.
detected detect(std::string_view src) {
  auto has = [src](std::string_view s) { return src.find(s) != std::string_view::npos; };
  if (has("<|im_start|>")) {
    if (has(k_im_sep)) return ours(chat_format::phi4);
    if (has("<end_of_utterance>")) return theirs("smolvlm");
    return ours(chat_format::chatml);
  }
  if (src.substr(0, 7) == "mistral" || has("[INST]")) {
    if (has("[SYSTEM_PROMPT]")) return ours(chat_format::mistral_v7);
    // Mistral's official v1, v3 and v3-tekken templates.
    if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      if (has(" [INST]")) return ours(chat_format::mistral_v1);
      if (has("\"[INST]\"")) return ours(chat_format::mistral_v3_tekken);
      return ours(chat_format::mistral_v3);
    }
    if (has("content.strip()")) return ours(chat_format::llama2_sys_strip);
    if (has("bos_token + '[INST]")) return ours(chat_format::llama2_sys_bos);
    if (has("<<SYS>>")) return ours(chat_format::llama2_sys);
    return ours(chat_format::llama2);
  }
  if (has("<|assistant|>") && has("<|end|>")) return ours(chat_format::phi3);
  if (has("[gMASK]<sop>")) return theirs("chatglm4");
  if (has("<|assistant|>") && has("<|user|>")) {
    if (has("<|tool_declare|>")) return theirs("exaone-moe");
    return theirs(has("</s>") ? "falcon3" : "glmedge");
  }
  if (has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>")) return theirs("glmedge");
  if (has("<|user|>") && has("<|endoftext|>")) return ours(chat_format::zephyr);
  if (has("bos_token + message['role']")) return theirs("monarch");
  if (has("<start_of_turn>")) return ours(chat_format::gemma);
  if (has("'\\n\\nAssistant: ' + eos_token")) return theirs("orion");
  if (has("GPT4 Correct ")) return theirs("openchat");
  if (has("USER: ") && has("ASSISTANT: ")) return theirs(has("SYSTEM: ") ? "vicuna-orca" : "vicuna");
  if (has("### Instruction:") && has("<|EOT|>")) return theirs("deepseek");
  if (has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>")) return theirs("command-r");
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ours(chat_format::llama3);
  if (has("[gMASK]sop")) return theirs("chatglm3");
  if (has("<用户>")) return theirs("minicpm");
  if (has("'Assistant: ' + message['content'] + eos_token")) return theirs("deepseek2");
  if (has(k_ds_assistant) && has(k_ds_user) && has(k_ds_end)) return ours(chat_format::deepseek3);
  return theirs("");
}

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

// ---- Rendering -----------------------------------------------------------------------------------

// Without leading and trailing ASCII whitespace (C isspace: " \t\n\v\f\r"), like llama.cpp's trim.
std::string_view trim(std::string_view s) {
  constexpr std::string_view k_space = " \t\n\v\f\r";
  const size_t first = s.find_first_not_of(k_space);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(k_space) - first + 1);
}

void render_chatml(const std::vector<chat_message>& messages, std::string_view default_system, bool gen,
                   std::string& out) {
  auto turn = [&](std::string_view role, std::string_view content) {
    out.append(k_im_start).append(role).append("\n").append(content).append(k_im_end).append("\n");
  };
  // Like the SmolLM2 template, the default goes in front of the first message only, so an
  // empty conversation gets none.
  if (!messages.empty() && messages.front().role != "system" && !default_system.empty()) {
    turn("system", default_system);
  }
  for (const chat_message& m : messages) turn(m.role, m.content);
  if (gen) out.append(k_im_start).append("assistant\n");
}

// Phi-4: ChatML's markers with <|im_sep|> after the role and no newlines.
void render_phi4(const std::vector<chat_message>& messages, bool gen, std::string& out) {
  for (const chat_message& m : messages)
    out.append(k_im_start).append(m.role).append(k_im_sep).append(m.content).append(k_im_end);
  if (gen) out.append(k_im_start).append("assistant").append(k_im_sep);
}

// Python's str.lstrip('\n') / rstrip('\n'), as the thinking templates write them.
std::string_view lstrip_newlines(std::string_view s) {
  s.remove_prefix(std::min(s.size(), s.find_first_not_of('\n')));
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  const size_t last = s.find_last_not_of('\n');
  return s.substr(0, last == std::string_view::npos ? 0 : last + 1);
}

// DeepSeek-V3.1's past assistant turns (closes_past_thinking): the content after its first
// `</think>` (render_deepseek3 writes the tag in front).
std::vector<chat_message> close_past_thinking(const std::vector<chat_message>& messages) {
  std::vector<chat_message> out = messages;
  for (chat_message& m : out) {
    const size_t at = m.content.find(k_think_close);
    if (m.role == "assistant" && at != std::string::npos) m.content.erase(0, at + k_think_close.size());
  }
  return out;
}

// R1's past thinking (drops_past_thinking in deepseek3): every assistant turn keeps what follows
// its last `</think>`, `content.split('</think>')[-1]`.
std::vector<chat_message> drop_all_thinking(const std::vector<chat_message>& messages) {
  std::vector<chat_message> out = messages;
  for (chat_message& m : out) {
    const size_t at = m.content.rfind(k_think_close);
    if (m.role == "assistant" && at != std::string::npos) m.content.erase(0, at + k_think_close.size());
  }
  return out;
}

// Qwen3's past thinking (drops_past_thinking in ChatML), as its template computes it. The last
// query is the last user message that is not only a tool result (`<tool_response>...
// </tool_response>`; with none, the last message). An assistant turn with a `</think>` splits
// into its reasoning (between the last `<think>` and the first `</think>`, newlines trimmed) and
// its answer (after the last `</think>`, leading newlines dropped). Turns up to the last query
// keep the answer alone; later ones (the steps of the answer being written) are rewritten
// "<think>\nREASONING\n</think>\n\nANSWER" when they are the last message or have reasoning,
// and keep the answer alone otherwise.
std::vector<chat_message> qwen3_past_thinking(const std::vector<chat_message>& messages) {
  auto tool_result = [](std::string_view c) {
    return c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
  };
  size_t last_query = messages.empty() ? 0 : messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role == "user" && !tool_result(messages[i].content)) {
      last_query = i;
      break;
    }
  }
  std::vector<chat_message> out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].role != "assistant") continue;
    const std::string_view content = out[i].content;
    std::string_view answer = content, reasoning;
    if (const size_t close = content.find(k_think_close); close != std::string_view::npos) {
      reasoning = rstrip_newlines(content.substr(0, close));
      if (const size_t open = reasoning.rfind(k_think_open); open != std::string_view::npos)
        reasoning.remove_prefix(open + k_think_open.size());
      reasoning = lstrip_newlines(reasoning);
      answer = lstrip_newlines(content.substr(content.rfind(k_think_close) + k_think_close.size()));
    }
    if (i > last_query && (i + 1 == out.size() || !reasoning.empty())) {
      out[i].content =
          std::string("<think>\n").append(reasoning).append("\n</think>\n\n").append(lstrip_newlines(answer));
    } else {
      out[i].content = std::string(answer);
    }
  }
  return out;
}

// `turn_open`: what every assistant turn writes after <｜Assistant｜> (V3.1's `</think>`);
// `gen_suffix`: what the generation prompt writes there (R1's `<think>\n`, V3.1's `<think>` or
// `</think>`).
void render_deepseek3(const std::vector<chat_message>& messages, bool gen, std::string_view turn_open,
                      std::string_view gen_suffix, std::string& out) {
  for (const chat_message& m : messages) {
    if (m.role == "system") {
      out.append(m.content).append("\n\n");
    } else if (m.role == "user") {
      out.append(k_ds_user).append(m.content);
    } else if (m.role == "assistant") {
      out.append(k_ds_assistant).append(turn_open).append(m.content).append(k_ds_end);
    } else if (m.role.empty()) {  // verbatim (with_tools: tool results)
      out.append(m.content);
    }
  }
  if (gen) out.append(k_ds_assistant).append(gen_suffix);
}

void render_llama3(const std::vector<chat_message>& messages, bool gen, std::string& out) {
  for (const chat_message& m : messages) {
    out.append("<|start_header_id|>").append(m.role).append("<|end_header_id|>\n\n");
    out.append(trim(m.content)).append("<|eot_id|>");
  }
  if (gen) out.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// phi3 and zephyr: <|role|>\ncontent, then the end-of-turn marker.
void render_role_tags(const std::vector<chat_message>& messages, std::string_view end, bool gen, std::string& out) {
  for (const chat_message& m : messages) out.append("<|").append(m.role).append("|>\n").append(m.content).append(end);
  if (gen) out.append("<|assistant|>\n");
}

void render_gemma(const std::vector<chat_message>& messages, bool gen, std::string& out) {
  std::string system;  // system messages not yet written, trimmed and joined
  for (const chat_message& m : messages) {
    if (m.role == "system") {
      system.append(trim(m.content));
      continue;
    }
    const std::string_view role = m.role == "assistant" ? std::string_view("model") : std::string_view(m.role);
    out.append("<start_of_turn>").append(role).append("\n");
    if (!system.empty() && role != "model") {
      out.append(system).append("\n\n");
      system.clear();
    }
    out.append(trim(m.content)).append("<end_of_turn>\n");
  }
  if (gen) out.append("<start_of_turn>model\n");
}

void render_mistral_v7(const std::vector<chat_message>& messages, bool tekken, std::string& out) {
  const std::string_view space = tekken ? "" : " ";
  for (const chat_message& m : messages) {
    if (m.role.empty()) {  // verbatim (with_tools)
      out.append(m.content);
    } else if (m.role == "system") {
      out.append("[SYSTEM_PROMPT]").append(space).append(m.content).append("[/SYSTEM_PROMPT]");
    } else if (m.role == "user") {
      out.append("[INST]").append(space).append(m.content).append("[/INST]");
    } else {
      out.append(space).append(m.content).append("</s>");
    }
  }
}

// mistral-v1, -v3 and -v3-tekken: an [INST] block holds the system and user messages up to the
// next assistant message, which closes it.
void render_mistral(const std::vector<chat_message>& messages, chat_format f, std::string& out) {
  const std::string_view before = f == chat_format::mistral_v1 ? " " : "";
  const std::string_view after = f == chat_format::mistral_v3_tekken ? "" : " ";
  const bool trim_assistant = f == chat_format::mistral_v3;
  bool in_turn = false;
  for (const chat_message& m : messages) {
    if (m.role.empty()) {  // verbatim (with_tools): outside the turn it may precede
      out.append(m.content);
      continue;
    }
    if (!in_turn) {
      out.append(before).append("[INST]").append(after);
      in_turn = true;
    }
    if (m.role == "system") {
      out.append(m.content).append("\n\n");
    } else if (m.role == "user") {
      out.append(m.content).append(before).append("[/INST]");
    } else {
      out.append(after).append(trim_assistant ? trim(m.content) : std::string_view(m.content)).append("</s>");
      in_turn = false;
    }
  }
}

// llama2 and its -sys, -sys-bos and -sys-strip variants. The first [INST] is written before any
// message (so an empty conversation is "[INST] "); an assistant message closes the turn.
void render_llama2(const std::vector<chat_message>& messages, chat_format f, std::string& out) {
  const bool system_block = f != chat_format::llama2;
  const bool bos_in_history = f == chat_format::llama2_sys_bos;
  const bool strip = f == chat_format::llama2_sys_strip;
  bool in_turn = true;
  out.append("[INST] ");
  for (const chat_message& m : messages) {
    const std::string_view content = strip ? trim(m.content) : std::string_view(m.content);
    if (!in_turn) {
      in_turn = true;
      out.append(bos_in_history ? "<s>[INST] " : "[INST] ");
    }
    if (m.role == "system") {
      if (system_block) {
        out.append("<<SYS>>\n").append(content).append("\n<</SYS>>\n\n");
      } else {
        out.append(content).append("\n");
      }
    } else if (m.role == "user") {
      out.append(content).append(" [/INST]");
    } else {
      out.append(content).append("</s>");
      in_turn = false;
    }
  }
}

}  // namespace

std::string_view chat_format_name(chat_format f) {
  for (const format_name& n : k_format_names)
    if (n.format == f) return n.name;
  return {};
}

std::optional<chat_format> chat_format_from_name(std::string_view name) {
  for (const format_name& n : k_format_names)
    if (n.name == name) return n.format;
  return std::nullopt;
}

std::string chat_format_names() {
  std::string out;
  for (const format_name& n : k_format_names) out.append(out.empty() ? "" : ", ").append(n.name);
  return out;
}

chat_template chat_template::parse(std::string_view name_or_jinja) {
  chat_template t;
  if (name_or_jinja.empty()) return t;  // no template: ChatML, as llama.cpp falls back to
  if (const auto named = chat_format_from_name(name_or_jinja)) {
    t.format = *named;
    return t;
  }
  const detected d = detect(name_or_jinja);
  t.format = d.format;
  auto has = [name_or_jinja](std::string_view s) { return name_or_jinja.find(s) != std::string_view::npos; };
  if (d.format == chat_format::chatml) {
    t.default_system = find_default_system(name_or_jinja);
    t.thinking_switch = has("enable_thinking");
  }
  if (d.format == chat_format::deepseek3 && has(k_ds_v31_marker)) {
    t.thinking_switch = true;
    t.closes_past_thinking = true;
  }
  // Qwen3's, QwQ's and R1's `content.split('</think>')[-1]`; a template that only writes the tag
  // (an empty thinking block) keeps past turns as they are.
  if (d.format == chat_format::chatml || d.format == chat_format::deepseek3)
    t.drops_past_thinking = has("split('</think>')") || has("split(\"</think>\")");
  // The literal as a Jinja source writes it ('\\n'), or with the newline itself.
  if (d.format == chat_format::deepseek3)
    t.opens_thinking =
        has(std::string(k_ds_assistant) + "<think>\\n") || has(std::string(k_ds_assistant) + "<think>\n");
  if (d.format == chat_format::unsupported) {
    t.unsupported_reason = d.other.empty() ? std::string("the template matches none of the formats Switchyard renders")
                                           : "llama.cpp reads the template as its '" + std::string(d.other) +
                                                 "' format, which Switchyard does not render";
  }
  return t;
}

std::string chat_template::source_of(const gguf::file& f) {
  if (const auto* v = f.find("tokenizer.chat_template"); v && v->type == gguf::value_type::string)
    return std::string(v->str);
  const auto* arch = f.find("general.architecture");
  if (arch && arch->type == gguf::value_type::string && arch->str == "gemma3") return "gemma";
  return {};
}

chat_template chat_template::from_gguf(const gguf::file& f) { return parse(source_of(f)); }

std::string chat_template::read_option(const std::string& name_or_path) {
  if (chat_format_from_name(name_or_path)) return name_or_path;
  const std::string names = " (names: " + chat_format_names() + ")";
  std::ifstream in(name_or_path, std::ios::binary);
  if (!in) {
    throw std::invalid_argument("--chat-template '" + name_or_path +
                                "' is neither a chat format name nor a readable Jinja file" + names);
  }
  std::string source{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw std::invalid_argument("--chat-template " + name_or_path + ": cannot read the file");
  if (source.empty()) throw std::invalid_argument("--chat-template " + name_or_path + ": the file is empty");
  const chat_template t = parse(source);
  if (!t.supported()) {
    throw std::invalid_argument("--chat-template " + name_or_path + ": " + t.unsupported_reason +
                                "; pass one of the names instead" + names);
  }
  return source;
}

std::string chat_template::apply(const std::vector<chat_message>& given, bool add_generation_prompt,
                                 const std::vector<chat_tool>& tools, std::optional<bool> thinking) const {
  // Past thinking goes first, while tool results are still role "tool" (not the last user turn).
  std::vector<chat_message> stripped;
  if (drops_past_thinking)
    stripped = format == chat_format::deepseek3 ? drop_all_thinking(given) : qwen3_past_thinking(given);
  if (closes_past_thinking) stripped = close_past_thinking(drops_past_thinking ? stripped : given);
  const std::vector<chat_message>& conversation = drops_past_thinking || closes_past_thinking ? stripped : given;
  bool tool_turns = !tools.empty();
  for (const chat_message& m : conversation) tool_turns = tool_turns || m.role == "tool" || !m.tool_calls.empty();
  std::vector<chat_message> lowered;
  if (tool_turns && format != chat_format::unsupported)
    lowered = with_tools(format, default_system, conversation, tools);
  const std::vector<chat_message>& messages = tool_turns ? lowered : conversation;
  std::string out;
  switch (format) {
    case chat_format::unsupported:
      throw std::runtime_error("the chat template cannot be applied: " + unsupported_reason);
    case chat_format::chatml:
      render_chatml(messages, default_system, add_generation_prompt, out);
      if (add_generation_prompt && thinking_switch && !thinking.value_or(true)) out += k_empty_thinking;
      break;
    case chat_format::phi4:
      render_phi4(messages, add_generation_prompt, out);
      break;
    case chat_format::llama3:
      render_llama3(messages, add_generation_prompt, out);
      break;
    case chat_format::llama2:
    case chat_format::llama2_sys:
    case chat_format::llama2_sys_bos:
    case chat_format::llama2_sys_strip:
      render_llama2(messages, format, out);
      break;
    case chat_format::mistral_v1:
    case chat_format::mistral_v3:
    case chat_format::mistral_v3_tekken:
      render_mistral(messages, format, out);
      break;
    case chat_format::mistral_v7:
    case chat_format::mistral_v7_tekken:
      render_mistral_v7(messages, format == chat_format::mistral_v7_tekken, out);
      break;
    case chat_format::phi3:
      render_role_tags(messages, "<|end|>\n", add_generation_prompt, out);
      break;
    case chat_format::zephyr:
      render_role_tags(messages, "<|endoftext|>\n", add_generation_prompt, out);
      break;
    case chat_format::gemma:
      render_gemma(messages, add_generation_prompt, out);
      break;
    case chat_format::deepseek3:
      render_deepseek3(messages, add_generation_prompt, closes_past_thinking ? k_think_close : std::string_view(),
                       thinking_switch  ? (thinking.value_or(false) ? k_think_open : k_think_close)
                       : opens_thinking ? k_ds_open_thinking
                                        : std::string_view(),
                       out);
      break;
  }
  return out;
}

namespace {

// Jinja pieces. Every output character comes from a string literal in an expression, never from
// text between tags, so the template renders the same whatever the environment's whitespace
// options (Hugging Face's apply_chat_template uses trim_blocks and lstrip_blocks).
std::string lit(std::string_view text) {
  std::string out = "{{ '";
  for (const char c : text) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\'':
        out += "\\'";
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
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char hex[] = "0123456789abcdef";
          out += "\\x";
          out += hex[(c >> 4) & 15];
          out += hex[c & 15];
        } else {
          out += c;
        }
    }
  }
  return out + "' }}";
}
// llama.cpp's trim (ASCII C isspace) as a Jinja filter: Python's str.strip with those characters.
const std::string k_jinja_trim = "|trim(' \\t\\n\\x0b\\x0c\\r')";
const std::string k_content = "{{ message['content'] }}";
const std::string k_content_trimmed = "{{ message['content']" + k_jinja_trim + " }}";

// drops_past_thinking in Jinja: sets `content` to the message's content as qwen3_past_thinking
// (ChatML) or drop_all_thinking (deepseek3) leaves it; `k_last_query_prelude` goes before the loop.
const std::string k_last_query_prelude =
    "{% set ns_past = namespace(last_query=(messages|length) - 1, found=false) %}"
    "{% for message in messages[::-1] %}{% if not ns_past.found and message['role'] == 'user' and not "
    "(message['content'].startswith('<tool_response>') and message['content'].endswith('</tool_response>')) %}"
    "{% set ns_past.found = true %}{% set ns_past.last_query = (messages|length) - 1 - loop.index0 %}{% endif %}"
    "{% endfor %}";
const std::string k_qwen3_past_thinking =
    "{% set content = message['content'] %}{% set reasoning = '' %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{% if message['role'] == 'assistant' and loop.index0 > ns_past.last_query and (loop.last or reasoning) %}"
    "{% set content = '<think>\\n' + reasoning + '\\n</think>\\n\\n' + content.lstrip('\\n') %}{% endif %}";
const std::string k_all_past_thinking =
    "{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}";
// closes_past_thinking in Jinja: `</think>`, then the content after its first `</think>`.
const std::string k_closed_past_thinking =
    "{{ '</think>' }}{% if '</think>' in message['content'] %}{{ message['content'].split('</think>', 1)[1] }}"
    "{% else %}{{ message['content'] }}{% endif %}";

}  // namespace

std::string chat_template::to_jinja(bool with_bos) const {
  std::string j = with_bos ? "{{ bos_token }}" : "";
  auto loop = [&](const std::string& body) { j += "{% for message in messages %}" + body + "{% endfor %}"; };
  auto gen = [&](std::string_view header) { j += "{% if add_generation_prompt %}" + lit(header) + "{% endif %}"; };
  switch (format) {
    case chat_format::unsupported:
      throw std::runtime_error("the chat template cannot be applied: " + unsupported_reason);
    case chat_format::chatml:
      if (!default_system.empty())
        j += "{% if messages and messages[0]['role'] != 'system' %}" +
             lit(std::string(k_im_start) + "system\n" + default_system + std::string(k_im_end) + "\n") + "{% endif %}";
      if (drops_past_thinking) j += k_last_query_prelude;
      loop(lit(k_im_start) + "{{ message['role'] }}" + lit("\n") +
           (drops_past_thinking ? k_qwen3_past_thinking + "{{ content }}" : k_content) +
           lit(std::string(k_im_end) + "\n"));
      gen(std::string(k_im_start) + "assistant\n");
      if (thinking_switch)
        j += "{% if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}" +
             lit(k_empty_thinking) + "{% endif %}";
      break;
    case chat_format::phi4:
      loop(lit(k_im_start) + "{{ message['role'] }}" + lit(k_im_sep) + k_content + lit(k_im_end));
      gen(std::string(k_im_start) + "assistant" + std::string(k_im_sep));
      break;
    case chat_format::llama3:
      loop(lit("<|start_header_id|>") + "{{ message['role'] }}" + lit("<|end_header_id|>\n\n") + k_content_trimmed +
           lit("<|eot_id|>"));
      gen("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
    case chat_format::phi3:
    case chat_format::zephyr:
      loop(lit("<|") + "{{ message['role'] }}" + lit("|>\n") + k_content +
           lit(format == chat_format::phi3 ? "<|end|>\n" : "<|endoftext|>\n"));
      gen("<|assistant|>\n");
      break;
    case chat_format::gemma:
      j += "{% set ns = namespace(system='') %}";
      loop("{% if message['role'] == 'system' %}{% set ns.system = ns.system + message['content']" + k_jinja_trim +
           " %}{% else %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}" +
           lit("<start_of_turn>") + "{{ role }}" + lit("\n") + "{% if ns.system and role != 'model' %}{{ ns.system }}" +
           lit("\n\n") + "{% set ns.system = '' %}{% endif %}" + k_content_trimmed + lit("<end_of_turn>\n") +
           "{% endif %}");
      gen("<start_of_turn>model\n");
      break;
    case chat_format::deepseek3:
      loop("{% if message['role'] == 'system' %}" + k_content + lit("\n\n") + "{% elif message['role'] == 'user' %}" +
           lit(k_ds_user) + k_content + "{% elif message['role'] == 'assistant' %}" + lit(k_ds_assistant) +
           (drops_past_thinking    ? k_all_past_thinking + "{{ content }}"
            : closes_past_thinking ? k_closed_past_thinking
                                   : k_content) +
           lit(k_ds_end) + "{% endif %}");
      if (thinking_switch) {
        j += "{% if add_generation_prompt %}" + lit(k_ds_assistant) + "{% if thinking is defined and thinking %}" +
             lit(k_think_open) + "{% else %}" + lit(k_think_close) + "{% endif %}{% endif %}";
      } else {
        gen(std::string(k_ds_assistant) + std::string(opens_thinking ? k_ds_open_thinking : ""));
      }
      break;
    case chat_format::mistral_v7:
    case chat_format::mistral_v7_tekken: {
      const std::string sp = format == chat_format::mistral_v7 ? " " : "";
      loop("{% if message['role'] == 'system' %}" + lit("[SYSTEM_PROMPT]" + sp) + k_content + lit("[/SYSTEM_PROMPT]") +
           "{% elif message['role'] == 'user' %}" + lit("[INST]" + sp) + k_content + lit("[/INST]") + "{% else %}" +
           lit(sp) + k_content + lit("</s>") + "{% endif %}");
      break;
    }
    case chat_format::mistral_v1:
    case chat_format::mistral_v3:
    case chat_format::mistral_v3_tekken: {
      const std::string before = format == chat_format::mistral_v1 ? " " : "";
      const std::string after = format == chat_format::mistral_v3_tekken ? "" : " ";
      const std::string& assistant = format == chat_format::mistral_v3 ? k_content_trimmed : k_content;
      j += "{% set ns = namespace(in_turn=false) %}";
      loop("{% if not ns.in_turn %}" + lit(before + "[INST]" + after) + "{% set ns.in_turn = true %}{% endif %}" +
           "{% if message['role'] == 'system' %}" + k_content + lit("\n\n") + "{% elif message['role'] == 'user' %}" +
           k_content + lit(before + "[/INST]") + "{% else %}" + lit(after) + assistant + lit("</s>") +
           "{% set ns.in_turn = false %}{% endif %}");
      break;
    }
    case chat_format::llama2:
    case chat_format::llama2_sys:
    case chat_format::llama2_sys_bos:
    case chat_format::llama2_sys_strip: {
      const std::string& content = format == chat_format::llama2_sys_strip ? k_content_trimmed : k_content;
      const std::string system =
          format == chat_format::llama2 ? content + lit("\n") : lit("<<SYS>>\n") + content + lit("\n<</SYS>>\n\n");
      j += lit("[INST] ") + "{% set ns = namespace(in_turn=true) %}";
      loop("{% if not ns.in_turn %}{% set ns.in_turn = true %}" +
           lit(format == chat_format::llama2_sys_bos ? "<s>[INST] " : "[INST] ") + "{% endif %}" +
           "{% if message['role'] == 'system' %}" + system + "{% elif message['role'] == 'user' %}" + content +
           lit(" [/INST]") + "{% else %}" + content + lit("</s>") + "{% set ns.in_turn = false %}{% endif %}");
      break;
    }
  }
  return j;
}

}  // namespace sy
