// Byte grammars, the JSON Schema compiler and token masks (constrained decoding). The matcher is
// checked on documents it must accept and reject; masks are checked token by token against the
// matcher itself on the real SmolLM2 vocabulary.
#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <string>

#include "common/gguf.hpp"
#include "common/grammar.hpp"
#include "common/json_schema.hpp"
#include "common/tokenizer.hpp"
#include "worker/token_mask.hpp"

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
  CHECK(schema_error(R"({"type":"string","pattern":"^a+$"})").find("pattern") != std::string::npos);
  CHECK(schema_error(R"({"type":"integer","minimum":3})").find("minimum") != std::string::npos);
  CHECK(schema_error(R"({"type":"object","properties":{"a":{"format":"email"}}})").find("/properties/a/format") !=
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
  if (!std::ifstream(SY_MODEL_PATH).good()) {
    WARN("model not found at " SY_MODEL_PATH "; run deploy/setup.sh");
    return;
  }
  const auto f = gguf::file::open(SY_MODEL_PATH);
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
