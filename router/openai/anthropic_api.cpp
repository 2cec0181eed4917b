// Parsing and formatting of the Anthropic Messages API (see anthropic_api.hpp).
//
// A body is translated field by field into the JSON of an OpenAI chat request and handed to
// parse_generation_request, so every range and limit is checked by the one parser
// (docs/engineering.md, "Parse at the edge"). `rejected` is thrown by the translation and caught
// in parse_anthropic_request only.
#include "router/openai/anthropic_api.hpp"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "router/openai/json_fields.hpp"

namespace sy::router {
namespace {

using ordered_json = nlohmann::ordered_json;

using namespace json_fields;  // rejected, reject, quoted, wrong_type, field (router/openai/json_fields.hpp)

const std::string& string_field(const ordered_json& o, const char* key, const std::string& p) {
  const ordered_json* v = field(o, key);
  const std::string fp = p + "." + key;
  if (v == nullptr) reject(fp, quoted(fp) + " is required", "missing_required_parameter");
  if (!v->is_string()) wrong_type(fp, "a string", *v);
  return v->get_ref<const std::string&>();
}

std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

// Anthropic's least thinking budget.
constexpr uint64_t k_min_thinking_budget = 1024;

[[noreturn]] void unsupported_block(const std::string& p, const std::string& type) {
  reject(p + ".type", "content blocks of type '" + type +
                          "' are not supported here: text, tool_use, thinking and redacted_thinking (assistant) "
                          "and tool_result (user) are");
}

// `system`, or a tool_result's content: a string, or an array of text blocks (joined).
std::string text_blocks(const ordered_json& v, const std::string& p) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type(p, "a string or an array of text blocks", v);
  std::string out;
  for (size_t j = 0; j < v.size(); ++j) {
    const std::string bp = p + "[" + std::to_string(j) + "]";
    if (!v[j].is_object()) wrong_type(bp, "an object", v[j]);
    const std::string& type = string_field(v[j], "type", bp);
    if (type != "text") unsupported_block(bp, type);
    out += string_field(v[j], "text", bp);
  }
  return out;
}

// One Anthropic message -> OpenAI messages: an assistant turn with its tool_use blocks as
// tool_calls; a user turn's tool_result blocks as "tool" messages, before its text.
void translate_message(const ordered_json& m, const std::string& p, ordered_json& out) {
  if (!m.is_object()) wrong_type(p, "an object", m);
  const std::string& role = string_field(m, "role", p);
  if (role != "user" && role != "assistant")
    reject(p + ".role", quoted(p + ".role") + " must be user or assistant, got '" + role +
                            "' (the system prompt is the top-level 'system')");
  const ordered_json* content = field(m, "content");
  if (content == nullptr) reject(p + ".content", quoted(p + ".content") + " is required", "missing_required_parameter");
  if (content->is_string()) {
    out.push_back(ordered_json{{"role", role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) wrong_type(p + ".content", "a string or an array of content blocks", *content);
  std::string text;
  ordered_json calls = ordered_json::array(), results = ordered_json::array();
  for (size_t j = 0; j < content->size(); ++j) {
    const std::string bp = p + ".content[" + std::to_string(j) + "]";
    const ordered_json& b = (*content)[j];
    if (!b.is_object()) wrong_type(bp, "an object", b);
    const std::string& type = string_field(b, "type", bp);
    if (type == "text") {
      text += string_field(b, "text", bp);
    } else if (type == "tool_use" && role == "assistant") {
      const ordered_json* input = field(b, "input");
      if (input != nullptr && !input->is_object()) wrong_type(bp + ".input", "an object", *input);
      calls.push_back(ordered_json{
          {"id", string_field(b, "id", bp)},
          {"type", "function"},
          {"function",
           {{"name", string_field(b, "name", bp)}, {"arguments", input ? dump(*input) : std::string("{}")}}}});
    } else if ((type == "thinking" || type == "redacted_thinking") && role == "assistant") {
      // Past thinking given back (as clients must with tools): dropped, as the chat templates drop
      // it and as a chat message's reasoning_content is (docs/router.md, "Reasoning output").
    } else if (type == "tool_result" && role == "user") {
      std::string result;
      if (const ordered_json* c = field(b, "content")) result = text_blocks(*c, bp + ".content");
      if (const ordered_json* e = field(b, "is_error")) {
        if (!e->is_boolean()) wrong_type(bp + ".is_error", "a boolean", *e);
        if (e->get<bool>()) result = "Error: " + result;
      }
      results.push_back(
          ordered_json{{"role", "tool"}, {"tool_call_id", string_field(b, "tool_use_id", bp)}, {"content", result}});
    } else {
      unsupported_block(bp, type);
    }
  }
  if (role == "assistant") {
    ordered_json msg{{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
    return;
  }
  for (auto& r : results) out.push_back(std::move(r));
  if (!text.empty() || content->empty()) out.push_back(ordered_json{{"role", "user"}, {"content", text}});
}

// tools[i]: {"name", "description"?, "input_schema"} -> an OpenAI function tool.
ordered_json translate_tool(const ordered_json& t, const std::string& p) {
  if (!t.is_object()) wrong_type(p, "an object", t);
  if (const ordered_json* type = field(t, "type"); type != nullptr && !(type->is_string() && *type == "custom"))
    reject(p + ".type", "only client tools (no 'type', or 'custom') are supported, not server tools");
  ordered_json fn = ordered_json::object();
  fn["name"] = string_field(t, "name", p);
  if (const ordered_json* d = field(t, "description")) fn["description"] = *d;
  const ordered_json* schema = field(t, "input_schema");
  if (schema == nullptr)
    reject(p + ".input_schema", quoted(p + ".input_schema") + " is required", "missing_required_parameter");
  if (!schema->is_object()) wrong_type(p + ".input_schema", "an object (a JSON Schema)", *schema);
  fn["parameters"] = *schema;
  return ordered_json{{"type", "function"}, {"function", std::move(fn)}};
}

void translate_tool_choice(const ordered_json& v, ordered_json& out) {
  if (!v.is_object()) wrong_type("tool_choice", "an object", v);
  const std::string& type = string_field(v, "type", "tool_choice");
  if (type == "auto") {
    out["tool_choice"] = "auto";
  } else if (type == "any") {
    out["tool_choice"] = "required";
  } else if (type == "none") {
    out["tool_choice"] = "none";
  } else if (type == "tool") {
    out["tool_choice"] =
        ordered_json{{"type", "function"}, {"function", {{"name", string_field(v, "name", "tool_choice")}}}};
  } else {
    reject("tool_choice.type", "'tool_choice.type' must be auto, any, tool or none, got '" + type + "'");
  }
  if (const ordered_json* d = field(v, "disable_parallel_tool_use")) {
    if (!d->is_boolean()) wrong_type("tool_choice.disable_parallel_tool_use", "a boolean", *d);
    out["parallel_tool_calls"] = !d->get<bool>();
  }
}

// `thinking`: {"type": "enabled", "budget_tokens": N} (N >= 1024, as Anthropic requires) or
// {"type": "disabled"} is the template's thinking switch, chat_template_kwargs.enable_thinking
// (docs/router.md, "Anthropic Messages API", "Thinking"); {"type": "adaptive"} leaves the template
// its default. budget_tokens is the OpenAI route's thinking_token_budget: the worker closes a
// thinking that reaches it.
// `display` is ignored: the thinking is always returned.
void translate_thinking(const ordered_json& v, ordered_json& out) {
  if (!v.is_object()) wrong_type("thinking", "an object", v);
  const std::string& type = string_field(v, "type", "thinking");
  if (type == "adaptive") return;
  if (type == "disabled") {
    out["chat_template_kwargs"] = ordered_json{{"enable_thinking", false}};
    return;
  }
  if (type != "enabled")
    reject("thinking.type", "'thinking.type' must be enabled, disabled or adaptive, got '" + type + "'");
  const ordered_json* budget = field(v, "budget_tokens");
  if (budget == nullptr)
    reject("thinking.budget_tokens", "'thinking.budget_tokens' is required when thinking is enabled",
           "missing_required_parameter");
  if (!budget->is_number_integer()) wrong_type("thinking.budget_tokens", "an integer", *budget);
  if (!budget->is_number_unsigned() || budget->get<uint64_t>() < k_min_thinking_budget)
    reject("thinking.budget_tokens", "'thinking.budget_tokens' must be at least " +
                                         std::to_string(k_min_thinking_budget) + ", got " + dump(*budget));
  out["chat_template_kwargs"] = ordered_json{{"enable_thinking", true}};
  // Enforced by the worker where the answer splits; a budget past int32 is no budget at all.
  out["thinking_token_budget"] = std::min<uint64_t>(budget->get<uint64_t>(), std::numeric_limits<int32_t>::max());
}

ordered_json translate(const ordered_json& doc, bool count_only) {
  ordered_json out = ordered_json::object();
  const ordered_json* model = field(doc, "model");
  if (model == nullptr) reject("model", "'model' is required", "missing_required_parameter");
  out["model"] = *model;
  ordered_json messages = ordered_json::array();
  if (const ordered_json* s = field(doc, "system")) {
    std::string text = text_blocks(*s, "system");
    if (!text.empty()) messages.push_back(ordered_json{{"role", "system"}, {"content", std::move(text)}});
  }
  const ordered_json* v = field(doc, "messages");
  if (v == nullptr) reject("messages", "'messages' is required", "missing_required_parameter");
  if (!v->is_array()) wrong_type("messages", "an array", *v);
  if (v->empty()) reject("messages", "'messages' must not be empty");
  for (size_t i = 0; i < v->size(); ++i) translate_message((*v)[i], "messages[" + std::to_string(i) + "]", messages);
  out["messages"] = std::move(messages);
  if (!count_only) {
    const ordered_json* mt = field(doc, "max_tokens");
    if (mt == nullptr) reject("max_tokens", "'max_tokens' is required", "missing_required_parameter");
    out["max_tokens"] = *mt;
    if (const ordered_json* s = field(doc, "stream")) out["stream"] = *s;
  }
  if (const ordered_json* s = field(doc, "stop_sequences")) {
    if (!s->is_array()) wrong_type("stop_sequences", "an array of strings", *s);
    if (!s->empty()) out["stop"] = *s;
  }
  for (const char* name :
       {"temperature", "top_p", "top_k", "priority", "timeout", "queue_timeout", "cache", "ignore_eos"})
    if (const ordered_json* x = field(doc, name)) out[name] = *x;
  if (const ordered_json* t = field(doc, "tools")) {
    if (!t->is_array()) wrong_type("tools", "an array of tools", *t);
    ordered_json tools = ordered_json::array();
    for (size_t i = 0; i < t->size(); ++i) tools.push_back(translate_tool((*t)[i], "tools[" + std::to_string(i) + "]"));
    out["tools"] = std::move(tools);
  }
  if (const ordered_json* c = field(doc, "tool_choice")) translate_tool_choice(*c, out);
  // Structured outputs: output_config.format (or the older top-level output_format), a JSON
  // Schema the text must match, decoded under its grammar as response_format json_schema is.
  // output_config.effort is ignored.
  const ordered_json* format = field(doc, "output_format");
  if (const ordered_json* oc = field(doc, "output_config")) {
    if (!oc->is_object()) wrong_type("output_config", "an object", *oc);
    if (const ordered_json* f = field(*oc, "format")) format = f;
  }
  if (format != nullptr) {
    if (!format->is_object()) wrong_type("output_config.format", "an object", *format);
    if (string_field(*format, "type", "output_config.format") != "json_schema")
      reject("output_config.format.type", "'output_config.format.type' must be 'json_schema'");
    const ordered_json* schema = field(*format, "schema");
    if (schema == nullptr)
      reject("output_config.format.schema", "'output_config.format.schema' is required", "missing_required_parameter");
    out["response_format"] =
        ordered_json{{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
  }
  if (const ordered_json* th = field(doc, "thinking")) translate_thinking(*th, out);
  // metadata (user_id), service_tier, container, mcp_servers: ignored, as unknown fields are.
  return out;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// The OpenAI parser's field names where Anthropic's differ.
api_error anthropic_names(api_error e) {
  for (std::string* s : {&e.param, &e.message}) {
    replace_all(*s, ".function.parameters", ".input_schema");
    replace_all(*s, ".function.name", ".name");
    replace_all(*s, "'stop'", "'stop_sequences'");
    replace_all(*s, "response_format.json_schema.schema", "output_config.format.schema");
    replace_all(*s, "'response_format' must be text", "'output_config.format' must be left out");
  }
  if (e.param == "stop") e.param = "stop_sequences";
  if (e.param == "response_format") e.param = "output_config.format";
  return e;
}

std::string tool_use_id(const response_meta& meta, size_t index) {
  return "toolu_" + tool_call_id(meta.id, 0, index).substr(5);  // "call_" + 24 hex digits
}

ordered_json tool_input(const std::string& arguments) {
  ordered_json input = ordered_json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : ordered_json::object();
}

ordered_json stop_sequence_json(const anthropic_state& st, std::string_view stop_reason) {
  if (stop_reason != "stop_sequence" || st.stop_sequences.empty()) return nullptr;
  if (!st.stop_matched.empty()) return st.stop_matched;
  return st.stop_sequences.front();
}

// Anthropic's usage: input_tokens are the prompt tokens computed for this request, apart from
// those read from the prefix cache (cache_read_input_tokens); nothing is written to a cache at a
// client's request (cache_creation_input_tokens 0): docs/router.md, "Anthropic Messages API".
ordered_json usage_json(uint32_t prompt_tokens, uint32_t cached_tokens, uint32_t output_tokens) {
  cached_tokens = std::min(cached_tokens, prompt_tokens);
  return ordered_json{{"input_tokens", prompt_tokens - cached_tokens},
                      {"cache_creation_input_tokens", 0},
                      {"cache_read_input_tokens", cached_tokens},
                      {"output_tokens", output_tokens}};
}

// Appends one SSE event ("event: NAME\ndata: JSON"), a blank line apart from the one before.
void emit(std::string& out, const char* event, const ordered_json& data) {
  if (!out.empty()) out += "\n\n";
  out += "event: ";
  out += event;
  out += "\ndata: ";
  out += dump(data);
}

void message_start(const response_meta& meta, anthropic_state& st, std::string& out) {
  if (st.started) return;
  st.started = true;
  ordered_json msg = ordered_json::object();
  msg["id"] = meta.id;
  msg["type"] = "message";
  msg["role"] = "assistant";
  msg["model"] = meta.model;
  msg["content"] = ordered_json::array();
  msg["stop_reason"] = nullptr;
  msg["stop_sequence"] = nullptr;
  msg["usage"] = usage_json(st.input_tokens, st.cached_tokens.value_or(0), 0);
  emit(out, "message_start", ordered_json{{"type", "message_start"}, {"message", std::move(msg)}});
}

// A thinking block's signature: nothing signs the reasoning here, so it is empty (the anthropic
// SDK takes any string; a client gives it back and the router drops it, as it drops the thinking).
constexpr const char* k_no_signature = "";

void close_block(anthropic_state& st, std::string& out) {
  if (st.open_block < 0) return;
  if (st.open_is_thinking)  // as Anthropic's stream does: the signature just before the block's end
    emit(out, "content_block_delta",
         ordered_json{{"type", "content_block_delta"},
                      {"index", st.open_block},
                      {"delta", {{"type", "signature_delta"}, {"signature", k_no_signature}}}});
  emit(out, "content_block_stop", ordered_json{{"type", "content_block_stop"}, {"index", st.open_block}});
  st.open_block = -1;
}

void open_block(anthropic_state& st, std::string& out, ordered_json block, bool is_text, bool is_thinking = false) {
  close_block(st, out);
  st.open_block = st.next_block++;
  st.open_is_text = is_text;
  st.open_is_thinking = is_thinking;
  emit(out, "content_block_start",
       ordered_json{{"type", "content_block_start"}, {"index", st.open_block}, {"content_block", std::move(block)}});
}

}  // namespace

std::variant<generation_request, api_error> parse_anthropic_request(std::string_view body, const api_limits& limits,
                                                                    bool count_only) {
  ordered_json doc;
  try {
    doc = ordered_json::parse(body.begin(), body.end());
    if (!doc.is_object()) return bad_request("", "The request body must be a JSON object", "invalid_json");
    const std::string openai_body = translate(doc, count_only).dump();
    auto parsed = parse_generation_request(endpoint::chat_completions, openai_body, limits);
    if (auto* e = std::get_if<api_error>(&parsed)) return anthropic_names(std::move(*e));
    return parsed;
  } catch (const rejected& r) {
    return r.error;
  } catch (const nlohmann::json::exception& e) {
    return bad_request("", std::string("The request body is not valid JSON: ") + e.what(), "invalid_json");
  }
}

void enable_anthropic(response_meta& meta, const generation_request& g, uint32_t input_tokens) {
  auto st = std::make_shared<anthropic_state>();
  st->input_tokens = input_tokens;
  st->stop_sequences = g.sampling.stop;
  st->constrained = !g.constraint.kind.empty();
  if (meta.tools) st->tools.emplace(*meta.tools);
  meta.anthropic = std::move(st);
}

std::string anthropic_stop_reason(const anthropic_state& st, finish_reason finish, bool called) {
  if (finish == finish_reason::length) return "max_tokens";
  if (called) return "tool_use";
  if (finish == finish_reason::stop && !st.stop_matched.empty())
    return std::find(st.stop_sequences.begin(), st.stop_sequences.end(), st.stop_matched) != st.stop_sequences.end()
               ? "stop_sequence"
               : "end_turn";
  if (finish == finish_reason::stop && !st.stop_sequences.empty() && !st.constrained && st.ended_on_eog != true)
    return "stop_sequence";
  return "end_turn";
}

std::string anthropic_response(const response_meta& meta, const std::vector<choice_result>& choices,
                               const usage_info& usage) {
  const anthropic_state& st = *meta.anthropic;
  const choice_result none;
  const choice_result& c = choices.empty() ? none : choices.front();
  ordered_json content = ordered_json::array();
  bool called = false;
  // A model's reasoning is a `thinking` block before the answer (no signature: nothing signs it).
  std::optional<reasoning_split> thought;
  if (meta.reasoning) thought = split_reasoning(*meta.reasoning, c.text);
  const std::string_view text = thought ? std::string_view(thought->content) : std::string_view(c.text);
  if (thought && !thought->reasoning.empty())
    content.push_back(
        ordered_json{{"type", "thinking"}, {"thinking", thought->reasoning}, {"signature", k_no_signature}});
  if (meta.tools) {
    const tool_output parsed = parse_tool_output(*meta.tools, text);
    if (parsed.has_content && !parsed.content.empty())
      content.push_back(ordered_json{{"type", "text"}, {"text", parsed.content}});
    for (size_t i = 0; i < parsed.calls.size(); ++i)
      content.push_back(ordered_json{{"type", "tool_use"},
                                     {"id", tool_use_id(meta, i)},
                                     {"name", parsed.calls[i].name},
                                     {"input", tool_input(parsed.calls[i].arguments)}});
    called = !parsed.calls.empty();
  } else if (!text.empty()) {
    content.push_back(ordered_json{{"type", "text"}, {"text", std::string(text)}});
  }
  const std::string stop_reason = anthropic_stop_reason(st, c.finish_reason, called);
  ordered_json j = ordered_json::object();
  j["id"] = meta.id;
  j["type"] = "message";
  j["role"] = "assistant";
  j["model"] = meta.model;
  j["content"] = std::move(content);
  j["stop_reason"] = stop_reason;
  j["stop_sequence"] = stop_sequence_json(st, stop_reason);
  j["usage"] = usage_json(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens);
  return dump(j);
}

std::string anthropic_chunk(const response_meta& meta, std::string_view text, finish_reason finish,
                            std::string_view thinking) {
  anthropic_state& st = *meta.anthropic;
  std::string out;
  message_start(meta, st, out);
  if (!thinking.empty()) {
    if (st.open_block < 0 || !st.open_is_thinking)
      open_block(st, out, ordered_json{{"type", "thinking"}, {"thinking", ""}, {"signature", k_no_signature}}, false,
                 true);
    emit(out, "content_block_delta",
         ordered_json{{"type", "content_block_delta"},
                      {"index", st.open_block},
                      {"delta", {{"type", "thinking_delta"}, {"thinking", std::string(thinking)}}}});
  }
  tool_stream_delta d;
  if (st.tools) {
    d = st.tools->feed(text, finish != finish_reason::none);
  } else {
    d.content = std::string(text);
  }
  if (!d.content.empty()) {
    if (st.open_block < 0 || !st.open_is_text) open_block(st, out, ordered_json{{"type", "text"}, {"text", ""}}, true);
    emit(out, "content_block_delta",
         ordered_json{{"type", "content_block_delta"},
                      {"index", st.open_block},
                      {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
  }
  for (const tool_call_delta& c : d.calls) {
    if (c.first) {
      open_block(st, out,
                 ordered_json{{"type", "tool_use"},
                              {"id", tool_use_id(meta, c.index)},
                              {"name", c.name},
                              {"input", ordered_json::object()}},
                 false);
      st.called = true;
    }
    if (!c.arguments.empty())
      emit(out, "content_block_delta",
           ordered_json{{"type", "content_block_delta"},
                        {"index", st.open_block},
                        {"delta", {{"type", "input_json_delta"}, {"partial_json", c.arguments}}}});
  }
  if (finish != finish_reason::none) {
    close_block(st, out);
    st.stop_reason = anthropic_stop_reason(st, finish, st.called);
  }
  if (out.empty()) emit(out, "ping", ordered_json{{"type", "ping"}});  // nothing new: a keep-alive
  return out;
}

std::string anthropic_stream_end(const response_meta& meta, const usage_info& usage) {
  anthropic_state& st = *meta.anthropic;
  std::string out;
  message_start(meta, st, out);
  close_block(st, out);
  const std::string stop_reason = st.stop_reason.empty() ? "end_turn" : st.stop_reason;
  emit(out, "message_delta",
       ordered_json{{"type", "message_delta"},
                    {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", stop_sequence_json(st, stop_reason)}}},
                    {"usage", usage_json(std::max(usage.prompt_tokens, st.input_tokens), usage.cached_tokens,
                                         usage.completion_tokens)}});
  emit(out, "message_stop", ordered_json{{"type", "message_stop"}});
  return out;
}

std::string anthropic_error(const api_error& e) {
  // Anthropic's error types: OpenAI's names where they agree, its own for the rest.
  std::string type = e.type;
  if (e.status == 413) type = "request_too_large";
  if (type == "server_error") type = "api_error";
  return dump(ordered_json{{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}});
}

std::string anthropic_error_event(const api_error& e) {
  std::string out;
  out += "event: error\ndata: ";
  out += anthropic_error(e);
  return out;
}

std::string format_anthropic_count(size_t input_tokens) { return dump(ordered_json{{"input_tokens", input_tokens}}); }

}  // namespace sy::router
