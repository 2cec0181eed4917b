// Byte grammars, the JSON Schema compiler and token masks (constrained decoding). The matcher is
// checked on documents it must accept and reject; masks are checked token by token against the
// matcher itself on the real SmolLM2 vocabulary.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf.hpp"
#include "common/structured/grammar.hpp"
#include "common/structured/json_schema.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "tests/unit/prerequisite.hpp"
#include "worker/engine/token_mask.hpp"

using namespace sy;

namespace {

bool accepts(const grammar::grammar& g, std::string_view doc) {
  const grammar::matcher m(g);
  const auto s = m.accept(m.initial(), doc);
  return s.accepting();
}

bool schema_accepts(std::string_view schema, std::string_view doc) { return accepts(compile_json_schema(schema), doc); }

std::string schema_error(std::string_view schema) {
  try {
    compile_json_schema(schema);
  } catch (const json_schema_error& e) {
    return e.what();
  }
  return {};
}

// The value of a JSON string literal written by the grammar (escapes as json_schema writes them).
std::string unquote(std::string_view doc) {
  REQUIRE(doc.size() >= 2);
  REQUIRE(doc.front() == '"');
  REQUIRE(doc.back() == '"');
  std::string out;
  for (size_t i = 1; i + 1 < doc.size(); ++i) {
    if (doc[i] != '\\') {
      out += doc[i];
      continue;
    }
    const char e = doc[++i];
    if (e == 'u') {
      out += static_cast<char>(std::stoi(std::string(doc.substr(i + 1, 4)), nullptr, 16));
      i += 4;
      continue;
    }
    const std::string_view from = "nrtfb", to = "\n\r\t\f\b";
    const size_t k = from.find(e);
    out += k == std::string_view::npos ? e : to[k];
  }
  return out;
}

// {"type":"string","pattern":RE} with RE as a JSON string.
std::string pattern_schema(std::string_view re) {
  std::string q;
  for (char c : re) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return R"({"type":"string","pattern":")" + q + "\"}";
}

// The pattern without a leading ^ and a trailing $ (none of the test patterns ends with "\\$").
std::string strip_anchors(std::string re) {
  if (!re.empty() && re.front() == '^') re.erase(0, 1);
  if (!re.empty() && re.back() == '$') re.pop_back();
  return re;
}

// `n` random documents of the schema's grammar.
std::vector<std::string> walks(std::string_view schema, int n) {
  const auto g = compile_json_schema(schema);
  const grammar::matcher m(g);
  std::vector<std::string> out;
  for (int i = 0; i < n * 4 && static_cast<int>(out.size()) < n; ++i)
    if (auto d = grammar::random_sentence(m, 77 + static_cast<uint64_t>(i), static_cast<size_t>(i % 40), 4000))
      out.push_back(std::move(*d));
  REQUIRE(out.size() == static_cast<size_t>(n));
  return out;
}

}  // namespace

TEST_CASE("grammar: literals, repetition and bounded repetition") {
  grammar::grammar g;
  const uint32_t ab = g.repeat("ab", g.literal("ab"), 1, 3);
  g.root = g.alt_rule("root", {{g.byte('<'), g.ref(ab), g.byte('>')}});
  REQUIRE(g.check().empty());
  CHECK(accepts(g, "<ab>"));
  CHECK(accepts(g, "<ababab>"));
  CHECK_FALSE(accepts(g, "<>"));
  CHECK_FALSE(accepts(g, "<abababab>"));
  CHECK_FALSE(accepts(g, "<aba>"));
  const grammar::matcher m(g);
  CHECK(m.accept(m.initial(), "<abababab").dead());
  CHECK_FALSE(m.accept(m.initial(), "<ab").accepting());
  CHECK(m.accept(m.initial(), "<ab>").must_end());
}

TEST_CASE("grammar: a long repetition keeps the parse stacks flat") {
  grammar::grammar g;
  const uint32_t xs = g.star("xs", {g.byte('x')});
  g.root = g.alt_rule("root", {{g.ref(xs), g.byte('.')}});
  const grammar::matcher m(g);
  auto s = m.initial();
  for (int i = 0; i < 10000; ++i) s = m.accept(s, 'x');
  for (const auto& st : s.stacks()) CHECK(st.size() <= 3);
  CHECK(m.accept(s, '.').accepting());
  // Equal states compare and hash equal: the mask cache relies on it.
  CHECK(m.accept(m.initial(), "xx") == m.accept(m.initial(), "xxxxx"));
  CHECK(m.accept(m.initial(), "xx").hash() == m.accept(m.initial(), "xxxxx").hash());
}

TEST_CASE("grammar: left recursion is refused") {
  grammar::grammar g;
  const uint32_t r = g.new_rule("r");
  const uint32_t e = g.alt_rule("e", {{}});
  g.add_alt(r, {g.ref(e), g.ref(r), g.byte('a')});
  g.add_alt(r, {g.byte('b')});
  g.root = r;
  CHECK(g.check().find("left-recursive") != std::string::npos);
}

TEST_CASE("json_object: any JSON object, nothing else") {
  const auto g = json_object_grammar();
  REQUIRE(g.check().empty());
  for (const char* ok :
       {"{}", "{ }", R"({"a":1})", R"({"a": [1, 2.5e-3, -0, true, null, "x\"y\u00e9"], "b": {"c": {}}})",
        "{\n  \"k\": \"v\"\n}", "{\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\": \"\"}"}) {
    INFO(ok);
    CHECK(accepts(g, ok));
  }
  for (const char* bad : {"[]", "1", "\"s\"", "{", R"({"a"})", R"({"a":01})", R"({"a":1,})", R"({a:1})",
                          "{\"a\":\"\x01\"}", "{\"a\":\"\xc3\"}", "{\"a\":\"\xff\"}", R"({"a":"\q"})", "{} "}) {
    INFO(bad);
    CHECK_FALSE(accepts(g, bad));
  }
}

TEST_CASE("json_schema: properties in order, required and optional, additionalProperties") {
  const char* schema = R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
    "tags":{"type":"array","items":{"type":"string"},"maxItems":2}},"required":["name"],"additionalProperties":false})";
  CHECK(schema_accepts(schema, R"({"name":"a"})"));
  CHECK(schema_accepts(schema, R"({"name":"a","age":3})"));
  CHECK(schema_accepts(schema, R"({"name": "a", "tags": ["x", "y"]})"));
  CHECK(schema_accepts(schema, R"({"name":"a","age":-3,"tags":[]})"));
  CHECK_FALSE(schema_accepts(schema, R"({})"));                                 // name is required
  CHECK_FALSE(schema_accepts(schema, R"({"age":3,"name":"a"})"));               // schema order
  CHECK_FALSE(schema_accepts(schema, R"({"name":"a","age":3.5})"));             // integer
  CHECK_FALSE(schema_accepts(schema, R"({"name":"a","tags":["x","y","z"]})"));  // maxItems
  CHECK_FALSE(schema_accepts(schema, R"({"name":"a","x":1})"));                 // no additional properties
  const char* open =
      R"({"type":"object","properties":{"a":{"type":"boolean"}},"additionalProperties":{"type":"null"}})";
  CHECK(schema_accepts(open, R"({"a":true,"b":null,"c":null})"));
  CHECK(schema_accepts(open, R"({"b":null})"));
  CHECK_FALSE(schema_accepts(open, R"({"b":1})"));
}

TEST_CASE("json_schema: an object that lists properties is closed unless additionalProperties opens it") {
  const char* listed = R"({"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},
    "required":["city"]})";
  CHECK(schema_accepts(listed, R"({"city":"Oslo"})"));
  CHECK(schema_accepts(listed, R"({"city":"Oslo","unit":"c"})"));
  CHECK_FALSE(schema_accepts(listed, R"({"city":"Oslo","country":"NO"})"));
  CHECK_FALSE(schema_accepts(listed, R"({"city":"Oslo","unit":"CAB"})"));  // skipped, then back as an extra
  CHECK_FALSE(schema_accepts(listed, R"({"city":"Oslo","unit":"c","unit":"f"})"));
  // Nothing listed: any members, as before.
  CHECK(schema_accepts(R"({"type":"object"})", R"({"b":[1,{"c":null}]})"));
  CHECK(schema_accepts(R"({"type":"object","properties":{}})", "{}"));
  CHECK_FALSE(schema_accepts(R"({"type":"object","properties":{}})", R"({"b":1})"));
}

TEST_CASE("json_schema: extra properties never take a listed name") {
  // Listed: "unit", "un" and a multi-byte name; extras of any value under any other name.
  const std::string open =
      "{\"type\":\"object\",\"properties\":{\"unit\":{\"enum\":[\"c\",\"f\"]},"
      "\"un\":{\"type\":\"integer\"},\"\xc3\xa9t\xc3\xa9\":{\"type\":\"boolean\"}},"
      "\"additionalProperties\":true}";
  for (const std::string ok :
       {"{\"unit\":\"c\",\"x\":[1]}", "{\"u\":1}", "{\"uni\":\"CAB\"}", "{\"units\":1}", "{\"\":1}",
        "{\"unix\":1,\"nu\":2}", "{\"\xc3\xa9t\":1}", "{\"\xc3\xa9t\xc3\xa9s\":1}", "{\"\xc3\xa8\":1}",
        "{\"\xe2\x82\xac\":1}", "{\"x\\\"y\":1}", "{\"un\":2,\"unit2\":{}}"}) {
    INFO(ok);
    CHECK(schema_accepts(open, ok));
  }
  for (const std::string bad : {"{\"unit\":\"CAB\"}", "{\"x\":1,\"unit\":\"c\"}", "{\"un\":\"s\"}",
                                "{\"un\":1,\"un\":2}", "{\"\xc3\xa9t\xc3\xa9\":1}",
                                // Spelled with an escape on the names' path: not written (a subset).
                                "{\"\\u0075nit\":\"CAB\"}"}) {
    INFO(bad);
    CHECK_FALSE(schema_accepts(open, bad));
  }
  // A schema for the extras too, and a listed name that needs escapes (no unescaped key spells it).
  const char* typed = R"({"type":"object","properties":{"a":{"type":"boolean"},"q\"x":{"type":"null"}},
    "additionalProperties":{"type":"integer"}})";
  CHECK(schema_accepts(typed, R"({"a":true,"b":1})"));
  CHECK(schema_accepts(typed, R"({"q":1,"qx":2})"));
  CHECK_FALSE(schema_accepts(typed, R"({"a":true,"a":1})"));
  CHECK_FALSE(schema_accepts(typed, R"({"b":true})"));
  // Escapes where they cannot spell a listed name (as Python's json.dumps writes keys).
  for (const char* ok :
       {R"({"\u00e9":1})", R"({"a\u00e9":1})", R"({"\ud83d\ude00":1})", R"({"\n":1,"\/":2})", R"({"\u001f":1})"}) {
    INFO(ok);
    CHECK(schema_accepts(typed, ok));
  }
  CHECK_FALSE(schema_accepts(typed, R"({"\u0061":1})"));  // "a" spelled with an escape: not written
  CHECK_FALSE(schema_accepts(typed, R"({"q\"x":1})"));    // the listed name with a quote
  // Random walks of the grammar never write a listed name twice.
  const auto g = compile_json_schema(R"({"type":"object","properties":{"unit":{"enum":["c","f"]},
    "un":{"type":"integer","minimum":0,"maximum":9}},"additionalProperties":{"type":"string","maxLength":3}})");
  const grammar::matcher m(g);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const auto doc = grammar::random_sentence(m, seed, 60, 4000);
    if (!doc) continue;
    const auto j = nlohmann::ordered_json::parse(*doc);
    std::map<std::string, int> seen;
    for (const auto& [k, v] : j.items()) ++seen[k];
    for (const auto& [k, n] : seen) CHECK(n == 1);
    if (j.contains("unit")) CHECK((j["unit"] == "c" || j["unit"] == "f"));
    if (j.contains("un")) CHECK(j["un"].is_number_integer());
  }
}

TEST_CASE("json_schema: keywords that cannot restrict a document are accepted") {
  for (const char* schema :
       {R"({"type":"array","items":{"type":"integer"},"uniqueItems":false})",
        R"({"type":"array","additionalItems":true,"unevaluatedItems":{}})",
        R"({"type":"object","properties":{"a":{"type":"integer"}},"unevaluatedProperties":true,"propertyNames":{},
           "minProperties":0,"patternProperties":{},"dependentRequired":{},"dependentSchemas":{},"dependencies":{}})",
        R"({"type":"array","minContains":0})"}) {
    INFO(schema);
    CHECK(schema_error(schema).empty());
  }
  CHECK(schema_accepts(R"({"type":"array","items":{"type":"integer"},"uniqueItems":false})", "[1,1,2]"));
  CHECK_FALSE(schema_accepts(R"({"type":"array","items":{"type":"integer"},"uniqueItems":false})", R"(["a"])"));
  // With a value that restricts, each is refused by name.
  for (const auto& [schema, word] : std::vector<std::pair<const char*, const char*>>{
           {R"({"type":"array","uniqueItems":true})", "#/uniqueItems"},
           {R"({"type":"array","additionalItems":false})", "#/additionalItems"},
           {R"({"type":"object","unevaluatedProperties":false})", "#/unevaluatedProperties"},
           {R"({"type":"object","propertyNames":{"maxLength":3}})", "#/propertyNames"},
           {R"({"type":"object","minProperties":1})", "#/minProperties"},
           {R"({"type":"object","patternProperties":{"^x":{"type":"integer"}}})", "#/patternProperties"},
           {R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":"no"}}})",
            "#/properties/a/uniqueItems"}}) {
    INFO(schema);
    CHECK(schema_error(schema).find(word) != std::string::npos);
  }
}

TEST_CASE("json_schema: enum, const, anyOf, type lists, string lengths, $ref recursion") {
  CHECK(schema_accepts(R"({"enum":["red","green",3,null]})", R"("green")"));
  CHECK(schema_accepts(R"({"enum":["red","green",3,null]})", "3"));
  CHECK_FALSE(schema_accepts(R"({"enum":["red","green"]})", R"("blue")"));
  CHECK(schema_accepts(R"({"const":{"a":[1,2]}})", R"({"a":[1,2]})"));
  CHECK(schema_accepts(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})", R"("ab")"));
  CHECK_FALSE(schema_accepts(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})", R"("abc")"));
  CHECK(schema_accepts(R"({"type":["number","null"]})", "null"));
  CHECK(schema_accepts(R"({"type":["number","null"]})", "-1.5E+10"));
  CHECK(schema_accepts(R"({"type":"string","minLength":2,"maxLength":3})", "\"\xc3\xa9\\n\""));
  CHECK_FALSE(schema_accepts(R"({"type":"string","minLength":2})", R"("a")"));
  const char* tree = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
    "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"],"additionalProperties":false}},
    "$ref":"#/$defs/node"})";
  CHECK(schema_accepts(tree, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  CHECK_FALSE(schema_accepts(tree, R"({"v":1,"kids":[{"v":2}]})"));
}

TEST_CASE("json_schema: what cannot be enforced is refused by name") {
  CHECK(schema_error(R"({"type":"string","pattern":"(?=a)b"})").find("the group `(?`") != std::string::npos);
  CHECK(schema_error(R"({"type":"string","pattern":"(a)\\1"})").find("the escape `\\1`") != std::string::npos);
  CHECK(schema_error(R"({"type":"string","pattern":"a^b"})").find("anchor") != std::string::npos);
  CHECK(schema_error(R"({"type":"string","pattern":"(a?)*"})").find("may be empty") != std::string::npos);
  // Nested repetitions stay small (each copy is one rule reference); many of them are refused.
  CHECK(schema_error(R"({"pattern":"((((abcdefgh){1000}){1000}){1000}){1000}"})").empty());
  std::string many;
  for (int i = 0; i < 300; ++i) many += "a{0,1000}";
  CHECK(schema_error(R"({"pattern":")" + many + "\"}").find("too large") != std::string::npos);
  CHECK(schema_error(R"({"pattern":"a{1001}"})").find("above 1000") != std::string::npos);
  CHECK(schema_error(R"({"pattern":"^a{,3}$"})").find("{,n}") != std::string::npos);
  CHECK(schema_error(R"({"type":"string","pattern":"[a-z]{6}","maxLength":5})").find("maxLength") != std::string::npos);
  CHECK(schema_error(R"({"type":"string","pattern":"[a-z]+","minLength":2})").find("minLength") != std::string::npos);
  CHECK(schema_error(R"({"type":"number","minimum":3})").find("#/minimum") != std::string::npos);
  CHECK(schema_error(R"({"type":"number","minimum":0,"maximum":1})").find("#/minimum") != std::string::npos);
  CHECK(schema_error(R"({"type":"integer","minimum":5,"maximum":4})").find("no integer") != std::string::npos);
  CHECK(schema_error(R"({"type":"object","properties":{"a":{"format":"uri"}}})").find("/properties/a/format") !=
        std::string::npos);
  CHECK(schema_error(R"({"type":"frog"})").find("frog") != std::string::npos);
  CHECK(schema_error(R"({"$ref":"#/nowhere"})").find("#/nowhere") != std::string::npos);
  CHECK(schema_error(R"({"type":"object","required":["x"]})").find("`x`") != std::string::npos);
  CHECK(schema_error("false").find("admits no document") != std::string::npos);
  CHECK(schema_error("{not json").find("not JSON") != std::string::npos);
  std::string deep = "true";
  for (int i = 0; i < 40; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  CHECK(schema_error(deep).find("nested deeper") != std::string::npos);
  CHECK(schema_error(R"({"type":"string","maxLength":100000})").find("maxLength") != std::string::npos);
  // Annotations are fine.
  CHECK(schema_error(R"({"title":"t","description":"d","type":"object","properties":{"a":{"type":"string",
    "description":"x","default":"y"}}})")
            .empty());
}

TEST_CASE("token masks: exactly the tokens that keep the grammar alive, on the SmolLM2 vocabulary") {
  SY_REQUIRE_MODEL_FILE();
  const auto f = gguf::file::open(sy::test::model_path());
  const tokenizer vocab = tokenizer::from_gguf(f);
  auto vb = std::make_shared<const vocab_bytes>(vocab);
  grammar_masks gm(compile_json_schema(R"({"type":"object","properties":{"answer":{"type":"string"},
      "n":{"type":"integer"}},"required":["answer","n"],"additionalProperties":false})"),
                   vb);
  const auto& m = gm.matcher();
  for (const char* prefix :
       {"", "{", "{\"answer\": \"Par", "{\"answer\": \"Paris\", \"n\": 1", "{\"answer\":\"\",\"n\":0}"}) {
    INFO("after " << prefix);
    const auto s = m.accept(m.initial(), std::string_view(prefix));
    REQUIRE_FALSE(s.dead());
    const auto mask = gm.mask(s);
    size_t n = 0;
    for (size_t t = 0; t < vocab.vocab_size(); ++t) {
      const auto id = static_cast<token_id>(t);
      bool want;
      if (vocab.is_eog(id))
        want = s.accepting();
      else if (vocab.is_control(id) || vocab.token_bytes(id).empty())
        want = false;
      else
        want = !m.accept(s, vocab.token_bytes(id)).dead();
      if (mask->allows(id) != want) FAIL_CHECK("token " << t << " '" << vocab.token_bytes(id) << "'");
      n += want;
    }
    CHECK(mask->n_allowed == n);
    CHECK(n > 0);
  }
  // The same state again comes from the cache.
  const size_t misses = gm.cache_misses();
  gm.mask(m.accept(m.initial(), "{\"answer\": \"Paris"));  // inside the string: the state of "Par"
  CHECK(gm.cache_misses() == misses);
  CHECK(gm.cache_hits() >= 1);
}

TEST_CASE("json_schema pattern: random strings match the pattern (std::regex as reference)") {
  for (const char* re : {"^[a-z0-9_]{3,8}$", "^\\d{3}-\\d{4}$", "[A-Z][a-z]+( [A-Z][a-z]+)?", "^(cat|dog|bird)s?$",
                         "^a(b|cd)*e+$", "\\w{1,8}@\\w{1,8}\\.com", "^[^\"\\\\]{2}x?$", "^\\s?\\.\\*\\\\\"/$",
                         "^(?:ab){2}c{1,}d{0,2}$", "^x[-+.]?\\S\\D\\W$", "caf(\xc3\xa9){2}", "^.{0,3}$", "^$"}) {
    INFO(re);
    const std::string schema = pattern_schema(re);
    const std::regex ref(re);
    for (const auto& doc : walks(schema, 40)) {
      INFO(doc);
      const std::string v = unquote(doc);
      CHECK(std::regex_search(v, ref));
      CHECK(std::regex_match(v, std::regex(std::string("^(?:") + strip_anchors(re) + ")$")));
    }
  }
  const char* phone = R"({"type":"string","pattern":"^\\(\\d{3}\\) \\d{3}-\\d{4}$"})";
  CHECK(schema_accepts(phone, R"("(555) 123-4567")"));
  CHECK_FALSE(schema_accepts(phone, R"("555 123-4567")"));
  CHECK_FALSE(schema_accepts(phone, R"("(555) 123-45678")"));
  CHECK(schema_accepts(R"({"pattern":"^a\"b\\\\c\\n$"})", R"("a\"b\\c\n")"));  // JSON escapes in the output
  CHECK(schema_accepts(R"({"type":"string","pattern":"[ab]{2}","minLength":2,"maxLength":2})", R"("ba")"));
  // A maxLength caps the unbounded repetitions of a pattern.
  const char* capped = R"({"type":"string","pattern":"^[a-z]+(-[a-z]+)*$","maxLength":9})";
  for (const auto& doc : walks(capped, 40)) {
    INFO(doc);
    const std::string v = unquote(doc);
    CHECK(v.size() <= 9);
    CHECK(std::regex_match(v, std::regex("[a-z]+(-[a-z]+)*")));
  }
  CHECK(schema_accepts(capped, R"("ab-c")"));  // one cap for all repetitions: here {1,2} and {0,1}
  CHECK_FALSE(schema_accepts(capped, R"("abcde-fghi")"));
  CHECK(schema_accepts(R"({"pattern":"^a{$"})", R"("a{")"));  // a brace that starts no quantifier is literal
  CHECK(schema_accepts(R"({"pattern":"^caf\u00e9+$"})", "\"caf\xc3\xa9\xc3\xa9\""));  // a UTF-8 character is one atom
}

TEST_CASE("json_schema integer bounds: exactly the integers in range") {
  struct bounds {
    const char* schema;
    int64_t lo, hi;
  };
  for (const bounds& b : std::initializer_list<bounds>{
           {R"({"type":"integer","minimum":0,"maximum":255})", 0, 255},
           {R"({"type":"integer","minimum":-40,"maximum":100})", -40, 100},
           {R"({"type":"integer","exclusiveMinimum":-1000,"exclusiveMaximum":-9})", -999, -10},
           {R"({"type":"integer","minimum":99,"maximum":1001})", 99, 1001},
           {R"({"type":"integer","minimum":7.5,"maximum":1234.9})", 8, 1234},
           {R"({"type":"integer","minimum":-5,"maximum":-5})", -5, -5},
           {R"({"type":"integer","minimum":1})", 1, INT64_MAX},
           {R"({"type":"integer","maximum":-3})", INT64_MIN, -3},
           {R"({"type":"integer","exclusiveMaximum":300})", INT64_MIN, 299},
           {R"({"type":"integer","minimum":9007199254740993,"maximum":9007199254740995})", 9007199254740993,
            9007199254740995}}) {
    INFO(b.schema);
    const auto g = compile_json_schema(b.schema);
    const grammar::matcher m(g);
    const int64_t from = std::max<int64_t>(b.lo, -3000) - 30, to = std::min<int64_t>(b.hi, 3000) + 30;
    for (int64_t v = from; v <= to; ++v) {
      const bool in = v >= b.lo && v <= b.hi;
      if (m.accept(m.initial(), std::to_string(v)).accepting() != in) FAIL_CHECK(v << (in ? " refused" : " accepted"));
    }
    for (const char* bad : {"-0", "01", "+1", "1.0", ""}) CHECK_FALSE(m.accept(m.initial(), bad).accepting());
    for (const auto& doc : walks(b.schema, 30)) {
      const int64_t v = std::stoll(doc);
      CHECK(std::to_string(v) == doc);
      CHECK(v >= b.lo);
      CHECK(v <= b.hi);
    }
  }
  // Random ranges, probed at their edges and at random.
  std::mt19937_64 rng(5);
  for (int i = 0; i < 200; ++i) {
    const int digits = 1 + static_cast<int>(rng() % 12);
    int64_t scale = 1;
    for (int d = 0; d < digits; ++d) scale *= 10;
    const auto pick = [&] { return static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * scale)) - scale; };
    int64_t lo = pick(), hi = pick();
    if (lo > hi) std::swap(lo, hi);
    const std::string schema =
        R"({"type":"integer","minimum":)" + std::to_string(lo) + R"(,"maximum":)" + std::to_string(hi) + "}";
    INFO(schema);
    const auto g = compile_json_schema(schema);
    const grammar::matcher m(g);
    for (int64_t v : {lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, pick(), pick(), pick(), pick(), int64_t{0}, -lo, -hi})
      if (m.accept(m.initial(), std::to_string(v)).accepting() != (v >= lo && v <= hi)) FAIL_CHECK(v);
  }
}

TEST_CASE("json_schema number bounds of 0: the sign") {
  const char* nonneg = R"({"type":"number","minimum":0})";
  const char* pos = R"({"type":"number","exclusiveMinimum":0})";
  const char* nonpos = R"({"type":"number","maximum":0})";
  const char* neg = R"({"type":"number","exclusiveMaximum":0})";
  for (const char* s : {nonneg, pos, nonpos, neg})
    for (const auto& doc : walks(s, 40)) {
      INFO(s << " " << doc);
      const double v = std::strtod(doc.c_str(), nullptr);  // 1e999: infinity, still of the right sign
      CHECK((s == nonneg ? v >= 0 : s == pos ? v > 0 : s == nonpos ? v <= 0 : v < 0));
    }
  CHECK(schema_accepts(nonneg, "0"));
  CHECK(schema_accepts(nonneg, "2.5e3"));
  CHECK_FALSE(schema_accepts(nonneg, "-1"));
  CHECK(schema_accepts(pos, "0.001"));
  CHECK_FALSE(schema_accepts(pos, "0.000"));
  CHECK_FALSE(schema_accepts(pos, "0"));
  CHECK(schema_accepts(nonpos, "0.0"));
  CHECK(schema_accepts(nonpos, "-3"));
  CHECK_FALSE(schema_accepts(nonpos, "3"));
  CHECK(schema_accepts(neg, "-0.5"));
  CHECK_FALSE(schema_accepts(neg, "-0"));
}

TEST_CASE("json_schema format: random values are well-formed") {
  const std::map<std::string, std::regex> shape = {
      {"date", std::regex(R"(\d{4}-\d{2}-\d{2})")},
      {"time", std::regex(R"(\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2}))")},
      {"date-time", std::regex(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2}))")},
      {"uuid", std::regex(R"([0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12})")},
      {"ipv4", std::regex(R"((\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3}))")},
      {"ipv6", std::regex(R"([0-9a-f]{1,4}(:[0-9a-f]{1,4}){7})")},
      {"hostname", std::regex(R"([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*)")},
      {"email", std::regex(R"([^@\s]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,})")}};
  for (const auto& [format, re] : shape) {
    INFO(format);
    for (const auto& doc : walks(R"({"type":"string","format":")" + format + R"("})", 40)) {
      const std::string v = unquote(doc);
      INFO(v);
      std::smatch mt;
      CHECK(std::regex_match(v, mt, re));
      if (format == "date" || format == "date-time") {  // a day that exists
        const int y = std::stoi(v.substr(0, 4)), mo = std::stoi(v.substr(5, 2)), d = std::stoi(v.substr(8, 2));
        const int days[] = {31, 28 + (y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)), 31, 30, 31, 30, 31, 31, 30, 31, 30,
                            31};
        CHECK((y >= 1 && mo >= 1 && mo <= 12 && d >= 1 && d <= days[mo - 1]));
      }
      if (format == "time" || format == "date-time") {
        const std::string t = format == "time" ? v : v.substr(11);
        CHECK((std::stoi(t.substr(0, 2)) < 24 && std::stoi(t.substr(3, 2)) < 60 && std::stoi(t.substr(6, 2)) < 60));
      }
      if (format == "ipv4")
        for (size_t k = 1; k <= 4; ++k)
          CHECK((std::stoi(mt[k].str()) <= 255 && (mt[k].str().size() == 1 || mt[k].str()[0] != '0')));
      if (format == "hostname") CHECK(v.size() <= 253);
    }
  }
  CHECK(schema_accepts(R"({"format":"date"})", R"("2024-12-31")"));
  CHECK_FALSE(schema_accepts(R"({"format":"date"})", R"("2024-02-30")"));
  CHECK_FALSE(schema_accepts(R"({"format":"ipv4"})", R"("256.1.1.1")"));
  CHECK(schema_accepts(R"({"type":["string","null"],"format":"uuid"})", "null"));
  CHECK(schema_accepts(R"({"format":"date","minLength":10,"maxLength":10})", R"("1999-01-01")"));
}
