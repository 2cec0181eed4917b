#include "router/openai/embeddings_api.hpp"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/wire/protocol.hpp"
#include "router/openai/json_fields.hpp"

namespace sy::router {
namespace {

using json = nlohmann::json;

// rejected, reject, wrong_type, field, as_string: router/openai/json_fields.hpp (caught in
// parse_embedding_request).
using namespace json_fields;

// An integer in [lo, hi] (a float with no fraction counts).
int64_t int_in(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  double d = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
      reject(param, "'" + param + "' must be at most " + std::to_string(hi));
    d = static_cast<double>(v.get<int64_t>());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      reject(param, "'" + param + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                        std::to_string(x));
    return x;
  }
  if (!v.is_number_float()) wrong_type(param, "an integer", v);
  d = v.get<double>();
  if (!std::isfinite(d) || d != std::trunc(d)) reject(param, "'" + param + "' must be an integer", "invalid_type");
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    reject(param, "'" + param + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return static_cast<int64_t>(d);
}

// An array of token ids (non-empty, each in [0, INT32_MAX]).
std::vector<int32_t> token_ids(const json& arr, const std::string& param) {
  if (arr.empty()) reject(param, "'" + param + "' must not be an empty array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const json& t : arr) {
    if (!t.is_number())
      reject(param, "'" + param + "' mixes token ids with " + std::string(t.type_name()) + "s", "invalid_type");
    ids.push_back(static_cast<int32_t>(int_in(t, param, 0, std::numeric_limits<int32_t>::max())));
  }
  return ids;
}

void parse_input(const json& v, const api_limits& limits, embedding_request& r) {
  const char* k = "input";
  size_t bytes = 0, tokens = 0;
  const size_t max_tokens = std::min(proto::k_max_prompt_tokens, limits.max_prompt_bytes / sizeof(int32_t));
  auto add_text = [&](const json& s, const std::string& param) {
    std::string t = as_string(s, param);
    if (t.empty()) reject(param, "'" + param + "' must not be an empty string");
    bytes += t.size();
    if (bytes > limits.max_prompt_bytes)
      reject(k, "'input' has more than " + std::to_string(limits.max_prompt_bytes) + " bytes of text");
    r.texts.push_back(std::move(t));
  };
  auto add_tokens = [&](std::vector<int32_t> ids) {
    tokens += ids.size();
    if (tokens > max_tokens) reject(k, "'input' has more than " + std::to_string(max_tokens) + " token ids");
    r.token_inputs.push_back(std::move(ids));
  };
  if (v.is_string()) {
    add_text(v, k);
    return;
  }
  if (!v.is_array())
    wrong_type(k, "a string, an array of strings, an array of token ids or an array of token-id arrays", v);
  if (v.empty()) reject(k, "'input' must not be an empty array");
  if (v.size() > k_max_embedding_inputs)
    reject(k, "'input' has " + std::to_string(v.size()) + " items, more than the limit of " +
                  std::to_string(k_max_embedding_inputs));
  const json& first = v.front();
  if (first.is_number()) {  // one input as token ids
    add_tokens(token_ids(v, k));
    return;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const json& item = v[i];
    const std::string param = "input[" + std::to_string(i) + "]";
    if (first.is_string()) {
      if (!item.is_string()) wrong_type(param, "a string (like input[0])", item);
      add_text(item, param);
    } else if (first.is_array()) {
      if (!item.is_array()) wrong_type(param, "an array of token ids (like input[0])", item);
      add_tokens(token_ids(item, param));
    } else {
      wrong_type(param, "a string, a token id or an array of token ids", item);
    }
  }
}

// One-year ceiling on "timeout", as for generations.
constexpr double k_max_timeout_s = 365.0 * 24 * 3600;

embedding_request parse(std::string_view body, const api_limits& limits) {
  json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) reject("", "the request body is not valid JSON", "invalid_json");
  if (!doc.is_object()) reject("", "the request body must be a JSON object", "invalid_json");
  embedding_request r;
  const json* m = field(doc, "model");
  if (m == nullptr) reject("model", "'model' is required", "missing_required_parameter");
  r.model = as_string(*m, "model");
  if (r.model.empty()) reject("model", "'model' must be a non-empty string");
  if (r.model.size() > proto::k_max_model_id_bytes)
    reject("model", "'model' is longer than " + std::to_string(proto::k_max_model_id_bytes) + " bytes");
  const json* in = field(doc, "input");
  if (in == nullptr) reject("input", "'input' is required", "missing_required_parameter");
  parse_input(*in, limits, r);
  if (const json* v = field(doc, "encoding_format")) {
    const std::string f = as_string(*v, "encoding_format");
    if (f != "float" && f != "base64")
      reject("encoding_format", "'encoding_format' must be \"float\" or \"base64\", got \"" + f + "\"");
    r.base64 = f == "base64";
  }
  if (const json* v = field(doc, "dimensions"))
    r.dimensions = static_cast<uint32_t>(int_in(*v, "dimensions", 1, std::numeric_limits<int32_t>::max()));
  if (const json* v = field(doc, "user")) r.user = as_string(*v, "user");
  if (const json* v = field(doc, "priority"))
    r.priority = static_cast<int32_t>(
        int_in(*v, "priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
  if (const json* v = field(doc, "timeout")) {
    if (!v->is_number()) wrong_type("timeout", "a number", *v);
    const double t = v->get<double>();
    if (!(t > 0 && t <= k_max_timeout_s))
      reject("timeout",
             "'timeout' must be > 0 and at most " + std::to_string(static_cast<int64_t>(k_max_timeout_s)) + " seconds");
    r.timeout_s = t;
  }
  if (const json* v = field(doc, "queue_timeout")) {
    if (!v->is_number()) wrong_type("queue_timeout", "a number", *v);
    const double t = v->get<double>();
    if (!(t > 0 && t <= k_max_timeout_s))
      reject("queue_timeout", "'queue_timeout' must be > 0 and at most " +
                                  std::to_string(static_cast<int64_t>(k_max_timeout_s)) + " seconds");
    r.queue_timeout_s = t;
  }
  return r;
}

void append_float(std::string& out, float x) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);
  out.append(buf, res.ptr);
}

}  // namespace

std::variant<embedding_request, api_error> parse_embedding_request(std::string_view body, const api_limits& limits) {
  try {
    return parse(body, limits);
  } catch (const rejected& r) {
    return r.error;
  }
}

std::string base64_floats(std::span<const float> v) {
  static constexpr char k_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(v[i]);
    for (size_t b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<char>((u >> (8 * b)) & 0xff);  // little-endian
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t chunk = 0;
    for (size_t j = 0; j < 3; ++j) chunk = (chunk << 8) | (j < n ? static_cast<uint8_t>(bytes[i + j]) : 0u);
    for (size_t j = 0; j < 4; ++j) out += j <= n ? k_alphabet[(chunk >> (18 - 6 * j)) & 63] : '=';
  }
  return out;
}

std::string format_embeddings(std::string_view model, const std::vector<std::vector<float>>& data, bool base64,
                              uint32_t prompt_tokens) {
  std::string out = "{\"object\":\"list\",\"data\":[";
  for (size_t i = 0; i < data.size(); ++i) {
    if (i > 0) out += ',';
    out += "{\"object\":\"embedding\",\"index\":" + std::to_string(i) + ",\"embedding\":";
    if (base64) {
      out += '"' + base64_floats(data[i]) + '"';
    } else {
      out += '[';
      for (size_t k = 0; k < data[i].size(); ++k) {
        if (k > 0) out += ',';
        append_float(out, data[i][k]);
      }
      out += ']';
    }
    out += '}';
  }
  // The model name as the client gave it, escaped by the JSON library.
  out += "],\"model\":" + json(std::string(model)).dump() +
         ",\"usage\":{\"prompt_tokens\":" + std::to_string(prompt_tokens) +
         ",\"total_tokens\":" + std::to_string(prompt_tokens) + "}}";
  return out;
}

}  // namespace sy::router
