// Tool-call schemas, parsing and streaming (see tool_calls.hpp).
#include "router/openai/tool_calls.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

namespace sy::router {

namespace {

// Ordered, so that arguments keep the model's key order and schemas the client's.
using ojson = nlohmann::ordered_json;

constexpr std::string_view k_space = " \t\n\r";

std::string_view rstrip(std::string_view s) {
  const size_t end = s.find_last_not_of(k_space);
  return end == std::string_view::npos ? std::string_view() : s.substr(0, end + 1);
}

std::string_view strip(std::string_view s) {
  const size_t first = s.find_first_not_of(k_space);
  return first == std::string_view::npos ? std::string_view() : rstrip(s.substr(first));
}

std::optional<ojson> parse_json(std::string_view s) {
  ojson j = ojson::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// {"name": N, "arguments" (or Llama's "parameters"): an object, or a string holding one}, N declared.
std::optional<parsed_tool_call> call_of(const tool_parse_spec& spec, const ojson& j) {
  if (!j.is_object()) return std::nullopt;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  parsed_tool_call c;
  c.name = name->get<std::string>();
  if (std::find(spec.names.begin(), spec.names.end(), c.name) == spec.names.end()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end()) {
    c.arguments = "{}";
  } else if (args->is_object()) {
    c.arguments = args->dump();
  } else if (args->is_string()) {
    const auto inner = parse_json(args->get<std::string>());
    if (!inner || !inner->is_object()) return std::nullopt;
    c.arguments = inner->dump();
  } else {
    return std::nullopt;
  }
  return c;
}

// A call object or a non-empty array of them; nothing when any element is not a call.
std::optional<std::vector<parsed_tool_call>> calls_of(const tool_parse_spec& spec, std::string_view text) {
  const auto j = parse_json(strip(text));
  if (!j) return std::nullopt;
  std::vector<parsed_tool_call> out;
  if (j->is_array()) {
    if (j->empty()) return std::nullopt;
    for (const ojson& e : *j) {
      auto c = call_of(spec, e);
      if (!c) return std::nullopt;
      out.push_back(std::move(*c));
    }
  } else {
    auto c = call_of(spec, *j);
    if (!c) return std::nullopt;
    out.push_back(std::move(*c));
  }
  return out;
}

// The body of a DeepSeek block of calls: one or more <｜tool▁call▁begin｜>N<｜tool▁sep｜>ARGS
// <｜tool▁call▁end｜> (V3.1's), or with the body function<｜tool▁sep｜>N\n```json\nARGS\n```
// (V3's and R1's); the last may be cut off after its arguments. Nothing when anything else is
// there or a call is not one.
std::optional<std::vector<parsed_tool_call>> deepseek_calls_of(const tool_parse_spec& spec, std::string_view body) {
  constexpr size_t npos = std::string_view::npos;
  const std::string_view begin = k_deepseek_call_begin, end_tag = k_deepseek_call_end;
  size_t p = body.find(begin);
  if (p == npos || !strip(body.substr(0, p)).empty()) return std::nullopt;
  std::vector<parsed_tool_call> out;
  while (p != npos) {
    const size_t from = p + begin.size(), end = body.find(end_tag, from);
    const std::string_view call = body.substr(from, end == npos ? npos : end - from);
    const size_t sep = call.find(k_deepseek_tool_sep);
    if (sep == npos) return std::nullopt;
    std::string_view name = strip(call.substr(0, sep)), args = strip(call.substr(sep + k_deepseek_tool_sep.size()));
    if (name == "function") {
      const size_t nl = args.find('\n');
      if (nl == npos) return std::nullopt;
      name = strip(args.substr(0, nl));
      args = strip(args.substr(nl + 1));
      if (args.starts_with("```")) args = args.substr(std::min(args.size(), args.find_first_of(k_space)));
      if (args.ends_with("```")) args.remove_suffix(3);
      args = strip(args);
    }
    const auto parsed = parse_json(args);
    if (!parsed) return std::nullopt;
    auto c = call_of(spec, ojson{{"name", std::string(name)}, {"arguments", *parsed}});
    if (!c) return std::nullopt;
    out.push_back(std::move(*c));
    if (end == npos) break;
    const size_t after = end + end_tag.size();
    p = body.find(begin, after);
    if (!strip(body.substr(after, p == npos ? npos : p - after)).empty()) return std::nullopt;
  }
  return out;
}

// A text that is only a call (or calls), maybe in a ``` fence.
std::optional<std::vector<parsed_tool_call>> whole_text_calls(const tool_parse_spec& spec, std::string_view text) {
  std::string_view t = strip(text);
  if (t.substr(0, 3) == "```" && t.size() >= 6 && t.substr(t.size() - 3) == "```") {
    t = t.substr(3, t.size() - 6);
    const size_t nl = t.find('\n');  // the fence's language tag
    if (nl != std::string_view::npos && t.substr(0, nl).find_first_of("{[") == std::string_view::npos)
      t = t.substr(nl + 1);
  }
  return calls_of(spec, t);
}

// ---- Constrained text: the schema's document, scanned as it grows ---------------------------------

// One call object in constrained text: its name once the string is closed; its arguments value
// from the first byte to the last significant one so far (trailing whitespace outside strings is
// left out: it may turn out to follow the value).
struct raw_call {
  std::string name;
  bool named = false;
  size_t args_begin = std::string_view::npos;
  size_t args_end = 0;
  bool args_done = false;
  bool closed = false;
};

// Inside a JSON string literal or not, for a scanner fed one character at a time.
struct json_string_state {
  bool open = false;
  bool escaped = false;  // the previous character was an unescaped backslash
  // `c` inside the string: whether it closes it.
  bool closes_at(char c) {
    if (escaped) {
      escaped = false;
    } else if (c == '\\') {
      escaped = true;
    } else if (c == '"') {
      open = false;
      return true;
    }
    return false;
  }
};

// Call objects sit at depth 1 ({...}) or 2 ([{...}, ...]); properties in schema order, so the
// name comes before the arguments.
std::vector<raw_call> scan_calls(std::string_view s) {
  std::vector<raw_call> calls;
  const size_t first = s.find_first_not_of(k_space);
  const int call_depth = first != std::string_view::npos && s[first] == '[' ? 2 : 1;
  int depth = 0;
  json_string_state str;
  bool expect_key = false, in_args = false;
  size_t str_begin = 0;
  std::string key;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_args) {
      raw_call& cur = calls.back();
      if (!str.open && depth == call_depth && (c == ',' || c == '}')) {
        cur.args_done = true;
        in_args = false;  // and c is the call object's own
      } else {
        const bool space = k_space.find(c) != std::string_view::npos;
        if (cur.args_begin == std::string_view::npos) {
          if (space) continue;
          cur.args_begin = i;
        }
        if (str.open) {
          str.closes_at(c);
          cur.args_end = i + 1;
        } else {
          if (c == '"') str.open = true;
          if (c == '{' || c == '[') ++depth;
          if (c == '}' || c == ']') --depth;
          if (!space) cur.args_end = i + 1;
        }
        continue;
      }
    }
    if (str.open) {
      if (str.closes_at(c)) {
        if (depth == call_depth && !calls.empty()) {
          const std::string_view text = s.substr(str_begin, i - str_begin);
          if (expect_key) {
            key = text;
          } else if (key == "name") {
            calls.back().name = text;  // names are [A-Za-z0-9_-]: no escapes
            calls.back().named = true;
          }
        }
      }
      continue;
    }
    if (c == '"') {
      str.open = true;
      str_begin = i + 1;
    } else if (c == '{' || c == '[') {
      ++depth;
      if (depth == call_depth && c == '{') {
        calls.emplace_back();
        expect_key = true;
      }
    } else if (c == '}' || c == ']') {
      if (depth == call_depth && c == '}' && !calls.empty()) calls.back().closed = true;
      --depth;
    } else if (depth == call_depth && !calls.empty()) {
      if (c == ':') {
        expect_key = false;
        if (key == "arguments") in_args = true;
      } else if (c == ',') {
        expect_key = true;
      }
    }
  }
  return calls;
}

// A call is complete once its arguments are a whole value: the call object is closed, or the
// arguments so far are an object, an array or a string (values nothing can extend; a number
// might still grow a digit). Only the closing `}` can follow them in the call schema.
bool complete(const tool_parse_spec& spec, const raw_call& c, std::string_view text) {
  if (!c.named || c.args_begin == std::string_view::npos) return false;
  if (std::find(spec.names.begin(), spec.names.end(), c.name) == spec.names.end()) return false;
  if (c.closed && c.args_done) return true;
  const auto args = parse_json(text.substr(c.args_begin, c.args_end - c.args_begin));
  return args && (args->is_object() || args->is_array() || args->is_string());
}

// The grammar's document holds only calls: whole, every call; cut by max_tokens (finish_reason
// "length"), the complete calls before the cut, the one cut short dropped (the stream has sent its
// beginning), and never the raw JSON as content (docs/structured-outputs.md).
tool_output constrained_output(const tool_parse_spec& spec, std::string_view text) {
  tool_output out;
  for (const raw_call& c : scan_calls(text)) {
    if (!complete(spec, c, text)) break;
    out.calls.push_back({c.name, std::string(text.substr(c.args_begin, c.args_end - c.args_begin))});
  }
  return out;
}

// ---- Free text ---------------------------------------------------------------------------------------

tool_output free_output(const tool_parse_spec& spec, std::string_view text) {
  tool_output out;
  const std::string_view open = tool_call_open(spec.style), close = tool_call_close(spec.style);
  const size_t at = text.find(open);
  std::optional<std::vector<parsed_tool_call>> calls;
  std::string after;  // text between and after the blocks
  if (at != std::string_view::npos) {
    std::vector<parsed_tool_call> found;
    bool ok = true;
    size_t p = at;
    while (ok && p != std::string_view::npos) {
      const size_t body = p + open.size();
      const size_t end = close.empty() ? std::string_view::npos : text.find(close, body);
      const std::string_view inside =
          text.substr(body, end == std::string_view::npos ? std::string_view::npos : end - body);
      auto block = spec.style == tool_call_style::deepseek ? deepseek_calls_of(spec, inside) : calls_of(spec, inside);
      ok = block.has_value();
      if (ok) found.insert(found.end(), block->begin(), block->end());
      if (end == std::string_view::npos) break;
      const size_t next = text.find(open, end + close.size());
      after.append(text.substr(end + close.size(),
                               next == std::string_view::npos ? std::string_view::npos : next - end - close.size()));
      p = next;
    }
    if (ok) calls = std::move(found);
  }
  if (calls) {
    out.content = std::string(rstrip(text.substr(0, at)));
    const std::string_view rest = strip(after);
    if (!rest.empty()) out.content.append(out.content.empty() ? "" : "\n").append(rest);
  } else if ((calls = whole_text_calls(spec, text))) {
    out.content.clear();
  } else {
    out.content = std::string(text);
    out.has_content = true;
    return out;
  }
  out.has_content = !out.content.empty();
  out.calls = std::move(*calls);
  return out;
}

// FNV-1a, for call ids.
uint64_t fnv1a(std::string_view s, uint64_t h) {
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

std::string tool_request::cache_text() const {
  if (!active()) return {};
  std::string out = choice == tool_choice_mode::automatic  ? "auto"
                    : choice == tool_choice_mode::required ? "required"
                                                           : "named";
  out.append("\n").append(named).append("\n").append(parallel ? "parallel" : "single");
  for (const chat_tool& t : tools) out.append("\n").append(t.definition);
  return out;
}

std::string tool_call_schema(const tool_request& t) {
  // The parameters' $defs / definitions move to the root, where their `#/$defs/NAME` references
  // resolve once the parameters are nested in the call; a name two tools define differently
  // stays where it is (and its references fail to compile: a 400).
  ojson defs = ojson::object();
  auto call = [&defs](const chat_tool& tool) {
    ojson params = tool.parameters.empty() ? ojson{{"type", "object"}, {"additionalProperties", false}}
                                           : ojson::parse(tool.parameters);
    for (const char* container : {"$defs", "definitions"}) {
      const auto it = params.find(container);
      if (it == params.end() || !it->is_object()) continue;
      bool moved = true;
      for (const auto& [name, schema] : it->items()) {
        const auto seen = defs[container].find(name);
        moved = moved && (seen == defs[container].end() || *seen == schema);
      }
      if (!moved) continue;
      for (const auto& [name, schema] : it->items()) defs[container][name] = schema;
      params.erase(container);
    }
    ojson props = ojson::object();
    props["name"] = ojson{{"const", tool.name}};
    props["arguments"] = std::move(params);
    ojson o = ojson::object();
    o["type"] = "object";
    o["properties"] = std::move(props);
    o["required"] = ojson::array({"name", "arguments"});
    o["additionalProperties"] = false;
    return o;
  };
  auto with_defs = [&defs](ojson root) {
    for (auto& [container, entries] : defs.items())
      if (entries.is_object() && !entries.empty()) root[container] = entries;
    return root.dump();
  };
  if (t.choice == tool_choice_mode::named) {
    for (const chat_tool& tool : t.tools)
      if (tool.name == t.named) return with_defs(call(tool));
    return {};
  }
  ojson one;
  if (t.tools.size() == 1) {
    one = call(t.tools.front());
  } else {
    ojson any = ojson::array();
    for (const chat_tool& tool : t.tools) any.push_back(call(tool));
    one = ojson{{"anyOf", std::move(any)}};
  }
  if (!t.parallel) return with_defs(std::move(one));
  ojson arr = ojson::object();
  arr["type"] = "array";
  arr["items"] = std::move(one);
  arr["minItems"] = 1;
  return with_defs(std::move(arr));
}

tool_parse_spec make_parse_spec(const tool_request& t, chat_format f) {
  tool_parse_spec s;
  s.style = tool_style(f);
  s.constrained = t.enforced();
  s.parallel = t.parallel;
  for (const chat_tool& tool : t.tools) s.names.push_back(tool.name);
  return s;
}

tool_output parse_tool_output(const tool_parse_spec& spec, std::string_view text) {
  tool_output out = spec.constrained ? constrained_output(spec, text) : free_output(spec, text);
  if (!spec.parallel && out.calls.size() > 1) out.calls.resize(1);
  return out;
}

std::string tool_call_id(std::string_view response_id, int32_t choice, size_t index) {
  const std::string salt = "/" + std::to_string(choice) + "/" + std::to_string(index);
  const uint64_t a = fnv1a(salt, fnv1a(response_id, 0xcbf29ce484222325ull));
  const uint64_t b = fnv1a(salt, fnv1a(response_id, 0x84222325cbf29ce4ull));
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "call_";
  for (int i = 0; i < 16; ++i) out += hex[(a >> (60 - 4 * i)) & 15];
  for (int i = 0; i < 8; ++i) out += hex[(b >> (60 - 4 * i)) & 15];
  return out;
}

tool_stream_delta tool_call_stream::feed(std::string_view text, bool done) {
  buf_.append(text);
  tool_stream_delta d;
  if (spec_.constrained) {
    feed_constrained(d);
  } else {
    feed_free(d, done);
  }
  return d;
}

void tool_call_stream::feed_constrained(tool_stream_delta& d) {
  const std::vector<raw_call> calls = scan_calls(buf_);
  const size_t n = spec_.parallel ? calls.size() : std::min<size_t>(calls.size(), 1);
  for (size_t i = 0; i < n; ++i) {
    const raw_call& c = calls[i];
    if (!c.named) break;  // later calls wait for this one's name
    tool_call_delta delta;
    delta.index = i;
    if (i >= announced_) {
      delta.first = true;
      delta.name = c.name;
      announced_ = i + 1;
      args_sent_.resize(announced_, 0);
    }
    if (c.args_begin != std::string_view::npos && c.args_end > std::max(args_sent_[i], c.args_begin)) {
      const size_t from = std::max(args_sent_[i], c.args_begin);
      delta.arguments = buf_.substr(from, c.args_end - from);
      args_sent_[i] = c.args_end;
    }
    if (delta.first || !delta.arguments.empty()) d.calls.push_back(std::move(delta));
  }
}

void tool_call_stream::feed_free(tool_stream_delta& d, bool done) {
  const std::string_view open = tool_call_open(spec_.style);
  const std::string_view b = buf_;
  if (!holding_) {
    const size_t first = b.find_first_not_of(k_space);
    if (emitted_ == 0 && first != std::string_view::npos &&
        std::string_view("{[`").find(b[first]) != std::string_view::npos) {
      holding_ = true;  // may be a text that is only a call
    }
  }
  if (!holding_) {
    const size_t at = b.find(open);
    size_t limit = b.size();
    if (at != std::string_view::npos) {
      holding_ = true;  // the rest waits for the end
      limit = at;
    } else {
      // Keep back what may be the start of the marker.
      for (size_t k = std::min(open.size() - 1, b.size()); k > 0; --k) {
        if (b.substr(b.size() - k) == open.substr(0, k)) {
          limit = b.size() - k;
          break;
        }
      }
    }
    // Trailing whitespace waits for what follows it (it is cut before a call).
    limit = rstrip(b.substr(0, limit)).size();
    if (limit > emitted_) {
      d.content = buf_.substr(emitted_, limit - emitted_);
      emitted_ = limit;
    }
  }
  if (!done) return;
  const tool_output out = parse_tool_output(spec_, buf_);
  if (out.calls.empty()) {
    d.content += buf_.substr(emitted_);
    emitted_ = buf_.size();
    return;
  }
  if (out.content.size() > emitted_ && std::string_view(out.content).substr(0, emitted_) == b.substr(0, emitted_))
    d.content += out.content.substr(emitted_);
  for (size_t i = 0; i < out.calls.size(); ++i) d.calls.push_back({i, true, out.calls[i].name, out.calls[i].arguments});
  announced_ = out.calls.size();
}

}  // namespace sy::router
