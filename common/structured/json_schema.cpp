#include "common/structured/json_schema.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "common/structured/json_schema_parts.hpp"

namespace sy {
namespace {

using json = nlohmann::ordered_json;  // keeps the schema's property order
using grammar::element;
using grammar::sequence;

grammar::byte_set range(int lo, int hi) {
  grammar::byte_set s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return s;
}

sequence cat(std::initializer_list<sequence> parts) {
  sequence out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// The JSON building blocks, each made once per grammar.
struct json_rules {
  grammar::grammar& g;
  uint32_t ws_ = UINT32_MAX, value_ = UINT32_MAX, string_ = UINT32_MAX, char_ = UINT32_MAX, number_ = UINT32_MAX,
           integer_ = UINT32_MAX, object_ = UINT32_MAX, array_ = UINT32_MAX, natural_ = UINT32_MAX, frac_ = UINT32_MAX,
           exp_ = UINT32_MAX;

  // Optional whitespace: nothing, one space, or a newline and up to 20 spaces or tabs (indent).
  element ws() {
    if (ws_ == UINT32_MAX) {
      const uint32_t indent = g.repeat("indent", {g.bytes(range(' ', ' ') | range('\t', '\t'))}, 0, 20);
      ws_ = g.alt_rule("ws", {{}, g.literal(" "), {g.byte('\n'), g.ref(indent)}});
    }
    return g.ref(ws_);
  }
  // One character of a JSON string: unescaped valid UTF-8 or an escape.
  element chr() {
    if (char_ == UINT32_MAX) {
      std::vector<sequence> alts;
      for (const auto& shape : json_schema_parts::unescaped_char_shapes()) {
        sequence alt = {g.bytes(shape.lead)};
        for (const auto& c : shape.rest) alt.push_back(g.bytes(c));
        alts.push_back(std::move(alt));
      }
      grammar::byte_set esc;
      for (char c : std::string_view("\"\\/bfnrt")) esc.set(static_cast<uint8_t>(c));
      const element hex = g.bytes(range('0', '9') | range('a', 'f') | range('A', 'F'));
      alts.push_back({g.byte('\\'), g.bytes(esc)});
      // \uXXXX outside the surrogates, or a surrogate pair: one
      // character each, as a validator counts minLength/maxLength.
      alts.push_back(
          {g.byte('\\'), g.byte('u'), g.bytes(range('0', '9') | range('a', 'c') | range('A', 'C')), hex, hex, hex});
      alts.push_back(
          {g.byte('\\'), g.byte('u'), g.bytes(range('d', 'd') | range('D', 'D')), g.bytes(range('0', '7')), hex, hex});
      alts.push_back({g.byte('\\'), g.byte('u'), g.bytes(range('e', 'f') | range('E', 'F')), hex, hex, hex});
      alts.push_back({g.byte('\\'), g.byte('u'), g.bytes(range('d', 'd') | range('D', 'D')),
                      g.bytes(range('8', '9') | range('a', 'b') | range('A', 'B')), hex, hex, g.byte('\\'), g.byte('u'),
                      g.bytes(range('d', 'd') | range('D', 'D')), g.bytes(range('c', 'f') | range('C', 'F')), hex,
                      hex});
      char_ = g.alt_rule("char", std::move(alts));
    }
    return g.ref(char_);
  }
  element string() {
    if (string_ == UINT32_MAX) {
      const uint32_t chars = g.star("chars", {chr()});
      string_ = g.alt_rule("string", {{g.byte('"'), g.ref(chars), g.byte('"')}});
    }
    return g.ref(string_);
  }
  // Numbers have bounded digits (integer part up to 16, fraction up to 16, exponent up to 3): a
  // sampled model otherwise runs away with digits until max_tokens; beyond 16 significant digits
  // a double (what most parsers read) holds no more anyway.
  element natural() {
    if (natural_ == UINT32_MAX) {
      const uint32_t digits = g.repeat("digits", {g.bytes(range('0', '9'))}, 0, 15);
      natural_ = g.alt_rule("natural", {g.literal("0"), {g.bytes(range('1', '9')), g.ref(digits)}});
    }
    return g.ref(natural_);
  }
  element integer() {
    if (integer_ == UINT32_MAX) integer_ = g.alt_rule("integer", {{natural()}, {g.byte('-'), natural()}});
    return g.ref(integer_);
  }
  // Optional fraction ".ddd" (up to 16 digits) and optional exponent (up to 3 digits).
  element frac() {
    if (frac_ == UINT32_MAX) {
      const uint32_t frac_digits = g.repeat("frac-digits", {g.bytes(range('0', '9'))}, 1, 16);
      frac_ = g.alt_rule("frac", {{}, {g.byte('.'), g.ref(frac_digits)}});
    }
    return g.ref(frac_);
  }
  element exp() {
    if (exp_ == UINT32_MAX) {
      const uint32_t exp_digits = g.repeat("exp-digits", {g.bytes(range('0', '9'))}, 1, 3);
      const uint32_t sign = g.alt_rule("exp-sign", {{}, g.literal("+"), g.literal("-")});
      exp_ = g.alt_rule("exp", {{}, {g.bytes(range('e', 'e') | range('E', 'E')), g.ref(sign), g.ref(exp_digits)}});
    }
    return g.ref(exp_);
  }
  element number() {
    if (number_ == UINT32_MAX) number_ = g.alt_rule("number", {{integer(), frac(), exp()}});
    return g.ref(number_);
  }
  // Any JSON value (recursive: objects and arrays of values).
  element value() {
    if (value_ == UINT32_MAX) {
      value_ = g.new_rule("value");
      object_ = g.new_rule("object");
      array_ = g.new_rule("array");
      // object := "{" ws ( member ( "," ws member )* )? "}", member := string ws ":" ws value ws
      const sequence member = {string(), ws(), g.byte(':'), ws(), g.ref(value_), ws()};
      const uint32_t more_members = g.star("members", cat({{g.byte(','), ws()}, member}));
      g.add_alt(object_, {g.byte('{'), ws(), g.byte('}')});
      g.add_alt(object_, cat({{g.byte('{'), ws()}, member, {g.ref(more_members), g.byte('}')}}));
      const sequence item = {g.ref(value_), ws()};
      const uint32_t more_items = g.star("items", cat({{g.byte(','), ws()}, item}));
      g.add_alt(array_, {g.byte('['), ws(), g.byte(']')});
      g.add_alt(array_, cat({{g.byte('['), ws()}, item, {g.ref(more_items), g.byte(']')}}));
      for (sequence s : {sequence{g.ref(object_)}, sequence{g.ref(array_)}, sequence{string()}, sequence{number()},
                         g.literal("true"), g.literal("false"), g.literal("null")})
        g.add_alt(value_, std::move(s));
    }
    return g.ref(value_);
  }
  element object() {
    value();
    return g.ref(object_);
  }
};

const std::set<std::string, std::less<>> k_annotations = {"title", "description", "default",    "examples", "$schema",
                                                          "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
                                                          "$defs", "definitions", "strict",     "name"};

class compiler {
 public:
  compiler(const json& root, const json_schema_limits& limits) : root_(root), limits_(limits), j_{g_} {}

  grammar::grammar run() {
    g_.root = g_.alt_rule("root", {{node(root_, "#", 0)}});
    const std::string why = g_.check();
    if (!why.empty()) throw json_schema_error("json_schema: the schema makes an unusable grammar: " + why);
    return std::move(g_);
  }

 private:
  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    json_schema_parts::fail(path, what);
  }

  // A keyword whose value cannot restrict a document (`uniqueItems: false`, `additionalItems: true`,
  // `minProperties: 0`, ...): nothing to enforce, so accepted. The same keywords with other values
  // are refused, as every keyword the grammar cannot enforce.
  static bool vacuous(std::string_view k, const json& v) {
    const bool no_schema = (v.is_boolean() && v.get<bool>()) || (v.is_object() && v.empty());  // true or {}
    if (k == "uniqueItems") return v.is_boolean() && !v.get<bool>();
    if (k == "additionalItems" || k == "unevaluatedItems" || k == "unevaluatedProperties" || k == "propertyNames")
      return no_schema;
    if (k == "minProperties" || k == "minContains") return v.is_number_integer() && v.get<int64_t>() == 0;
    if (k == "patternProperties" || k == "dependentRequired" || k == "dependentSchemas" || k == "dependencies")
      return v.is_object() && v.empty();
    return false;
  }

  void check_size(const std::string& path) {
    if (g_.size() > limits_.max_grammar_size) fail(path, "the schema is too large to enforce");
  }

  // The rule for the schema `s` found at `path`.
  element node(const json& s, const std::string& path, int depth) {
    if (depth > limits_.max_depth) fail(path, "nested deeper than " + std::to_string(limits_.max_depth) + " levels");
    check_size(path);
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "the schema `false` admits no document");
      return j_.value();
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items()) {
      if (k_annotations.count(k) || k_structural.count(k) || vacuous(k, v)) continue;
      fail(path + "/" + k, "the keyword `" + k + "` is not supported");
    }
    if (s.contains("$ref")) {
      if (s.size() > 1)
        for (const auto& [k, v] : s.items())
          if (k != "$ref" && !k_annotations.count(k))
            fail(path + "/" + k, "`$ref` with sibling keywords is not supported");
      return ref(s["$ref"], path + "/$ref", depth);
    }
    if (s.contains("const")) return g_.ref(g_.alt_rule(path, {g_.literal(s["const"].dump())}));
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) fail(path + "/enum", "must be a non-empty array");
      std::vector<sequence> alts;
      for (const auto& v : e) alts.push_back(g_.literal(v.dump()));
      return g_.ref(g_.alt_rule(path, std::move(alts)));
    }
    for (const char* comb : {"anyOf", "oneOf"}) {
      if (!s.contains(comb)) continue;
      const json& list = s[comb];
      if (!list.is_array() || list.empty()) fail(path + "/" + comb, "must be a non-empty array");
      if (s.contains("type") || s.contains("properties") || s.contains("items"))
        fail(path + "/" + comb, std::string("`") + comb + "` beside `type`, `properties` or `items` is not supported");
      std::vector<sequence> alts;
      for (size_t i = 0; i < list.size(); ++i)
        alts.push_back({node(list[i], path + "/" + comb + "/" + std::to_string(i), depth + 1)});
      return g_.ref(g_.alt_rule(path, std::move(alts)));
    }
    if (s.contains("allOf")) {
      const json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1) fail(path + "/allOf", "only an `allOf` of one schema is supported");
      return node(list[0], path + "/allOf/0", depth + 1);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const auto& x : t) {
          if (!x.is_string()) fail(path + "/type", "must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        fail(path + "/type", "must be a string or an array of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") || s.contains("format")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return j_.value();
    }
    std::vector<sequence> alts;
    for (const auto& t : types) alts.push_back({typed(s, t, path, depth)});
    if (alts.size() == 1) return alts[0][0];
    return g_.ref(g_.alt_rule(path, std::move(alts)));
  }

  element typed(const json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "string") return string(s, path);
    if (t == "number") return number(s, path);
    if (t == "integer") return integer(s, path);
    if (t == "boolean") return g_.ref(g_.alt_rule("boolean", {g_.literal("true"), g_.literal("false")}));
    if (t == "null") return g_.ref(g_.alt_rule("null", {g_.literal("null")}));
    if (t == "object") return object(s, path, depth);
    if (t == "array") return array(s, path, depth);
    fail(path + "/type", "unknown type `" + t + "`");
  }

  int bound(const json& s, const char* key, const std::string& path, int dflt) {
    if (!s.contains(key)) return dflt;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(path + "/" + key, "must be a non-negative integer");
    if (v.get<int64_t>() > limits_.max_bounded_repeat)
      fail(path + "/" + key, "larger than " + std::to_string(limits_.max_bounded_repeat) + " is not supported");
    return static_cast<int>(v.get<int64_t>());
  }

  element string(const json& s, const std::string& path) {
    const int lo = bound(s, "minLength", path, 0), hi = bound(s, "maxLength", path, -1);
    if (hi >= 0 && hi < lo) fail(path + "/maxLength", "is smaller than minLength");
    if (s.contains("pattern") && s.contains("format"))
      fail(path + "/format", "`format` beside `pattern` is not supported");
    for (const char* k : {"pattern", "format"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_string()) fail(path + "/" + k, "must be a string");
      const std::string text = s[k].get<std::string>(), at = path + "/" + k;
      const sequence content = *k == 'p' ? json_schema_parts::string_pattern(g_, text, at, lo, hi, limits_)
                                         : json_schema_parts::string_format(g_, text, at, lo, hi, limits_);
      return g_.ref(g_.alt_rule(path, {cat({{g_.byte('"')}, content, {g_.byte('"')}})}));
    }
    if (lo == 0 && hi < 0) return j_.string();
    const uint32_t chars = g_.repeat(path + "/chars", {j_.chr()}, lo, hi);
    return g_.ref(g_.alt_rule(path, {{g_.byte('"'), g_.ref(chars), g_.byte('"')}}));
  }

  // A numeric bound keyword's value, if present.
  std::optional<double> numeric(const json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number()) fail(path + "/" + key, "must be a number");
    return s[key].get<double>();
  }

  // minimum/maximum/exclusive* as an exact range (bounds are rounded inwards to integers).
  element integer(const json& s, const std::string& path) {
    std::optional<int64_t> lo, hi;
    auto tighten = [](std::optional<int64_t>& b, int64_t v, bool lower) {
      b = !b ? v : lower ? std::max(*b, v) : std::min(*b, v);
    };
    // Beyond 2^62 a bound cannot matter: the grammar writes at most 16 digits.
    // Integral bounds are read exactly (a double loses units above 2^53).
    auto clamp = [&](const char* key, double v) {
      constexpr int64_t far = 4000000000000000000;
      const json& x = s[key];
      if (x.is_number_unsigned()) return static_cast<int64_t>(std::min<uint64_t>(x.get<uint64_t>(), far));
      if (x.is_number_integer()) return std::clamp<int64_t>(x.get<int64_t>(), -far, far);
      return static_cast<int64_t>(std::clamp(v, -4e18, 4e18));
    };
    if (const auto v = numeric(s, "minimum", path)) tighten(lo, clamp("minimum", std::ceil(*v)), true);
    if (const auto v = numeric(s, "exclusiveMinimum", path))
      tighten(lo, clamp("exclusiveMinimum", std::floor(*v)) + 1, true);
    if (const auto v = numeric(s, "maximum", path)) tighten(hi, clamp("maximum", std::floor(*v)), false);
    if (const auto v = numeric(s, "exclusiveMaximum", path))
      tighten(hi, clamp("exclusiveMaximum", std::ceil(*v)) - 1, false);
    if (!lo && !hi) return j_.integer();
    return json_schema_parts::integer_range(g_, lo, hi, path);
  }

  // Bounds on a number are enforced exactly when there is one, and it is 0: the sign of the number.
  element number(const json& s, const std::string& path) {
    std::vector<std::string> bounds;
    for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"})
      if (numeric(s, k, path)) bounds.push_back(k);
    if (bounds.empty()) return j_.number();
    if (bounds.size() > 1 || *numeric(s, bounds[0].c_str(), path) != 0)
      fail(path + "/" + bounds[0],
           "on a `number`, only a single bound of 0 is supported (`minimum`, `maximum`, "
           "`exclusiveMinimum` or `exclusiveMaximum`); ranges are supported on `integer`");
    const element digit = g_.bytes(range('0', '9')), nonzero = g_.bytes(range('1', '9'));
    // Positive: a nonzero mantissa ([1-9]d{0,15} frac, or 0.d{0,7}[1-9]d{0,7}) and an exponent of at most
    // 2 digits, so that no value underflows to 0 when read as a double (1e-999 does).
    const uint32_t pos_int = g_.repeat(path + "/int", {digit}, 0, 15), some = g_.repeat(path + "/d", {digit}, 0, 7);
    const uint32_t exp_digits = g_.repeat(path + "/e", {digit}, 1, 2);
    const uint32_t exp2 = g_.alt_rule(
        path + "/exp",
        {{},
         {g_.bytes(range('e', 'e') | range('E', 'E')),
          g_.ref(g_.alt_rule(path + "/sign", {{}, g_.literal("+"), g_.literal("-")})), g_.ref(exp_digits)}});
    const uint32_t mantissa = g_.alt_rule(
        path + "/mantissa",
        {{nonzero, g_.ref(pos_int), j_.frac()}, cat({g_.literal("0."), {g_.ref(some), nonzero, g_.ref(some)}})});
    const uint32_t positive = g_.alt_rule(path + "/positive", {{g_.ref(mantissa), g_.ref(exp2)}});
    // Zero: "0" or "0.000" (a zero with an exponent is a trap: 0.4e92 is not zero).
    const sequence zero = {
        g_.byte('0'), g_.ref(g_.alt_rule(path + "/zeros",
                                         {{}, {g_.byte('.'), g_.ref(g_.repeat(path + "/z", {g_.byte('0')}, 1, 16))}}))};
    const std::string& b = bounds[0];
    std::vector<sequence> alts;
    if (b == "minimum") alts = {{j_.natural(), j_.frac(), j_.exp()}};  // no sign: >= 0
    if (b == "exclusiveMinimum") alts = {{g_.ref(positive)}};
    if (b == "maximum") alts = {{g_.byte('-'), j_.natural(), j_.frac(), j_.exp()}, zero};
    if (b == "exclusiveMaximum") alts = {{g_.byte('-'), g_.ref(positive)}};
    return g_.ref(g_.alt_rule(path, std::move(alts)));
  }

  element array(const json& s, const std::string& path, int depth) {
    const int lo = bound(s, "minItems", path, 0), hi = bound(s, "maxItems", path, -1);
    if (hi >= 0 && hi < lo) fail(path + "/maxItems", "is smaller than minItems");
    const element v = s.contains("items") ? node(s["items"], path + "/items", depth + 1) : j_.value();
    const sequence item = {v, j_.ws()};
    const sequence open = {g_.byte('['), j_.ws()};
    if (hi == 0) return g_.ref(g_.alt_rule(path, {cat({open, {g_.byte(']')}})}));
    // "[" ws item ( "," ws item ){lo-1, hi-1} "]", or "[" ws "]" when lo == 0.
    const uint32_t more =
        g_.repeat(path + "/more", cat({{g_.byte(','), j_.ws()}, item}), std::max(lo - 1, 0), hi < 0 ? -1 : hi - 1);
    std::vector<sequence> alts = {cat({open, item, {g_.ref(more), g_.byte(']')}})};
    if (lo == 0) alts.push_back(cat({open, {g_.byte(']')}}));
    return g_.ref(g_.alt_rule(path, std::move(alts)));
  }

  element object(const json& s, const std::string& path, int depth) {
    struct prop {
      std::string key_json;
      element value;
      bool required;
    };
    std::vector<prop> props;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(path + "/required", "must be an array of property names");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) fail(path + "/required", "must be an array of property names");
        required.insert(r.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) fail(path + "/properties", "must be an object");
      for (const auto& [k, v] : s["properties"].items())
        props.push_back({json(k).dump(), node(v, path + "/properties/" + k, depth + 1), required.count(k) > 0});
    }
    for (const auto& r : required) {
      bool found = false;
      for (const auto& p : props) found = found || p.key_json == json(r).dump();
      if (!found) fail(path + "/required", "names `" + r + "`, which is not in `properties`");
    }
    // Extra members: where additionalProperties is true or a schema, or absent from an object that
    // lists no properties; an object that lists properties is closed unless it says otherwise (as
    // llama.cpp's and xgrammar's grammars: docs/structured-outputs.md).
    std::optional<element> extra;
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (!a.is_boolean())
        extra = node(a, path + "/additionalProperties", depth + 1);
      else if (a.get<bool>())
        extra = j_.value();
    } else if (!s.contains("properties")) {
      extra = j_.value();
    }
    const element ws = j_.ws();
    const sequence comma = {g_.byte(','), ws};
    // The tail after the listed properties: extra members, each "," ws key ws ":" ws value ws, the
    // key none of the listed names (json_schema_keys.cpp).
    uint32_t tail_first = UINT32_MAX, tail_more = UINT32_MAX;  // first: no comma before the first
    if (extra) {
      std::vector<std::string> names;
      if (s.contains("properties"))
        for (const auto& [k, v] : s["properties"].items()) names.push_back(k);
      const element key = names.empty() ? j_.string() : json_schema_parts::key_except(g_, names, j_.chr(), path);
      const sequence member = {key, ws, g_.byte(':'), ws, *extra, ws};
      tail_more = g_.star(path + "/extra", cat({comma, member}));
      tail_first = g_.alt_rule(path + "/extra0", {{}, cat({member, {g_.ref(tail_more)}})});
    } else {
      tail_first = tail_more = g_.alt_rule(path + "/end", {{}});
    }
    // rest[k][first]: properties k.. after none (first = 1) or some (first = 0) were written.
    const size_t n = props.size();
    std::vector<std::array<uint32_t, 2>> rest(n + 1);
    rest[n] = {tail_more, tail_first};
    for (size_t k = n; k-- > 0;) {
      for (int first = 0; first < 2; ++first) {
        sequence write = first ? sequence{} : comma;
        write = cat(
            {write, g_.literal(props[k].key_json), {ws, g_.byte(':'), ws, props[k].value, ws, g_.ref(rest[k + 1][0])}});
        std::vector<sequence> alts = {std::move(write)};
        if (!props[k].required) alts.push_back({g_.ref(rest[k + 1][first])});
        rest[k][first] = g_.alt_rule(path + "/p" + std::to_string(k) + (first ? "f" : ""), std::move(alts));
      }
    }
    check_size(path);
    return g_.ref(g_.alt_rule(path, {{g_.byte('{'), ws, g_.ref(rest[0][1]), g_.byte('}')}}));
  }

  element ref(const json& r, const std::string& path, int depth) {
    if (!r.is_string()) fail(path, "must be a string");
    const std::string target = r.get<std::string>();
    if (const auto it = refs_.find(target); it != refs_.end()) return g_.ref(it->second);
    const json* s = nullptr;
    if (target == "#") {
      s = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (target.rfind(p, 0) != 0) continue;
        const std::string name = target.substr(p.size());
        const std::string container = p.substr(2, p.size() - 3);
        if (root_.contains(container) && root_[container].is_object() && root_[container].contains(name))
          s = &root_[container][name];
      }
    }
    if (s == nullptr) fail(path, "cannot resolve `" + target + "` (only #, #/$defs/NAME and #/definitions/NAME)");
    // The rule exists before its body, so a recursive reference finds it.
    const uint32_t rule = g_.new_rule(target);
    refs_.emplace(target, rule);
    g_.add_alt(rule, {node(*s, target, depth + 1)});
    return g_.ref(rule);
  }

  static inline const std::set<std::string, std::less<>> k_structural = {"type",
                                                                         "properties",
                                                                         "required",
                                                                         "additionalProperties",
                                                                         "items",
                                                                         "minItems",
                                                                         "maxItems",
                                                                         "enum",
                                                                         "const",
                                                                         "anyOf",
                                                                         "oneOf",
                                                                         "allOf",
                                                                         "minLength",
                                                                         "maxLength",
                                                                         "$ref",
                                                                         "pattern",
                                                                         "format",
                                                                         "minimum",
                                                                         "maximum",
                                                                         "exclusiveMinimum",
                                                                         "exclusiveMaximum"};

  const json& root_;
  json_schema_limits limits_;
  grammar::grammar g_;
  json_rules j_;
  std::map<std::string, uint32_t> refs_;
};

}  // namespace

grammar::grammar compile_json_schema(std::string_view schema_json, const json_schema_limits& limits) {
  if (schema_json.size() > limits.max_schema_bytes)
    throw json_schema_error("json_schema: larger than " + std::to_string(limits.max_schema_bytes) + " bytes");
  json root;
  try {
    root = json::parse(schema_json);
  } catch (const json::exception& e) {
    throw json_schema_error(std::string("json_schema: not JSON: ") + e.what());
  }
  return compiler(root, limits).run();
}

grammar::grammar json_object_grammar() {
  grammar::grammar g;
  json_rules j{g};
  g.root = g.alt_rule("root", {{j.object()}});
  return g;
}

}  // namespace sy
