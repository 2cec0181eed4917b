// Parsing and formatting of the OpenAI Responses API (see responses_api.hpp).
//
// A body is translated field by field into the JSON of an OpenAI chat request and handed to
// parse_generation_request, so every range and limit is checked by the one parser
// (docs/engineering.md, "Parse at the edge"), as the Anthropic translation does. `rejected` is
// thrown by the translation and caught in the two entry points only.
#include "router/openai/responses_api.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "router/openai/json_fields.hpp"

namespace sy::router {
namespace {

using ordered_json = nlohmann::ordered_json;

using namespace json_fields;  // rejected, reject, quoted, wrong_type, field, as_string

std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

const std::string& string_field(const ordered_json& o, const char* key, const std::string& p) {
  const ordered_json* v = field(o, key);
  const std::string fp = p + "." + key;
  if (v == nullptr) reject(fp, quoted(fp) + " is required", "missing_required_parameter");
  return as_string(*v, fp);
}

[[noreturn]] void unsupported(const std::string& param, const std::string& what) {
  reject(param, what + " is not supported by this server", "unsupported_parameter");
}

// A message's content: a string, or parts of type input_text / output_text (joined).
std::string content_text(const ordered_json& c, const std::string& p) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) wrong_type(p, "a string or an array of content parts", c);
  std::string out;
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string pp = p + "[" + std::to_string(j) + "]";
    if (!c[j].is_object()) wrong_type(pp, "an object", c[j]);
    const std::string& type = string_field(c[j], "type", pp);
    if (type != "input_text" && type != "output_text" && type != "text")
      reject(pp + ".type", "content parts of type '" + type + "' are not supported: input_text and output_text are",
             "unsupported_parameter");
    out += string_field(c[j], "text", pp);
  }
  return out;
}

// One input item in its stored form (responses_api.hpp); a reasoning item gives null (dropped).
ordered_json normalize_item(const ordered_json& it, const std::string& p) {
  if (!it.is_object()) wrong_type(p, "an object", it);
  const ordered_json* t = field(it, "type");
  const std::string type = t ? as_string(*t, p + ".type") : std::string("message");  // an "easy" message
  if (type == "message") {
    const std::string& role = string_field(it, "role", p);
    if (role != "user" && role != "system" && role != "developer" && role != "assistant")
      reject(p + ".role", quoted(p + ".role") + " must be user, system, developer or assistant, got '" + role + "'");
    const ordered_json* c = field(it, "content");
    if (c == nullptr) reject(p + ".content", quoted(p + ".content") + " is required", "missing_required_parameter");
    const char* part = role == "assistant" ? "output_text" : "input_text";
    return ordered_json{
        {"type", "message"},
        {"role", role},
        {"content", ordered_json::array({{{"type", part}, {"text", content_text(*c, p + ".content")}}})}};
  }
  if (type == "function_call") {
    const ordered_json* args = field(it, "arguments");
    std::string arguments = "{}";
    if (args != nullptr) arguments = args->is_string() ? args->get<std::string>() : dump(*args);
    return ordered_json{{"type", "function_call"},
                        {"call_id", string_field(it, "call_id", p)},
                        {"name", string_field(it, "name", p)},
                        {"arguments", arguments}};
  }
  if (type == "function_call_output") {
    const ordered_json* o = field(it, "output");
    if (o == nullptr) reject(p + ".output", quoted(p + ".output") + " is required", "missing_required_parameter");
    return ordered_json{{"type", "function_call_output"},
                        {"call_id", string_field(it, "call_id", p)},
                        {"output", content_text(*o, p + ".output")}};
  }
  if (type == "reasoning") return nullptr;
  reject(p + ".type",
         "input items of type '" + type + "' are not supported: message, function_call, function_call_output are",
         "unsupported_parameter");
}

ordered_json normalize_input(const ordered_json& v) {
  ordered_json items = ordered_json::array();
  if (v.is_string()) {
    items.push_back(ordered_json{{"type", "message"},
                                 {"role", "user"},
                                 {"content", ordered_json::array({{{"type", "input_text"}, {"text", v}}})}});
    return items;
  }
  if (!v.is_array()) wrong_type("input", "a string or an array of input items", v);
  if (v.empty()) reject("input", "'input' must not be empty");
  for (size_t i = 0; i < v.size(); ++i) {
    ordered_json item = normalize_item(v[i], "input[" + std::to_string(i) + "]");
    if (!item.is_null()) items.push_back(std::move(item));
  }
  return items;
}

// tools[i]: {"type": "function", "name", "description"?, "parameters"?, "strict"?}: the chat
// tool, and the tool as the response echoes it.
std::pair<ordered_json, ordered_json> translate_tool(const ordered_json& t, const std::string& p) {
  if (!t.is_object()) wrong_type(p, "an object", t);
  const std::string& type = string_field(t, "type", p);
  if (type != "function")
    unsupported(p + ".type", "the built-in tool '" + type + "' (only tools of type 'function' are)");
  ordered_json fn = ordered_json::object();
  fn["name"] = string_field(t, "name", p);
  const ordered_json* d = field(t, "description");
  if (d != nullptr) fn["description"] = as_string(*d, p + ".description");
  const ordered_json* params = field(t, "parameters");
  fn["parameters"] =
      params != nullptr ? *params : ordered_json{{"type", "object"}, {"properties", ordered_json::object()}};
  bool strict = true;  // the API's default for function tools
  if (const ordered_json* s = field(t, "strict")) {
    if (!s->is_boolean()) wrong_type(p + ".strict", "a boolean", *s);
    strict = s->get<bool>();
  }
  fn["strict"] = strict;
  ordered_json echo{{"type", "function"},
                    {"name", fn["name"]},
                    {"description", d != nullptr ? *d : ordered_json(nullptr)},
                    {"parameters", fn["parameters"]},
                    {"strict", strict}};
  return {ordered_json{{"type", "function"}, {"function", std::move(fn)}}, std::move(echo)};
}

ordered_json translate_tool_choice(const ordered_json& v) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s != "auto" && s != "none" && s != "required")
      reject("tool_choice", "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\"}");
    return v;
  }
  if (!v.is_object()) wrong_type("tool_choice", "a string or an object", v);
  const std::string& type = string_field(v, "type", "tool_choice");
  if (type != "function") unsupported("tool_choice.type", "the tool choice '" + type + "'");
  return ordered_json{{"type", "function"}, {"function", {{"name", string_field(v, "name", "tool_choice")}}}};
}

// text.format -> response_format; the format as echoed.
ordered_json translate_text(const ordered_json& text, ordered_json& chat) {
  if (!text.is_object()) wrong_type("text", "an object", text);
  ordered_json echo_format{{"type", "text"}};
  if (const ordered_json* f = field(text, "format")) {
    if (!f->is_object()) wrong_type("text.format", "an object", *f);
    const std::string& type = string_field(*f, "type", "text.format");
    if (type == "json_object") {
      chat["response_format"] = ordered_json{{"type", "json_object"}};
      echo_format = ordered_json{{"type", "json_object"}};
    } else if (type == "json_schema") {
      ordered_json js = ordered_json::object();
      js["name"] = string_field(*f, "name", "text.format");
      const ordered_json* schema = field(*f, "schema");
      if (schema == nullptr)
        reject("text.format.schema", "'text.format.schema' is required", "missing_required_parameter");
      js["schema"] = *schema;
      if (const ordered_json* s = field(*f, "strict")) js["strict"] = *s;
      if (const ordered_json* d = field(*f, "description")) js["description"] = *d;
      chat["response_format"] = ordered_json{{"type", "json_schema"}, {"json_schema", js}};
      echo_format = ordered_json{{"type", "json_schema"}};
      for (auto it = js.begin(); it != js.end(); ++it) echo_format[it.key()] = it.value();
    } else if (type != "text") {
      reject("text.format.type", "'text.format.type' must be text, json_schema or json_object, got '" + type + "'");
    }
  }
  return ordered_json{{"format", std::move(echo_format)}};
}

// `include` (of its values, "message.output_text.logprobs" alone: the chat route's logprobs) and
// `top_logprobs` (the chat route's, with them; echoed either way, as the API does).
void translate_logprobs(const ordered_json& doc, ordered_json& chat, ordered_json& echo) {
  bool logprobs = false;
  if (const ordered_json* v = field(doc, "include")) {
    if (!v->is_array()) wrong_type("include", "an array of strings", *v);
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string p = "include[" + std::to_string(i) + "]";
      const ordered_json& what = (*v)[i];
      if (!what.is_string()) wrong_type(p, "a string", what);
      if (what != "message.output_text.logprobs")
        unsupported(p, "'include' value '" + what.get<std::string>() +
                           "' (of its values only \"message.output_text.logprobs\" is supported)");
      logprobs = true;
    }
  }
  const ordered_json* top = field(doc, "top_logprobs");
  if (top != nullptr && !top->is_number_integer()) wrong_type("top_logprobs", "an integer", *top);
  echo["top_logprobs"] = top != nullptr ? *top : ordered_json(0);
  if (!logprobs) return;  // as the API: top_logprobs alone returns nothing
  chat["logprobs"] = true;
  if (top != nullptr) chat["top_logprobs"] = *top;
}

// Fields the API has that this router refuses by name rather than ignore.
void refuse_unsupported(const ordered_json& doc) {
  if (const ordered_json* v = field(doc, "background"); v != nullptr && !(v->is_boolean() && !v->get<bool>()))
    unsupported("background", "'background' (responses run in the request)");
  if (field(doc, "conversation") != nullptr)
    unsupported("conversation", "'conversation' (continue with previous_response_id)");
  if (field(doc, "prompt") != nullptr) unsupported("prompt", "'prompt' (prompt templates)");
  if (const ordered_json* r = field(doc, "reasoning")) {
    if (!r->is_object()) wrong_type("reasoning", "an object", *r);
    if (field(*r, "effort") != nullptr)
      unsupported("reasoning.effort", "'reasoning.effort' (a model's thinking is not budgeted)");
    if (field(*r, "summary") != nullptr || field(*r, "generate_summary") != nullptr)
      unsupported("reasoning.summary", "'reasoning.summary'");
  }
  if (const ordered_json* t = field(doc, "truncation"); t != nullptr && !(t->is_string() && *t == "disabled"))
    unsupported("truncation", "'truncation' other than \"disabled\"");
}

responses_request translate(const ordered_json& doc) {
  refuse_unsupported(doc);
  responses_request r;
  ordered_json chat = ordered_json::object();
  ordered_json echo = ordered_json::object();
  const ordered_json* model = field(doc, "model");
  if (model == nullptr) reject("model", "'model' is required", "missing_required_parameter");
  r.model = as_string(*model, "model");
  chat["model"] = *model;
  const ordered_json* input = field(doc, "input");
  if (input == nullptr) reject("input", "'input' is required", "missing_required_parameter");
  r.input_items = dump(normalize_input(*input));
  if (const ordered_json* v = field(doc, "instructions")) r.instructions = as_string(*v, "instructions");
  echo["instructions"] = r.instructions.empty() ? ordered_json(nullptr) : ordered_json(r.instructions);
  if (const ordered_json* v = field(doc, "max_output_tokens")) chat["max_tokens"] = *v;
  echo["max_output_tokens"] = field(doc, "max_output_tokens") ? doc["max_output_tokens"] : ordered_json(nullptr);
  ordered_json metadata = ordered_json::object();
  if (const ordered_json* v = field(doc, "metadata")) {
    // The API's limits: 16 pairs, keys of 64 characters, values of 512 (bytes here).
    if (!v->is_object()) wrong_type("metadata", "an object of strings", *v);
    if (v->size() > 16) reject("metadata", "'metadata' holds more than 16 pairs");
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (!it.value().is_string()) wrong_type("metadata." + it.key(), "a string", it.value());
      if (it.key().size() > 64 || it.value().get_ref<const std::string&>().size() > 512)
        reject("metadata", "'metadata' keys are at most 64 characters and values at most 512");
    }
    metadata = *v;
  }
  echo["metadata"] = std::move(metadata);
  bool parallel = true;
  if (const ordered_json* v = field(doc, "parallel_tool_calls")) {
    if (!v->is_boolean()) wrong_type("parallel_tool_calls", "a boolean", *v);
    parallel = v->get<bool>();
    chat["parallel_tool_calls"] = parallel;
  }
  echo["parallel_tool_calls"] = parallel;
  if (const ordered_json* v = field(doc, "previous_response_id")) {
    r.previous_response_id = as_string(*v, "previous_response_id");
    if (r.previous_response_id.empty() || r.previous_response_id.size() > 128)
      reject("previous_response_id", "'previous_response_id' must be a response id");
  }
  echo["previous_response_id"] =
      r.previous_response_id.empty() ? ordered_json(nullptr) : ordered_json(r.previous_response_id);
  if (const ordered_json* v = field(doc, "store")) {
    if (!v->is_boolean()) wrong_type("store", "a boolean", *v);
    r.store = v->get<bool>();
  }
  echo["store"] = r.store;
  for (const char* name : {"temperature", "top_p"}) {
    const ordered_json* v = field(doc, name);
    if (v != nullptr) chat[name] = *v;
    echo[name] = v != nullptr ? *v : ordered_json(1.0);  // OpenAI's defaults, which the parser applies
  }
  echo["text"] = ordered_json{{"format", {{"type", "text"}}}};
  if (const ordered_json* v = field(doc, "text")) echo["text"] = translate_text(*v, chat);
  ordered_json tools_echo = ordered_json::array();
  if (const ordered_json* t = field(doc, "tools")) {
    if (!t->is_array()) wrong_type("tools", "an array of tools", *t);
    ordered_json tools = ordered_json::array();
    for (size_t i = 0; i < t->size(); ++i) {
      auto [tool, e] = translate_tool((*t)[i], "tools[" + std::to_string(i) + "]");
      tools.push_back(std::move(tool));
      tools_echo.push_back(std::move(e));
    }
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  echo["tool_choice"] = "auto";
  if (const ordered_json* c = field(doc, "tool_choice")) {
    chat["tool_choice"] = translate_tool_choice(*c);
    echo["tool_choice"] = c->is_string() ? *c : ordered_json{{"type", "function"}, {"name", (*c)["name"]}};
  }
  echo["tools"] = std::move(tools_echo);
  echo["truncation"] = "disabled";
  echo["reasoning"] = ordered_json{{"effort", nullptr}, {"summary", nullptr}};
  if (const ordered_json* v = field(doc, "user")) chat["user"] = *v;
  echo["user"] = field(doc, "user") ? doc["user"] : ordered_json(nullptr);
  if (const ordered_json* v = field(doc, "stream")) {
    if (!v->is_boolean()) wrong_type("stream", "a boolean", *v);
    r.stream = v->get<bool>();
    chat["stream"] = r.stream;
  }
  translate_logprobs(doc, chat, echo);
  // Switchyard's (and vLLM's) extensions, as on the other routes.
  for (const char* name : {"top_k", "seed", "priority", "timeout", "queue_timeout", "cache", "ignore_eos"})
    if (const ordered_json* x = field(doc, name)) chat[name] = *x;
  // service_tier, prompt_cache_key, safety_identifier, max_tool_calls, stream_options and
  // fields the router does not know: ignored.
  r.chat_fields = dump(chat);
  r.echo = dump(echo);
  return r;
}

// Items -> chat messages: a function_call joins the assistant turn before it (or opens one), a
// function_call_output is a "tool" message.
void append_messages(const ordered_json& items, ordered_json& messages) {
  for (const ordered_json& it : items) {
    const std::string& type = it.at("type").get_ref<const std::string&>();
    if (type == "message") {
      std::string text;
      for (const ordered_json& part : it.at("content")) text += part.at("text").get<std::string>();
      messages.push_back(ordered_json{{"role", it.at("role")}, {"content", std::move(text)}});
    } else if (type == "function_call") {
      if (messages.empty() || messages.back()["role"] != "assistant")
        messages.push_back(ordered_json{{"role", "assistant"}, {"content", ""}});
      ordered_json& turn = messages.back();
      if (!turn.contains("tool_calls")) turn["tool_calls"] = ordered_json::array();
      turn["tool_calls"].push_back(
          ordered_json{{"id", it.at("call_id")},
                       {"type", "function"},
                       {"function", {{"name", it.at("name")}, {"arguments", it.at("arguments")}}}});
    } else if (type == "function_call_output") {
      messages.push_back(
          ordered_json{{"role", "tool"}, {"tool_call_id", it.at("call_id")}, {"content", it.at("output")}});
    }
  }
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// The OpenAI parser's field names where the Responses API's differ. A message's position in
// `messages` is not the item's in `input` (instructions and history come first): such errors
// name `input`.
api_error responses_names(api_error e) {
  for (std::string* s : {&e.param, &e.message}) {
    replace_all(*s, ".function.parameters", ".parameters");
    replace_all(*s, ".function.name", ".name");
    replace_all(*s, "'max_tokens'", "'max_output_tokens'");
    replace_all(*s, "response_format.json_schema", "text.format");
    replace_all(*s, "'response_format'", "'text.format'");
  }
  if (e.param == "max_tokens") e.param = "max_output_tokens";
  if (e.param == "response_format") e.param = "text.format";
  if (e.param.rfind("messages", 0) == 0) e.param = "input";
  return e;
}

std::string hex_random(size_t digits) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  while (out.size() < digits) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(rng()));
    out += b;
  }
  out.resize(digits);
  return out;
}

// ---- Formatting ----------------------------------------------------------------------------------

const char* item_prefix(responses_item::kind k) {
  switch (k) {
    case responses_item::kind::message:
      return "msg_";
    case responses_item::kind::function_call:
      return "fc_";
    case responses_item::kind::reasoning:
      return "rs_";
  }
  return "item_";
}

// Item ids follow from the response id and the item's place: the same streamed or not.
std::string item_id(const response_meta& meta, responses_item::kind k, size_t index) {
  const std::string_view hex = std::string_view(meta.id).substr(meta.id.rfind('_') + 1);
  return item_prefix(k) + std::string(hex) + "_" + std::to_string(index);
}

ordered_json output_text_part(const std::string& text, const std::vector<token_logprobs>& logprobs = {}) {
  return ordered_json{{"type", "output_text"},
                      {"text", text},
                      {"annotations", ordered_json::array()},
                      {"logprobs", token_logprobs_json(logprobs)}};
}

ordered_json item_json(const responses_item& it, bool incomplete) {
  const char* status = !it.done ? "in_progress" : incomplete ? "incomplete" : "completed";
  switch (it.type) {
    case responses_item::kind::message: {
      ordered_json content = ordered_json::array();
      if (it.done) content.push_back(output_text_part(it.text, it.logprobs));
      return ordered_json{{"id", it.id},
                          {"type", "message"},
                          {"status", status},
                          {"role", "assistant"},
                          {"content", std::move(content)}};
    }
    case responses_item::kind::function_call:
      return ordered_json{{"id", it.id},           {"type", "function_call"},
                          {"status", status},      {"arguments", it.done ? it.text : std::string()},
                          {"call_id", it.call_id}, {"name", it.name}};
    case responses_item::kind::reasoning: {
      ordered_json content = ordered_json::array();
      if (it.done) content.push_back(ordered_json{{"type", "reasoning_text"}, {"text", it.text}});
      return ordered_json{{"id", it.id},
                          {"type", "reasoning"},
                          {"status", status},
                          {"summary", ordered_json::array()},
                          {"content", content}};
    }
  }
  return nullptr;
}

ordered_json usage_json(const usage_info& u) {
  return ordered_json{{"input_tokens", u.prompt_tokens},
                      {"input_tokens_details", {{"cached_tokens", u.cached_tokens}, {"cache_write_tokens", 0}}},
                      {"output_tokens", u.completion_tokens},
                      {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens.value_or(0)}}},
                      {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

// The response object. `status`: in_progress (no usage yet), completed, incomplete or failed.
ordered_json response_json(const response_meta& meta, const responses_state& st, std::string_view status,
                           const usage_info* usage, const api_error* error = nullptr) {
  const ordered_json echo = ordered_json::parse(st.echo, nullptr, false);
  ordered_json j = ordered_json::object();
  j["id"] = meta.id;
  j["object"] = "response";
  j["created_at"] = st.created_at;
  j["status"] = status;
  j["background"] = false;
  j["error"] =
      error ? ordered_json{{"code", error->code.empty() ? error->type : error->code}, {"message", error->message}}
            : ordered_json(nullptr);
  j["incomplete_details"] =
      status == "incomplete" ? ordered_json{{"reason", "max_output_tokens"}} : ordered_json(nullptr);
  j["model"] = meta.model;
  ordered_json output = ordered_json::array();
  const bool incomplete = status == "incomplete";
  for (const responses_item& it : st.items) output.push_back(item_json(it, incomplete));
  j["output"] = std::move(output);
  if (echo.is_object())
    for (auto it = echo.begin(); it != echo.end(); ++it) j[it.key()] = it.value();
  j["store"] = st.store;  // false when this router keeps no responses (docs/router.md)
  j["usage"] = usage ? usage_json(*usage) : ordered_json(nullptr);
  return j;
}

const char* final_status(const responses_state& st) {
  return st.finish == finish_reason::length ? "incomplete" : "completed";
}

// Appends one SSE event ("event: NAME\ndata: JSON"), numbered, a blank line apart from the one before.
void emit(std::string& out, responses_state& st, const char* event, ordered_json data) {
  ordered_json j = ordered_json::object();
  j["type"] = event;
  j["sequence_number"] = st.sequence++;
  for (auto it = data.begin(); it != data.end(); ++it) j[it.key()] = std::move(it.value());
  if (!out.empty()) out += "\n\n";
  out += "event: ";
  out += event;
  out += "\ndata: ";
  out += dump(j);
}

void start(const response_meta& meta, responses_state& st, std::string& out) {
  if (st.started) return;
  st.started = true;
  emit(out, st, "response.created", ordered_json{{"response", response_json(meta, st, "in_progress", nullptr)}});
  emit(out, st, "response.in_progress", ordered_json{{"response", response_json(meta, st, "in_progress", nullptr)}});
}

void close_item(responses_state& st, std::string& out) {
  if (st.open < 0) return;
  const auto idx = static_cast<size_t>(st.open);
  responses_item& it = st.items[idx];
  st.open = -1;
  it.done = true;
  switch (it.type) {
    case responses_item::kind::message:
      // Logprobs that came with no text after them (a last token that makes none) end here.
      for (auto& lp : st.pending_logprobs) it.logprobs.push_back(std::move(lp));
      st.pending_logprobs.clear();
      emit(out, st, "response.output_text.done",
           ordered_json{{"item_id", it.id},
                        {"output_index", idx},
                        {"content_index", 0},
                        {"text", it.text},
                        {"logprobs", token_logprobs_json(it.logprobs)}});
      emit(out, st, "response.content_part.done",
           ordered_json{{"item_id", it.id},
                        {"output_index", idx},
                        {"content_index", 0},
                        {"part", output_text_part(it.text, it.logprobs)}});
      break;
    case responses_item::kind::reasoning:
      emit(out, st, "response.reasoning_text.done",
           ordered_json{{"item_id", it.id}, {"output_index", idx}, {"content_index", 0}, {"text", it.text}});
      emit(out, st, "response.content_part.done",
           ordered_json{{"item_id", it.id},
                        {"output_index", idx},
                        {"content_index", 0},
                        {"part", {{"type", "reasoning_text"}, {"text", it.text}}}});
      break;
    case responses_item::kind::function_call:
      emit(out, st, "response.function_call_arguments.done",
           ordered_json{{"item_id", it.id}, {"output_index", idx}, {"name", it.name}, {"arguments", it.text}});
      break;
  }
  emit(out, st, "response.output_item.done",
       ordered_json{{"output_index", idx}, {"item", item_json(it, st.finish == finish_reason::length)}});
}

responses_item& open_item(const response_meta& meta, responses_state& st, std::string& out, responses_item::kind k,
                          std::string name = {}, std::string call_id = {}) {
  close_item(st, out);
  const size_t idx = st.items.size();
  responses_item it;
  it.type = k;
  it.id = item_id(meta, k, idx);
  it.name = std::move(name);
  it.call_id = std::move(call_id);
  st.items.push_back(std::move(it));
  st.open = static_cast<int32_t>(idx);
  emit(out, st, "response.output_item.added",
       ordered_json{{"output_index", idx}, {"item", item_json(st.items[idx], false)}});
  if (k == responses_item::kind::message)
    emit(out, st, "response.content_part.added",
         ordered_json{{"item_id", st.items[idx].id},
                      {"output_index", idx},
                      {"content_index", 0},
                      {"part", output_text_part("")}});
  if (k == responses_item::kind::reasoning)
    emit(out, st, "response.content_part.added",
         ordered_json{{"item_id", st.items[idx].id},
                      {"output_index", idx},
                      {"content_index", 0},
                      {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  return st.items[idx];
}

bool open_is(const responses_state& st, responses_item::kind k) {
  return st.open >= 0 && st.items[static_cast<size_t>(st.open)].type == k;
}

}  // namespace

std::variant<responses_request, api_error> parse_responses_request(std::string_view body, const api_limits& limits) {
  try {
    const ordered_json doc = ordered_json::parse(body.begin(), body.end());
    if (!doc.is_object()) return bad_request("", "The request body must be a JSON object", "invalid_json");
    responses_request r = translate(doc);
    // Everything but the conversation is checked now, by the one parser: a body that cannot make
    // a chat request fails before any stored conversation is fetched for it.
    auto checked = responses_generation(r, "", limits);
    if (auto* e = std::get_if<api_error>(&checked)) return std::move(*e);
    return r;
  } catch (const rejected& r) {
    return r.error;
  } catch (const nlohmann::json::exception& e) {
    return bad_request("", std::string("The request body is not valid JSON: ") + e.what(), "invalid_json");
  }
}

std::variant<generation_request, api_error> responses_generation(const responses_request& r, std::string_view history,
                                                                 const api_limits& limits) {
  try {
    ordered_json chat = ordered_json::parse(r.chat_fields);
    ordered_json messages = ordered_json::array();
    if (!r.instructions.empty()) messages.push_back(ordered_json{{"role", "system"}, {"content", r.instructions}});
    if (!history.empty()) append_messages(ordered_json::parse(history), messages);
    append_messages(ordered_json::parse(r.input_items), messages);
    if (messages.empty()) reject("input", "'input' holds no message");
    chat["messages"] = std::move(messages);
    auto parsed = parse_generation_request(endpoint::chat_completions, dump(chat), limits);
    if (auto* e = std::get_if<api_error>(&parsed)) return responses_names(std::move(*e));
    return parsed;
  } catch (const rejected& e) {
    return e.error;
  } catch (const nlohmann::json::exception& e) {
    return bad_request("input", std::string("The conversation does not read: ") + e.what(), "invalid_json");
  }
}

std::optional<std::string> responses_history(std::string_view record) {
  const ordered_json rec = ordered_json::parse(record, nullptr, false);
  if (!rec.is_object() || !rec.contains("conversation") || !rec.contains("response")) return std::nullopt;
  ordered_json items = rec["conversation"];
  const ordered_json& output = rec["response"]["output"];
  if (!items.is_array() || !output.is_array()) return std::nullopt;
  for (const ordered_json& it : output) {
    const std::string type = it.value("type", "");
    if (type == "message") {
      ordered_json content = ordered_json::array();
      for (const ordered_json& part : it.value("content", ordered_json::array()))
        content.push_back(ordered_json{{"type", "output_text"}, {"text", part.value("text", "")}});
      items.push_back(ordered_json{{"type", "message"}, {"role", "assistant"}, {"content", std::move(content)}});
    } else if (type == "function_call") {
      items.push_back(ordered_json{{"type", "function_call"},
                                   {"call_id", it.value("call_id", "")},
                                   {"name", it.value("name", "")},
                                   {"arguments", it.value("arguments", "{}")}});
    }  // reasoning: dropped, as given back in input
  }
  return dump(items);
}

std::optional<std::string> responses_stored_response(std::string_view record) {
  const ordered_json rec = ordered_json::parse(record, nullptr, false);
  if (!rec.is_object() || !rec.contains("response") || !rec["response"].is_object()) return std::nullopt;
  return dump(rec["response"]);
}

std::string new_response_id() { return "resp_" + hex_random(32); }

void enable_responses(response_meta& meta, const responses_request& r, std::string_view history, bool store) {
  auto st = std::make_shared<responses_state>();
  st->created_at = meta.created;
  st->echo = r.echo;
  st->store = store && r.store;
  ordered_json conv = history.empty() ? ordered_json::array() : ordered_json::parse(history, nullptr, false);
  if (!conv.is_array()) conv = ordered_json::array();
  for (ordered_json& it : ordered_json::parse(r.input_items)) conv.push_back(std::move(it));
  st->conversation = dump(conv);
  if (meta.tools) st->tools.emplace(*meta.tools);
  meta.responses = std::move(st);
}

std::string responses_response(const response_meta& meta, const std::vector<choice_result>& choices,
                               const usage_info& usage) {
  responses_state& st = *meta.responses;
  const choice_result none;
  const choice_result& c = choices.empty() ? none : choices.front();
  st.items.clear();
  st.finish = c.finish_reason;
  auto add = [&](responses_item::kind k, std::string text, std::string name = {}, std::string call_id = {}) {
    responses_item it;
    it.type = k;
    it.id = item_id(meta, k, st.items.size());
    it.text = std::move(text);
    it.name = std::move(name);
    it.call_id = std::move(call_id);
    it.done = true;
    st.items.push_back(std::move(it));
  };
  std::optional<reasoning_split> thought;
  if (meta.reasoning) thought = split_reasoning(*meta.reasoning, c.text);
  const std::string_view text = thought ? std::string_view(thought->content) : std::string_view(c.text);
  if (thought && !thought->reasoning.empty()) add(responses_item::kind::reasoning, thought->reasoning);
  size_t calls = 0;
  if (meta.tools) {
    tool_output parsed = parse_tool_output(*meta.tools, text);
    if (parsed.has_content && !parsed.content.empty()) add(responses_item::kind::message, std::move(parsed.content));
    for (size_t i = 0; i < parsed.calls.size(); ++i)
      add(responses_item::kind::function_call, std::move(parsed.calls[i].arguments), std::move(parsed.calls[i].name),
          tool_call_id(meta.id, 0, i));
    calls = parsed.calls.size();
  } else if (!text.empty()) {
    add(responses_item::kind::message, std::string(text));
  }
  // An answer with nothing else to show is an empty message, as a stream's is.
  if (calls == 0 && (st.items.empty() || st.items.back().type != responses_item::kind::message))
    add(responses_item::kind::message, "");
  for (responses_item& it : st.items)  // the message's text holds every token's logprob, as a stream's
    if (it.type == responses_item::kind::message) {
      it.logprobs = c.logprobs;
      break;
    }
  st.final_response = dump(response_json(meta, st, final_status(st), &usage));
  return st.final_response;
}

std::string responses_chunk(const response_meta& meta, std::string_view text, finish_reason finish,
                            std::string_view thinking, const std::vector<token_logprobs>& logprobs) {
  responses_state& st = *meta.responses;
  std::string out;
  start(meta, st, out);
  st.pending_logprobs.insert(st.pending_logprobs.end(), logprobs.begin(), logprobs.end());
  const bool done = finish != finish_reason::none;
  if (!thinking.empty()) {
    if (!open_is(st, responses_item::kind::reasoning)) open_item(meta, st, out, responses_item::kind::reasoning);
    responses_item& it = st.items[static_cast<size_t>(st.open)];
    it.text += thinking;
    emit(out, st, "response.reasoning_text.delta",
         ordered_json{
             {"item_id", it.id}, {"output_index", st.open}, {"content_index", 0}, {"delta", std::string(thinking)}});
  }
  tool_stream_delta d;
  if (st.tools) {
    d = st.tools->feed(text, done);
  } else {
    d.content = std::string(text);
  }
  if (!d.content.empty()) {
    if (!open_is(st, responses_item::kind::message)) open_item(meta, st, out, responses_item::kind::message);
    responses_item& it = st.items[static_cast<size_t>(st.open)];
    it.text += d.content;
    // The logprobs received since the last delta go with this one (the thinking's too).
    ordered_json lps = token_logprobs_json(st.pending_logprobs);
    for (auto& lp : st.pending_logprobs) it.logprobs.push_back(std::move(lp));
    st.pending_logprobs.clear();
    emit(out, st, "response.output_text.delta",
         ordered_json{{"item_id", it.id},
                      {"output_index", st.open},
                      {"content_index", 0},
                      {"delta", d.content},
                      {"logprobs", std::move(lps)}});
  }
  for (const tool_call_delta& c : d.calls) {
    if (c.first)
      open_item(meta, st, out, responses_item::kind::function_call, c.name, tool_call_id(meta.id, 0, c.index));
    if (c.arguments.empty() || st.open < 0) continue;
    responses_item& it = st.items[static_cast<size_t>(st.open)];
    it.text += c.arguments;
    emit(out, st, "response.function_call_arguments.delta",
         ordered_json{{"item_id", it.id}, {"output_index", st.open}, {"delta", c.arguments}});
  }
  if (done) {
    st.finish = finish;
    const bool called = std::any_of(st.items.begin(), st.items.end(), [](const responses_item& i) {
      return i.type == responses_item::kind::function_call;
    });
    // An answer with nothing else to show is an empty message, as a whole response's is.
    if (!called && !open_is(st, responses_item::kind::message) &&
        (st.items.empty() || st.items.back().type != responses_item::kind::message))
      open_item(meta, st, out, responses_item::kind::message);
    close_item(st, out);
  }
  return out;  // may be empty: nothing to say yet (the caller sends nothing then)
}

std::string responses_stream_end(const response_meta& meta, const usage_info& usage) {
  responses_state& st = *meta.responses;
  std::string out;
  start(meta, st, out);
  if (st.finish == finish_reason::none) st.finish = finish_reason::stop;
  close_item(st, out);
  const char* status = final_status(st);
  ordered_json resp = response_json(meta, st, status, &usage);
  st.final_response = dump(resp);
  emit(out, st, status == std::string_view("incomplete") ? "response.incomplete" : "response.completed",
       ordered_json{{"response", std::move(resp)}});
  return out;
}

std::string responses_error_event(const response_meta& meta, const api_error& e) {
  responses_state& st = *meta.responses;
  std::string out;
  start(meta, st, out);
  emit(out, st, "error",
       ordered_json{{"code", e.code.empty() ? ordered_json(nullptr) : ordered_json(e.code)},
                    {"message", e.message},
                    {"param", e.param.empty() ? ordered_json(nullptr) : ordered_json(e.param)}});
  emit(out, st, "response.failed", ordered_json{{"response", response_json(meta, st, "failed", nullptr, &e)}});
  return out;
}

std::string responses_record(const responses_state& st) {
  ordered_json rec = ordered_json::object();
  rec["response"] = ordered_json::parse(st.final_response, nullptr, false);
  rec["conversation"] = ordered_json::parse(st.conversation, nullptr, false);
  return dump(rec);
}

std::optional<std::string> format_input_items(std::string_view record, std::string_view response_id, bool desc,
                                              size_t limit, std::string_view after) {
  const ordered_json rec = ordered_json::parse(record, nullptr, false);
  if (!rec.is_object() || !rec.contains("conversation") || !rec["conversation"].is_array()) return std::nullopt;
  const std::string hex(response_id.substr(response_id.rfind('_') + 1));
  std::vector<ordered_json> items;
  const ordered_json& conv = rec["conversation"];
  for (size_t i = 0; i < conv.size(); ++i) {
    const ordered_json& it = conv[i];
    const std::string type = it.value("type", "");
    const char* prefix = type == "message" ? "msg_" : type == "function_call" ? "fc_" : "fco_";
    ordered_json item = ordered_json::object();
    item["id"] = prefix + hex + "_in" + std::to_string(i);
    for (auto f = it.begin(); f != it.end(); ++f) item[f.key()] = f.value();
    if (type == "message" && it.value("role", "") == "assistant")
      for (ordered_json& part : item["content"]) part["annotations"] = ordered_json::array();
    item["status"] = "completed";
    items.push_back(std::move(item));
  }
  if (desc) std::reverse(items.begin(), items.end());
  size_t from = 0;
  if (!after.empty()) {
    while (from < items.size() && items[from]["id"] != after) ++from;
    from = from < items.size() ? from + 1 : items.size();
  }
  ordered_json data = ordered_json::array();
  for (size_t i = from; i < items.size() && data.size() < limit; ++i) data.push_back(items[i]);
  ordered_json j = ordered_json::object();
  j["object"] = "list";
  j["first_id"] = data.empty() ? ordered_json(nullptr) : data.front()["id"];
  j["last_id"] = data.empty() ? ordered_json(nullptr) : data.back()["id"];
  j["has_more"] = from + data.size() < items.size();
  j["data"] = std::move(data);
  return dump(j);
}

std::string format_responses_deleted(std::string_view id) {
  return dump(ordered_json{{"id", std::string(id)}, {"object", "response.deleted"}, {"deleted", true}});
}

}  // namespace sy::router
