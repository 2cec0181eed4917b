// Parsing and validation of the OpenAI-compatible API's requests (see openai_request.hpp).
//
// Validation throws `rejected` from the field readers below; parse_generation_request is the
// one place that catches it (and everything else), so no exception leaves this file's parser.
#include "router/openai/openai_request.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>

#include "common/structured/json_schema.hpp"
#include "router/openai/api_errors.hpp"
#include "router/openai/json_fields.hpp"
#include "router/openai/reasoning.hpp"

namespace sy::router {

api_error bad_request(std::string param, std::string message, std::string code) {
  return make_error(400, "invalid_request_error", std::move(code), std::move(message), std::move(param));
}

api_error not_found(std::string code, std::string message, std::string param) {
  return make_error(404, "not_found_error", std::move(code), std::move(message), std::move(param));
}

namespace {

using json = nlohmann::json;
// Output objects keep insertion order, so bodies read in OpenAI's order ("id" first).
using ordered_json = nlohmann::ordered_json;

// ---- Validation helpers ------------------------------------------------------------------------

// rejected, reject, quoted, wrong_type, field, as_string: router/openai/json_fields.hpp (caught only by
// parse_generation_request).
using namespace json_fields;

std::string number_text(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

bool as_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

// Any JSON number (booleans are not numbers). Finite: JSON cannot spell NaN, and an overflowing
// literal (1e999) is out of every range checked below.
double as_number(const json& v, const std::string& param) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  return v.get<double>();
}

// An integral JSON number (5 and 5.0; not 5.5) that fits int64.
int64_t as_int64(const json& v, const std::string& param) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      reject(param, quoted(param) + " is out of range: " + std::to_string(u));
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d != std::trunc(d)) {
      reject(param, quoted(param) + " must be an integer, got " + number_text(d), "invalid_type");
    }
    // 2^63 is exactly representable; anything at or above it (or -inf/+inf) does not fit.
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
      reject(param, quoted(param) + " is out of range: " + number_text(d));
    }
    return static_cast<int64_t>(d);
  }
  wrong_type(param, "an integer", v);
}

int32_t as_int32(const json& v, const std::string& param) {
  const int64_t x = as_int64(v, param);
  if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max()) {
    reject(param, quoted(param) + " is out of range (a 32-bit integer): " + std::to_string(x));
  }
  return static_cast<int32_t>(x);
}

int32_t int_between(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  const int32_t x = as_int32(v, param);
  if (x < lo || x > hi) {
    reject(param, quoted(param) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                      std::to_string(x));
  }
  return x;
}

// A number in [lo, hi], or (lo, hi] when `lo_open`.
double number_between(const json& v, const std::string& param, double lo, bool lo_open, double hi) {
  const double x = as_number(v, param);
  const bool ok = (lo_open ? x > lo : x >= lo) && x <= hi;
  if (!ok) {
    reject(param, quoted(param) + " must be in " + (lo_open ? "(" : "[") + number_text(lo) + ", " + number_text(hi) +
                      "], got " + number_text(x));
  }
  return x;
}

// Any integer (negative, or up to 2^64 - 1), as its uint64 bit pattern.
uint64_t as_seed(const json& v, const std::string& param) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d != std::trunc(d)) {
      reject(param, quoted(param) + " must be an integer, got " + number_text(d), "invalid_type");
    }
    if (d >= 9223372036854775808.0 && d < 18446744073709551616.0) return static_cast<uint64_t>(d);
  }
  return static_cast<uint64_t>(as_int64(v, param));
}

// ---- Request sections ----------------------------------------------------------------------------

// One-year ceiling on "timeout": keeps now + timeout far from any overflow in the caller.
constexpr double k_max_timeout_s = 365.0 * 24 * 3600;

void parse_model(const json& doc, generation_request& r) {
  const json* v = field(doc, "model");
  if (v == nullptr) reject("model", "'model' is required", "missing_required_parameter");
  r.model = as_string(*v, "model");
  if (r.model.empty()) reject("model", "'model' must be a non-empty string");
  if (r.model.size() > proto::k_max_model_id_bytes) {
    reject("model", "'model' is longer than " + std::to_string(proto::k_max_model_id_bytes) + " bytes");
  }
}

// Token ids: a non-empty array of integers in [0, INT32_MAX].
std::vector<int32_t> token_ids(const json& arr, const api_limits& limits) {
  if (arr.empty()) reject("prompt", "'prompt' must not be an empty array");
  const size_t max_tokens = std::min(proto::k_max_prompt_tokens, limits.max_prompt_bytes / sizeof(int32_t));
  if (arr.size() > max_tokens) {
    reject("prompt", "'prompt' has " + std::to_string(arr.size()) + " token ids, more than the limit of " +
                         std::to_string(max_tokens));
  }
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const json& t : arr) {
    if (!t.is_number()) {
      reject("prompt",
             "'prompt' must be a string or an array of token ids; an element is " + std::string(t.type_name()),
             "invalid_type");
    }
    const int32_t id = as_int32(t, "prompt");
    if (id < 0) reject("prompt", "'prompt' token ids must be >= 0, got " + std::to_string(id));
    ids.push_back(id);
  }
  return ids;
}

void prompt_string(const std::string& s, const api_limits& limits, generation_request& r) {
  if (s.empty()) reject("prompt", "'prompt' must not be empty");
  if (s.size() > limits.max_prompt_bytes) {
    reject("prompt", "'prompt' is " + std::to_string(s.size()) + " bytes, more than the limit of " +
                         std::to_string(limits.max_prompt_bytes));
  }
  r.prompt_text = s;
  r.prompt_is_tokens = false;
}

void parse_prompt(const json& doc, const api_limits& limits, generation_request& r) {
  const json* v = field(doc, "prompt");
  if (v == nullptr) reject("prompt", "'prompt' is required", "missing_required_parameter");
  if (v->is_string()) return prompt_string(v->get_ref<const std::string&>(), limits, r);
  if (!v->is_array()) wrong_type("prompt", "a string or an array of token ids", *v);
  if (v->empty()) reject("prompt", "'prompt' must not be an empty array");
  const json& first = v->front();
  if (first.is_string() || first.is_array()) {
    // The batched form: exactly one prompt.
    if (v->size() != 1) {
      reject("prompt", "'prompt' holds " + std::to_string(v->size()) + " prompts; only one per request is supported");
    }
    if (first.is_string()) return prompt_string(first.get_ref<const std::string&>(), limits, r);
    r.prompt_tokens = token_ids(first, limits);
  } else {
    r.prompt_tokens = token_ids(*v, limits);
  }
  r.prompt_is_tokens = true;
}

// An assistant message's `tool_calls`: [{"id", "type": "function", "function": {"name", "arguments"}}].
// Arguments (a JSON string, as OpenAI sends them; an object is taken too) become compact JSON
// text; a string that is not JSON is kept as a JSON string.
void parse_message_calls(const json& v, const std::string& param, chat_message& msg) {
  if (!v.is_array()) wrong_type(param, "an array", v);
  for (size_t k = 0; k < v.size(); ++k) {
    const std::string p = param + "[" + std::to_string(k) + "]";
    const json& c = v[k];
    if (!c.is_object()) wrong_type(p, "an object", c);
    if (const json* t = field(c, "type"); t != nullptr && as_string(*t, p + ".type") != "function")
      reject(p + ".type", quoted(p + ".type") + " must be 'function'");
    const json* fn = field(c, "function");
    if (fn == nullptr) reject(p + ".function", quoted(p + ".function") + " is required", "missing_required_parameter");
    if (!fn->is_object()) wrong_type(p + ".function", "an object", *fn);
    const json* name = field(*fn, "name");
    if (name == nullptr)
      reject(p + ".function.name", quoted(p + ".function.name") + " is required", "missing_required_parameter");
    chat_tool_call call;
    call.name = as_string(*name, p + ".function.name");
    if (const json* id = field(c, "id")) call.id = as_string(*id, p + ".id");
    if (const json* args = field(*fn, "arguments")) {
      if (args->is_string()) {
        const std::string& text = args->get_ref<const std::string&>();
        const ordered_json parsed = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
        call.arguments = parsed.is_discarded() ? ordered_json(text).dump() : parsed.dump();
      } else if (args->is_object()) {
        call.arguments = args->dump();
      } else {
        wrong_type(p + ".function.arguments", "a string", *args);
      }
    }
    msg.tool_calls.push_back(std::move(call));
  }
}

// A message's content: a string, or an array of {"type":"text","text":...} parts (joined).
std::string message_content(const json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) wrong_type(param, "a string or an array of content parts", c);
  std::string text;
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string part_param = param + "[" + std::to_string(j) + "]";
    const json& part = c[j];
    if (!part.is_object()) wrong_type(part_param, "an object", part);
    const json* type = field(part, "type");
    if (type == nullptr)
      reject(part_param + ".type", quoted(part_param + ".type") + " is required", "missing_required_parameter");
    const std::string& t = as_string(*type, part_param + ".type");
    if (t != "text") {
      reject(part_param + ".type",
             quoted(part_param + ".type") + " '" + t + "' is not supported; only 'text' parts are");
    }
    const json* part_text = field(part, "text");
    if (part_text == nullptr) {
      reject(part_param + ".text", quoted(part_param + ".text") + " is required", "missing_required_parameter");
    }
    text += as_string(*part_text, part_param + ".text");
  }
  return text;
}

void parse_messages(const json& doc, const api_limits& limits, generation_request& r) {
  const json* v = field(doc, "messages");
  if (v == nullptr) reject("messages", "'messages' is required", "missing_required_parameter");
  if (!v->is_array()) wrong_type("messages", "an array", *v);
  if (v->empty()) reject("messages", "'messages' must not be empty");
  if (v->size() > limits.max_messages) {
    reject("messages", "'messages' has " + std::to_string(v->size()) + " messages, more than the limit of " +
                           std::to_string(limits.max_messages));
  }
  size_t total_bytes = 0;
  r.messages.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string param = "messages[" + std::to_string(i) + "]";
    const json& m = (*v)[i];
    if (!m.is_object()) wrong_type(param, "an object", m);
    const json* role_v = field(m, "role");
    if (role_v == nullptr)
      reject(param + ".role", quoted(param + ".role") + " is required", "missing_required_parameter");
    std::string role = as_string(*role_v, param + ".role");
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      reject(param + ".role",
             quoted(param + ".role") + " must be one of system, developer, user, assistant, tool; got '" + role + "'");
    }
    chat_message msg;
    if (role == "assistant") {
      if (const json* calls = field(m, "tool_calls")) parse_message_calls(*calls, param + ".tool_calls", msg);
    }
    if (role == "tool") {
      if (const json* id = field(m, "tool_call_id")) msg.tool_call_id = as_string(*id, param + ".tool_call_id");
    }
    for (const chat_tool_call& c : msg.tool_calls) total_bytes += c.name.size() + c.arguments.size();
    const json* content = field(m, "content");
    if (content == nullptr) {
      // An assistant turn may carry no content (e.g. it only called tools).
      if (role != "assistant") {
        reject(param + ".content", quoted(param + ".content") + " is required", "missing_required_parameter");
      }
    } else {
      msg.content = message_content(*content, param + ".content");
    }
    total_bytes += msg.content.size();
    if (total_bytes > limits.max_prompt_bytes) {
      reject("messages",
             "'messages' content is more than the limit of " + std::to_string(limits.max_prompt_bytes) + " bytes");
    }
    msg.role = std::move(role);
    r.messages.push_back(std::move(msg));
  }
  if (total_bytes == 0) reject("messages", "'messages' must not all be empty");
  if (const json* v = field(doc, "enable_thinking")) r.thinking = as_bool(*v, "enable_thinking");
  if (const json* kw = field(doc, "chat_template_kwargs")) {
    if (!kw->is_object()) wrong_type("chat_template_kwargs", "an object", *kw);
    std::optional<bool> qwen3, deepseek;  // the two names of the one switch
    if (const auto it = kw->find("enable_thinking"); it != kw->end())
      qwen3 = as_bool(*it, "chat_template_kwargs.enable_thinking");
    if (const auto it = kw->find("thinking"); it != kw->end()) deepseek = as_bool(*it, "chat_template_kwargs.thinking");
    if (qwen3 && deepseek && *qwen3 != *deepseek)
      reject("chat_template_kwargs.thinking",
             "'chat_template_kwargs.thinking' and 'chat_template_kwargs.enable_thinking' disagree");
    if (qwen3) r.thinking = qwen3;
    if (deepseek) r.thinking = deepseek;
  }
  // vLLM's name. The worker closes the thinking after this many tokens with thinking_end's text
  // (sampling_params; the router drops both where the answer has no reasoning split).
  if (const json* v = field(doc, "thinking_token_budget")) {
    r.sampling.thinking_budget = int_between(*v, "thinking_token_budget", 1, std::numeric_limits<int32_t>::max());
    r.sampling.thinking_end = thinking_end_text();
  }
}

void parse_stop(const json& v, const api_limits& limits, generation_request& r) {
  const size_t max_stop = std::min(limits.max_stop, proto::k_max_stop_strings);
  auto add = [&](const json& s, const std::string& param) {
    const std::string& text = as_string(s, param);
    if (text.empty()) reject("stop", "'stop' strings must not be empty");
    if (text.size() > proto::k_max_stop_bytes) {
      reject("stop", "'stop' strings must be at most " + std::to_string(proto::k_max_stop_bytes) + " bytes");
    }
    r.sampling.stop.push_back(text);
  };
  if (v.is_string()) return add(v, "stop");
  if (!v.is_array()) wrong_type("stop", "a string or an array of strings", v);
  if (v.size() > max_stop) {
    reject("stop",
           "'stop' has " + std::to_string(v.size()) + " strings, more than the limit of " + std::to_string(max_stop));
  }
  for (const json& s : v) add(s, "stop");
}

// n, stream, stream_options, echo, priority, timeout, queue_timeout, user.
void parse_options(const json& doc, endpoint kind, const api_limits& limits, generation_request& r) {
  if (const json* v = field(doc, "n")) r.n = int_between(*v, "n", 1, limits.max_n);
  if (const json* v = field(doc, "stream")) r.stream = as_bool(*v, "stream");
  if (const json* v = field(doc, "stream_options")) {
    if (!v->is_object()) wrong_type("stream_options", "an object", *v);
    if (!r.stream) reject("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (const json* u = field(*v, "include_usage")) r.include_usage = as_bool(*u, "stream_options.include_usage");
    if (const json* u = field(*v, "continuous_usage_stats"))
      r.continuous_usage = as_bool(*u, "stream_options.continuous_usage_stats");
  }
  if (kind == endpoint::completions) {
    if (const json* v = field(doc, "echo")) r.echo = as_bool(*v, "echo");
  }
  if (const json* v = field(doc, "priority")) r.priority = as_int32(*v, "priority");
  if (const json* v = field(doc, "timeout")) {
    const double t = as_number(*v, "timeout");
    if (!(t > 0 && t <= k_max_timeout_s)) {
      reject("timeout",
             "'timeout' must be > 0 and at most " + number_text(k_max_timeout_s) + " seconds, got " + number_text(t));
    }
    r.timeout_s = t;
  }
  if (const json* v = field(doc, "queue_timeout")) {
    const double t = as_number(*v, "queue_timeout");
    if (!(t > 0 && t <= k_max_timeout_s)) {
      reject("queue_timeout", "'queue_timeout' must be > 0 and at most " + number_text(k_max_timeout_s) +
                                  " seconds, got " + number_text(t));
    }
    r.queue_timeout_s = t;
  }
  if (const json* v = field(doc, "user")) r.user = as_string(*v, "user");
}

void parse_sampling(const json& doc, const api_limits& limits, generation_request& r) {
  proto::wire_sampling& s = r.sampling;
  if (const json* v = field(doc, "temperature")) {
    s.temperature = static_cast<float>(number_between(*v, "temperature", 0, false, 2));
  }
  if (const json* v = field(doc, "top_p")) s.top_p = static_cast<float>(number_between(*v, "top_p", 0, true, 1));
  if (const json* v = field(doc, "top_k")) {
    const int32_t k = as_int32(*v, "top_k");
    if (k < -1) reject("top_k", "'top_k' must be -1 or 0 (off) or >= 1, got " + std::to_string(k));
    s.top_k = k < 0 ? 0 : k;
  }
  if (const json* v = field(doc, "min_p")) s.min_p = static_cast<float>(number_between(*v, "min_p", 0, false, 1));
  if (const json* v = field(doc, "repetition_penalty")) {
    s.repetition_penalty = static_cast<float>(number_between(*v, "repetition_penalty", 0, true, 2));
  }
  // Accepted for compatibility; the sampler has no presence/frequency penalties.
  if (const json* v = field(doc, "presence_penalty")) number_between(*v, "presence_penalty", -2, false, 2);
  if (const json* v = field(doc, "frequency_penalty")) number_between(*v, "frequency_penalty", -2, false, 2);
  if (const json* v = field(doc, "seed")) {
    s.seed = as_seed(*v, "seed");
    s.has_seed = true;
  }
  // max_completion_tokens (the newer name) wins when both are given; both are validated.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (const json* v = field(doc, name)) {
      s.max_tokens = int_between(*v, name, 1, limits.max_tokens_cap);
      r.max_tokens_given = true;
    }
  }
  if (const json* v = field(doc, "stop")) parse_stop(*v, limits, r);
  if (const json* v = field(doc, "ignore_eos")) s.ignore_eos = as_bool(*v, "ignore_eos");
  if (const json* v = field(doc, "cache")) r.cache = as_bool(*v, "cache");
}

void parse_logprobs(const json& doc, endpoint kind, const api_limits& limits, generation_request& r) {
  const int32_t max_top = std::min(limits.max_top_logprobs, proto::k_max_top_logprobs);
  const json* v = field(doc, "logprobs");
  if (kind == endpoint::completions) {
    // An int (alternatives per token); true/false are accepted too (true: none, but wanted).
    if (v == nullptr) return;
    if (v->is_boolean()) {
      r.want_logprobs = v->get<bool>();
      return;
    }
    r.sampling.logprobs = int_between(*v, "logprobs", 0, max_top);
    r.want_logprobs = true;
    return;
  }
  if (v != nullptr) r.want_logprobs = as_bool(*v, "logprobs");
  if (const json* top = field(doc, "top_logprobs")) {
    const int32_t k = int_between(*top, "top_logprobs", 0, max_top);
    if (!r.want_logprobs) reject("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
    r.sampling.logprobs = k;
  }
}

// The body as a JSON object, or rejected with code invalid_json.
json parse_body(std::string_view body) {
  json doc;
  try {
    doc = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    // A parse_error, or out_of_range for a number literal no double holds (1e999). e.what()
    // starts with "[json.exception.parse_error.101] "; keep the readable part.
    std::string what = e.what();
    const size_t cut = what.find("] ");
    if (cut != std::string::npos) what.erase(0, cut + 2);
    reject("", "The request body is not valid JSON: " + what, "invalid_json");
  }
  if (!doc.is_object()) {
    reject("", std::string("The request body must be a JSON object, got ") + doc.type_name(), "invalid_json");
  }
  return doc;
}

// response_format -> r.constraint. `body`: the schema is re-read from it in document order
// (`json` sorts object keys; the order of a schema's properties is the order of the output).
void parse_response_format(const json& doc, std::string_view body, generation_request& r) {
  const json* v = field(doc, "response_format");
  if (v == nullptr) return;
  const std::string p = "response_format";
  if (!v->is_object()) wrong_type(p, "an object", *v);
  const json* t = field(*v, "type");
  if (t == nullptr) reject(p + ".type", "'response_format.type' is required", "missing_required_parameter");
  const std::string& type = as_string(*t, p + ".type");
  if (type == "text") return;
  if (type == "json_object") {
    r.constraint.kind = "json_object";
    return;
  }
  if (type != "json_schema")
    reject(p + ".type", "'response_format.type' must be one of text, json_object, json_schema, got '" + type + "'");
  const json* js = field(*v, "json_schema");
  if (js == nullptr)
    reject(p + ".json_schema", "'response_format.json_schema' is required for type json_schema",
           "missing_required_parameter");
  if (!js->is_object()) wrong_type(p + ".json_schema", "an object", *js);
  if (const json* name = field(*js, "name")) as_string(*name, p + ".json_schema.name");
  if (const json* strict = field(*js, "strict")) as_bool(*strict, p + ".json_schema.strict");
  const json* schema = field(*js, "schema");
  if (schema == nullptr)
    reject(p + ".json_schema.schema", "'response_format.json_schema.schema' is required", "missing_required_parameter");
  if (!schema->is_object() && !schema->is_boolean()) wrong_type(p + ".json_schema.schema", "an object", *schema);
  std::string text = ordered_json::parse(body.begin(), body.end())["response_format"]["json_schema"]["schema"].dump();
  if (text.size() > proto::k_max_schema_bytes)
    reject(p + ".json_schema.schema",
           "the schema is larger than " + std::to_string(proto::k_max_schema_bytes) + " bytes");
  try {
    compile_json_schema(text);  // refused here, with the keyword named, rather than by the worker
  } catch (const json_schema_error& e) {
    reject(p + ".json_schema.schema", e.what());
  }
  r.constraint.kind = "json_schema";
  r.constraint.schema = std::move(text);
}

constexpr size_t k_max_tools = 128;  // OpenAI's limit

// tools[i]: {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}.
// `ordered`: the same item in document order (definitions and schemas keep the client's order).
chat_tool parse_tool(const json& t, const ordered_json& ordered, const std::string& p) {
  if (!t.is_object()) wrong_type(p, "an object", t);
  const json* type = field(t, "type");
  if (type == nullptr) reject(p + ".type", quoted(p + ".type") + " is required", "missing_required_parameter");
  if (as_string(*type, p + ".type") != "function")
    reject(p + ".type", quoted(p + ".type") + " must be 'function', got '" + type->get<std::string>() + "'");
  const json* fn = field(t, "function");
  if (fn == nullptr) reject(p + ".function", quoted(p + ".function") + " is required", "missing_required_parameter");
  if (!fn->is_object()) wrong_type(p + ".function", "an object", *fn);
  const json* name = field(*fn, "name");
  if (name == nullptr)
    reject(p + ".function.name", quoted(p + ".function.name") + " is required", "missing_required_parameter");
  chat_tool tool;
  tool.name = as_string(*name, p + ".function.name");
  const bool name_ok =
      !tool.name.empty() && tool.name.size() <= 64 && std::all_of(tool.name.begin(), tool.name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
      });
  if (!name_ok)
    reject(p + ".function.name",
           quoted(p + ".function.name") + " must be 1 to 64 letters, digits, '_' or '-', got '" + tool.name + "'");
  if (const json* d = field(*fn, "description")) as_string(*d, p + ".function.description");
  if (const json* st = field(*fn, "strict")) as_bool(*st, p + ".function.strict");
  const ordered_json& ofn = ordered["function"];
  ordered_json def_fn = ordered_json::object();
  def_fn["name"] = tool.name;
  if (ofn.contains("description") && !ofn["description"].is_null()) def_fn["description"] = ofn["description"];
  if (const json* params = field(*fn, "parameters")) {
    if (!params->is_object()) wrong_type(p + ".function.parameters", "an object (a JSON Schema)", *params);
    tool.parameters = ofn["parameters"].dump();
    if (tool.parameters.size() > proto::k_max_schema_bytes)
      reject(p + ".function.parameters",
             "the schema is larger than " + std::to_string(proto::k_max_schema_bytes) + " bytes");
    def_fn["parameters"] = ofn["parameters"];
  }
  tool.definition = ordered_json{{"type", "function"}, {"function", std::move(def_fn)}}.dump();
  return tool;
}

// tools, tool_choice, parallel_tool_calls -> r.tools (and r.constraint under an enforced choice).
void parse_tools(const json& doc, std::string_view body, generation_request& r) {
  tool_request& t = r.tools;
  if (const json* v = field(doc, "tools")) {
    if (!v->is_array()) wrong_type("tools", "an array of tools", *v);
    if (v->size() > k_max_tools)
      reject("tools", "'tools' has " + std::to_string(v->size()) + " tools, more than the limit of " +
                          std::to_string(k_max_tools));
    const ordered_json ordered = ordered_json::parse(body.begin(), body.end())["tools"];
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string p = "tools[" + std::to_string(i) + "]";
      chat_tool tool = parse_tool((*v)[i], ordered[i], p);
      for (const chat_tool& seen : t.tools)
        if (seen.name == tool.name) reject(p + ".function.name", "two tools are named '" + tool.name + "'");
      t.tools.push_back(std::move(tool));
    }
  }
  t.choice = t.tools.empty() ? tool_choice_mode::none : tool_choice_mode::automatic;
  if (const json* v = field(doc, "tool_choice")) {
    if (v->is_string()) {
      const std::string& c = v->get_ref<const std::string&>();
      if (c == "none") {
        t.choice = tool_choice_mode::none;
      } else if (c == "auto") {
        t.choice = tool_choice_mode::automatic;
      } else if (c == "required") {
        t.choice = tool_choice_mode::required;
      } else {
        reject("tool_choice",
               "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
               "\"function\": {\"name\": ...}}, got '" +
                   c + "'");
      }
    } else if (v->is_object()) {
      const json* type = field(*v, "type");
      if (type == nullptr || !type->is_string() || type->get<std::string>() != "function")
        reject("tool_choice.type", "'tool_choice.type' must be 'function'");
      const json* fn = field(*v, "function");
      if (fn == nullptr || !fn->is_object())
        reject("tool_choice.function", "'tool_choice.function' must be an object with a 'name'",
               "missing_required_parameter");
      const json* name = field(*fn, "name");
      if (name == nullptr)
        reject("tool_choice.function.name", "'tool_choice.function.name' is required", "missing_required_parameter");
      t.named = as_string(*name, "tool_choice.function.name");
      t.choice = tool_choice_mode::named;
    } else {
      wrong_type("tool_choice", "a string or an object", *v);
    }
  }
  if (const json* v = field(doc, "parallel_tool_calls")) t.parallel = as_bool(*v, "parallel_tool_calls");
  if (t.enforced() && t.tools.empty())
    reject("tool_choice", "'tool_choice' " +
                              std::string(t.choice == tool_choice_mode::named ? "naming a function" : "'required'") +
                              " needs 'tools'");
  if (t.choice == tool_choice_mode::named &&
      std::none_of(t.tools.begin(), t.tools.end(), [&](const chat_tool& x) { return x.name == t.named; }))
    reject("tool_choice.function.name", "'tool_choice' names the function '" + t.named + "', which is not in 'tools'");
  if (!t.enforced()) return;
  if (!r.constraint.kind.empty())
    reject("response_format", "'response_format' must be text when 'tool_choice' is required or names a function");
  for (size_t i = 0; i < t.tools.size(); ++i) {
    if (t.tools[i].parameters.empty()) continue;
    if (t.choice == tool_choice_mode::named && t.tools[i].name != t.named) continue;
    try {
      compile_json_schema(t.tools[i].parameters);  // what the grammar cannot enforce is named here
    } catch (const json_schema_error& e) {
      reject("tools[" + std::to_string(i) + "].function.parameters", e.what());
    }
  }
  std::string schema = tool_call_schema(t);
  try {
    compile_json_schema(schema);
  } catch (const json_schema_error& e) {
    reject("tools", std::string("the tool-call schema cannot be enforced: ") + e.what());
  }
  r.constraint.kind = "json_schema";
  r.constraint.schema = std::move(schema);
}

generation_request parse_checked(endpoint kind, std::string_view body, const api_limits& limits) {
  const json doc = parse_body(body);
  generation_request r;
  r.kind = kind;
  r.sampling.temperature = 1.f;  // OpenAI's default; the wire default (0) is greedy
  r.sampling.top_p = 1.f;
  parse_model(doc, r);
  if (kind == endpoint::completions) {
    parse_prompt(doc, limits, r);
  } else {
    parse_messages(doc, limits, r);
  }
  parse_options(doc, kind, limits, r);
  parse_sampling(doc, limits, r);
  parse_logprobs(doc, kind, limits, r);
  // The ranges every sampling_params obeys (the API's own bounds above are tighter or equal).
  if (const auto e = validate(r.sampling)) reject(e->field, "'" + e->field + "' is " + e->message);
  parse_response_format(doc, body, r);
  if (kind == endpoint::chat_completions) parse_tools(doc, body, r);
  return r;
}

// The one place parsing exceptions stop: a rejection becomes its error, anything else a 500.
template <class T, class F>
std::variant<T, api_error> guarded(F&& parse) {
  try {
    return parse();
  } catch (rejected& r) {
    return std::move(r.error);
  } catch (const std::bad_alloc&) {
    api_error e;
    e.status = 500;
    e.type = "server_error";
    e.code = "out_of_memory";
    e.message = "The server ran out of memory while parsing the request";
    return e;
  } catch (const std::exception& ex) {
    api_error e;
    e.status = 500;
    e.type = "server_error";
    e.code = "internal_error";
    e.message = std::string("Internal error while parsing the request: ") + ex.what();
    return e;
  } catch (...) {
    api_error e;
    e.status = 500;
    e.type = "server_error";
    e.code = "internal_error";
    e.message = "Internal error while parsing the request";
    return e;
  }
}

// "model" when given: a non-empty string of bounded size (empty: not given).
std::string optional_model(const json& doc) {
  const json* v = field(doc, "model");
  if (v == nullptr) return "";
  const std::string& m = as_string(*v, "model");
  if (m.size() > proto::k_max_model_id_bytes)
    reject("model", "'model' is longer than " + std::to_string(proto::k_max_model_id_bytes) + " bytes");
  return m;
}

tokenize_request parse_tokenize_checked(std::string_view body, const api_limits& limits) {
  const json doc = parse_body(body);
  tokenize_request r;
  r.model = optional_model(doc);
  const char* prompt_key = field(doc, "prompt") ? "prompt" : "content";  // llama-server says "content"
  const json* prompt = field(doc, prompt_key);
  if (prompt != nullptr && field(doc, "messages") != nullptr)
    reject("messages", "give 'prompt' or 'messages', not both");
  if (prompt != nullptr) {
    r.prompt = as_string(*prompt, prompt_key);
    if (r.prompt.size() > limits.max_prompt_bytes)
      reject(prompt_key, "'" + std::string(prompt_key) + "' is " + std::to_string(r.prompt.size()) +
                             " bytes, more than the limit of " + std::to_string(limits.max_prompt_bytes));
  } else if (field(doc, "messages") != nullptr) {
    generation_request g;  // the messages exactly as /v1/chat/completions reads them
    parse_messages(doc, limits, g);
    r.messages = std::move(g.messages);
    r.thinking = g.thinking;
    r.is_chat = true;
  } else {
    reject("prompt", "'prompt' (or 'messages') is required", "missing_required_parameter");
  }
  for (const char* key : {"add_special", "add_special_tokens"})  // the second (vLLM's) wins
    if (const json* v = field(doc, key)) r.add_special_tokens = as_bool(*v, key);
  if (const json* v = field(doc, "add_generation_prompt"))
    r.add_generation_prompt = as_bool(*v, "add_generation_prompt");
  if (const json* v = field(doc, "return_token_strs")) r.return_token_strs = as_bool(*v, "return_token_strs");
  return r;
}

detokenize_request parse_detokenize_checked(std::string_view body, const api_limits& limits) {
  const json doc = parse_body(body);
  detokenize_request r;
  r.model = optional_model(doc);
  const json* v = field(doc, "tokens");
  if (v == nullptr) reject("tokens", "'tokens' is required", "missing_required_parameter");
  if (!v->is_array()) wrong_type("tokens", "an array of token ids", *v);
  const size_t max_tokens = std::min(proto::k_max_prompt_tokens, limits.max_prompt_bytes / sizeof(int32_t));
  if (v->size() > max_tokens)
    reject("tokens",
           "'tokens' has " + std::to_string(v->size()) + " ids, more than the limit of " + std::to_string(max_tokens));
  r.tokens.reserve(v->size());
  for (const json& t : *v) {
    const int32_t id = as_int32(t, "tokens");
    if (id < 0) reject("tokens", "'tokens' ids must be >= 0, got " + std::to_string(id));
    r.tokens.push_back(id);
  }
  return r;
}

}  // namespace

std::variant<generation_request, api_error> parse_generation_request(endpoint kind, std::string_view body,
                                                                     const api_limits& limits) {
  return guarded<generation_request>([&] { return parse_checked(kind, body, limits); });
}

std::variant<tokenize_request, api_error> parse_tokenize_request(std::string_view body, const api_limits& limits) {
  return guarded<tokenize_request>([&] { return parse_tokenize_checked(body, limits); });
}

std::variant<detokenize_request, api_error> parse_detokenize_request(std::string_view body, const api_limits& limits) {
  return guarded<detokenize_request>([&] { return parse_detokenize_checked(body, limits); });
}

}  // namespace sy::router
