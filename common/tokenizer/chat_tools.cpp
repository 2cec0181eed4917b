// Tools in the prompt: each family's convention for the tool list, past calls and tool results,
// written as plain messages for the renderers of chat_template.cpp (see with_tools in
// chat_template.hpp). The instructions are Switchyard's own words; the markers are the families'.
#include <string>

#include "common/json_text.hpp"
#include "common/tokenizer/chat_template.hpp"

namespace sy {

namespace {

// {"name": N, "<args_key>": ARGS} (and "id" for mistral, which refers to calls by id).
std::string call_json(const chat_tool_call& c, std::string_view args_key, bool with_id) {
  std::string out = "{\"name\": " + json_quote(c.name) + ", \"" + std::string(args_key) +
                    "\": " + (c.arguments.empty() ? std::string("{}") : c.arguments);
  if (with_id && !c.id.empty()) out += ", \"id\": " + json_quote(c.id);
  return out + "}";
}

std::string hermes_tool_list(const std::vector<chat_tool>& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more of the functions below to help with the request. "
      "Their definitions are inside <tools></tools> tags:\n<tools>";
  for (const chat_tool& t : tools) out.append("\n").append(t.definition);
  out +=
      "\n</tools>\n\nTo call a function, write a JSON object with its name and arguments between "
      "<tool_call></tool_call> tags, one block per call:\n<tool_call>\n"
      "{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}\n</tool_call>";
  return out;
}

std::vector<chat_message> hermes(std::string_view default_system, const std::vector<chat_message>& messages,
                                 const std::vector<chat_tool>& tools) {
  std::vector<chat_message> out;
  size_t i = 0;
  if (!tools.empty()) {
    chat_message system{"system", hermes_tool_list(tools), {}, {}};
    if (!messages.empty() && messages.front().role == "system") {
      system.content = messages.front().content + "\n\n" + system.content;
      i = 1;
    } else if (!default_system.empty()) {
      system.content = std::string(default_system) + "\n\n" + system.content;
    }
    out.push_back(std::move(system));
  }
  for (; i < messages.size(); ++i) {
    const chat_message& m = messages[i];
    if (m.role == "tool") {
      // Consecutive results share one user turn.
      std::string block = "<tool_response>\n" + m.content + "\n</tool_response>";
      if (i > 0 && messages[i - 1].role == "tool" && !out.empty()) {
        out.back().content += "\n" + block;
      } else {
        out.push_back({"user", std::move(block), {}, {}});
      }
      continue;
    }
    chat_message plain{m.role, m.content, {}, {}};
    for (const chat_tool_call& c : m.tool_calls) {
      if (!plain.content.empty()) plain.content += "\n";
      plain.content += "<tool_call>\n" + call_json(c, "arguments", false) + "\n</tool_call>";
    }
    out.push_back(std::move(plain));
  }
  return out;
}

std::vector<chat_message> llama3(const std::vector<chat_message>& messages, const std::vector<chat_tool>& tools) {
  std::vector<chat_message> out;
  bool listed = tools.empty();
  for (const chat_message& m : messages) {
    if (m.role == "tool") {
      out.push_back({"ipython", m.content, {}, {}});
      continue;
    }
    chat_message plain{m.role, m.content, {}, {}};
    if (!listed && m.role == "user") {  // Llama 3.1's default: the list goes in the first user turn
      std::string list = "These functions are available, as JSON definitions:\n\n";
      for (const chat_tool& t : tools) list.append(t.definition).append("\n\n");
      list +=
          "To call one, reply with only a JSON object of the form {\"name\": function name, \"parameters\": "
          "object of argument names and values}.\n\n";
      plain.content = list + plain.content;
      listed = true;
    }
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      if (!plain.content.empty()) plain.content += k == 0 ? "\n" : "; ";
      plain.content += call_json(m.tool_calls[k], "parameters", false);
    }
    out.push_back(std::move(plain));
  }
  return out;
}

std::vector<chat_message> mistral(chat_format f, const std::vector<chat_message>& messages,
                                  const std::vector<chat_tool>& tools) {
  const bool spaced = f == chat_format::mistral_v1 || f == chat_format::mistral_v3 || f == chat_format::mistral_v7;
  const std::string sp = spaced ? " " : "";
  size_t last_user = messages.size();
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "user") last_user = i;
  std::vector<chat_message> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const chat_message& m = messages[i];
    if (i == last_user && !tools.empty()) {
      std::string list = "[AVAILABLE_TOOLS]" + sp + "[";
      for (size_t k = 0; k < tools.size(); ++k) list.append(k ? ", " : "").append(tools[k].definition);
      out.push_back({"", list + "][/AVAILABLE_TOOLS]", {}, {}});
    }
    if (m.role == "tool") {
      out.push_back({"",
                     "[TOOL_RESULTS]" + sp + "{\"content\": " + json_quote(m.content) +
                         ", \"call_id\": " + json_quote(m.tool_call_id) + "}[/TOOL_RESULTS]",
                     {},
                     {}});
      continue;
    }
    chat_message plain{m.role, m.content, {}, {}};
    if (!m.tool_calls.empty()) {
      std::string calls = "[TOOL_CALLS]" + sp + "[";
      for (size_t k = 0; k < m.tool_calls.size(); ++k)
        calls.append(k ? ", " : "").append(call_json(m.tool_calls[k], "arguments", true));
      plain.content += (plain.content.empty() ? "" : "\n") + calls + "]";
    }
    out.push_back(std::move(plain));
  }
  return out;
}

constexpr std::string_view k_ds_calls_begin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view k_ds_calls_end = "<｜tool▁calls▁end｜>";

// DeepSeek-V3.1's convention: its tokens around the calls, written after the assistant's text as
// its template writes them, and each result as <｜tool▁output▁begin｜>RESULT<｜tool▁output▁end｜>
// right after the calling turn (verbatim: no role marker, as the template has it).
std::vector<chat_message> deepseek(const std::vector<chat_message>& messages, const std::vector<chat_tool>& tools) {
  std::vector<chat_message> out;
  size_t i = 0;
  if (!tools.empty()) {
    std::string list = "## Tools\nYou may call the functions below, defined in JSON:\n";
    for (const chat_tool& t : tools) list.append("\n").append(t.definition);
    list.append("\n\nTo call functions, write exactly this, with one ")
        .append(k_deepseek_call_begin)
        .append("...")
        .append(k_deepseek_call_end)
        .append(" per call and the arguments as a JSON object:\n")
        .append(k_ds_calls_begin)
        .append(k_deepseek_call_begin)
        .append("function name")
        .append(k_deepseek_tool_sep)
        .append("arguments")
        .append(k_deepseek_call_end)
        .append(k_ds_calls_end);
    chat_message system{"system", std::move(list), {}, {}};
    if (!messages.empty() && messages.front().role == "system") {
      system.content = messages.front().content + "\n\n" + system.content;
      i = 1;
    }
    out.push_back(std::move(system));
  }
  for (; i < messages.size(); ++i) {
    const chat_message& m = messages[i];
    if (m.role == "tool") {
      out.push_back({"", "<｜tool▁output▁begin｜>" + m.content + "<｜tool▁output▁end｜>", {}, {}});
      continue;
    }
    chat_message plain{m.role, m.content, {}, {}};
    if (!m.tool_calls.empty()) {
      plain.content += k_ds_calls_begin;
      for (const chat_tool_call& c : m.tool_calls)
        plain.content.append(k_deepseek_call_begin)
            .append(c.name)
            .append(k_deepseek_tool_sep)
            .append(c.arguments.empty() ? std::string("{}") : c.arguments)
            .append(k_deepseek_call_end);
      plain.content += k_ds_calls_end;
    }
    out.push_back(std::move(plain));
  }
  return out;
}

}  // namespace

tool_call_style tool_style(chat_format f) {
  switch (f) {
    case chat_format::llama3:
      return tool_call_style::llama3_json;
    case chat_format::mistral_v1:
    case chat_format::mistral_v3:
    case chat_format::mistral_v3_tekken:
    case chat_format::mistral_v7:
    case chat_format::mistral_v7_tekken:
      return tool_call_style::mistral;
    case chat_format::deepseek3:
      return tool_call_style::deepseek;
    default:
      return tool_call_style::hermes;  // ChatML's (Qwen2.5), and the fallback for the rest
  }
}

std::string_view tool_call_open(tool_call_style s) {
  switch (s) {
    case tool_call_style::llama3_json:
      return "<|python_tag|>";
    case tool_call_style::mistral:
      return "[TOOL_CALLS]";
    case tool_call_style::deepseek:
      return k_ds_calls_begin;
    case tool_call_style::hermes:
      break;
  }
  return "<tool_call>";
}

std::string_view tool_call_close(tool_call_style s) {
  return s == tool_call_style::hermes ? "</tool_call>" : s == tool_call_style::deepseek ? k_ds_calls_end : "";
}

std::vector<chat_message> with_tools(chat_format f, std::string_view default_system,
                                     const std::vector<chat_message>& messages, const std::vector<chat_tool>& tools) {
  switch (tool_style(f)) {
    case tool_call_style::llama3_json:
      return llama3(messages, tools);
    case tool_call_style::mistral:
      return mistral(f, messages, tools);
    case tool_call_style::deepseek:
      return deepseek(messages, tools);
    case tool_call_style::hermes:
      break;
  }
  return hermes(f == chat_format::chatml ? default_system : std::string_view(), messages, tools);
}

}  // namespace sy
