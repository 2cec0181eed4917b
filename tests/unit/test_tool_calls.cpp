// Tool calling at the edge: `tools` / `tool_choice` parse into the native struct and bad ones are
// 400s naming the field; the call schema of an enforced choice compiles and its grammar accepts
// exactly call documents; each family renders tools, past calls and results by its convention;
// the model's text parses back into calls per family; a stream of any split of the text adds up
// to the whole-text parse; responses and chunks have OpenAI's tool_calls shapes.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "common/structured/grammar.hpp"
#include "common/structured/json_schema.hpp"
#include "common/tokenizer/chat_template.hpp"
#include "router/openai/openai_request.hpp"
#include "router/openai/openai_response.hpp"
#include "router/openai/tool_calls.hpp"

using Catch::Matchers::Contains;
using nlohmann::json;
using sy::router::api_error;
using sy::router::endpoint;
using sy::router::generation_request;
using sy::router::tool_choice_mode;
namespace router = sy::router;

namespace {

const std::string k_weather = R"({"type":"function","function":{"name":"get_weather","description":"Weather now",
  "parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},
  "required":["city"]}}})";
const std::string k_time = R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object",
  "properties":{"zone":{"type":"string"}},"required":["zone"],"additionalProperties":false}}})";

std::string chat_body(const std::string& extra) {
  return R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[)" + k_weather + "," + k_time + "]" +
         (extra.empty() ? "" : "," + extra) + "}";
}

std::variant<generation_request, api_error> parse(const std::string& body) {
  return router::parse_generation_request(endpoint::chat_completions, body, {});
}

generation_request parse_ok(const std::string& body) {
  auto r = parse(body);
  if (const auto* e = std::get_if<api_error>(&r)) FAIL("rejected: " << e->param << ": " << e->message);
  return std::get<generation_request>(r);
}

router::tool_parse_spec spec(sy::tool_call_style style, bool constrained = false, bool parallel = true) {
  router::tool_parse_spec s;
  s.style = style;
  s.constrained = constrained;
  s.parallel = parallel;
  s.names = {"get_weather", "get_time"};
  return s;
}

// The stream's pieces of `text` cut every `step` bytes, put back together.
struct reassembled {
  std::string content;
  std::vector<std::string> names, arguments;
  bool called = false;
};
reassembled stream_in_pieces(const router::tool_parse_spec& s, const std::string& text, size_t step) {
  router::tool_call_stream st(s);
  reassembled out;
  for (size_t at = 0; at < text.size() || at == 0; at += step) {
    const bool done = at + step >= text.size();
    const auto d = st.feed(std::string_view(text).substr(at, step), done);
    out.content += d.content;
    for (const auto& c : d.calls) {
      if (c.first) {
        REQUIRE(c.index == out.names.size());
        out.names.push_back(c.name);
        out.arguments.emplace_back();
      }
      REQUIRE(c.index < out.arguments.size());
      out.arguments[c.index] += c.arguments;
    }
    if (done) break;
  }
  out.called = st.called();
  return out;
}

void check_stream_matches_whole(const router::tool_parse_spec& s, const std::string& text) {
  const router::tool_output whole = router::parse_tool_output(s, text);
  for (const size_t step : {size_t{1}, size_t{3}, size_t{7}, text.size() + 1}) {
    INFO("text: " << text << " step " << step);
    const reassembled r = stream_in_pieces(s, text, step);
    CHECK(r.content == whole.content);
    REQUIRE(r.names.size() == whole.calls.size());
    for (size_t i = 0; i < r.names.size(); ++i) {
      CHECK(r.names[i] == whole.calls[i].name);
      CHECK(r.arguments[i] == whole.calls[i].arguments);
    }
    CHECK(r.called == !whole.calls.empty());
  }
}

}  // namespace

TEST_CASE("tools, tool_choice and parallel_tool_calls parse into the native struct", "[tools]") {
  const generation_request r = parse_ok(chat_body(""));
  REQUIRE(r.tools.tools.size() == 2);
  CHECK(r.tools.choice == tool_choice_mode::automatic);  // tools without a choice: auto
  CHECK(r.tools.parallel);
  CHECK(r.tools.tools[0].name == "get_weather");
  // The definition and the parameters keep the client's order of keys.
  CHECK(r.tools.tools[0].parameters.find("\"city\"") < r.tools.tools[0].parameters.find("\"unit\""));
  CHECK(json::parse(r.tools.tools[0].definition)["function"]["description"] == "Weather now");
  CHECK(r.constraint.kind.empty());  // auto is not enforced

  const generation_request none = parse_ok(chat_body(R"("tool_choice":"none")"));
  CHECK_FALSE(none.tools.active());
  CHECK(none.tools.cache_text().empty());

  const generation_request req = parse_ok(chat_body(R"("tool_choice":"required","parallel_tool_calls":false)"));
  CHECK(req.tools.choice == tool_choice_mode::required);
  CHECK_FALSE(req.tools.parallel);
  CHECK(req.constraint.kind == "json_schema");
  CHECK(json::parse(req.constraint.schema).contains("anyOf"));

  const generation_request named =
      parse_ok(chat_body(R"("tool_choice":{"type":"function","function":{"name":"get_time"}})"));
  CHECK(named.tools.choice == tool_choice_mode::named);
  CHECK(named.tools.named == "get_time");
  const json schema = json::parse(named.constraint.schema);
  CHECK(schema["properties"]["name"]["const"] == "get_time");
  CHECK(schema["properties"]["arguments"]["required"] == json::array({"zone"}));

  // Every setting splits the cache text.
  CHECK(req.tools.cache_text() != named.tools.cache_text());
  CHECK(parse_ok(chat_body("")).tools.cache_text() !=
        parse_ok(chat_body(R"("parallel_tool_calls":false)")).tools.cache_text());
}

TEST_CASE("tool and assistant tool_calls messages are accepted", "[tools]") {
  const generation_request r = parse_ok(R"({"model":"m","messages":[
    {"role":"user","content":"weather?"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
      "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
    {"role":"tool","tool_call_id":"call_1","content":"21 C"}]})");
  REQUIRE(r.messages.size() == 3);
  REQUIRE(r.messages[1].tool_calls.size() == 1);
  CHECK(r.messages[1].tool_calls[0].id == "call_1");
  CHECK(r.messages[1].tool_calls[0].arguments == R"({"city":"Paris"})");
  CHECK(r.messages[2].role == "tool");
  CHECK(r.messages[2].tool_call_id == "call_1");
  CHECK_FALSE(r.tools.active());  // no tools offered on this turn
}

TEST_CASE("bad tool fields are 400s naming the field", "[tools]") {
  struct bad_case {
    const char* name;
    std::string body;
    const char* param;
    const char* message_part;
  };
  auto with = [](const std::string& fields) {
    return R"({"model":"m","messages":[{"role":"user","content":"hi"}],)" + fields + "}";
  };
  const std::vector<bad_case> cases = {
      {"tools not a list", with(R"("tools":{"type":"function"})"), "tools", "array"},
      {"tool not function", with(R"("tools":[{"type":"retrieval"}])"), "tools[0].type", "function"},
      {"tool without function", with(R"("tools":[{"type":"function"}])"), "tools[0].function", "required"},
      {"function without name", with(R"("tools":[{"type":"function","function":{}}])"), "tools[0].function.name",
       "required"},
      {"bad function name", with(R"("tools":[{"type":"function","function":{"name":"a b"}}])"),
       "tools[0].function.name", "letters"},
      {"parameters not an object", with(R"("tools":[{"type":"function","function":{"name":"f","parameters":"x"}}])"),
       "tools[0].function.parameters", "object"},
      {"duplicate names", with(R"("tools":[)" + k_time + "," + k_weather + "," + k_time + "]"),
       "tools[2].function.name", "two tools"},
      {"unknown tool_choice string", chat_body(R"("tool_choice":"always")"), "tool_choice", "always"},
      {"tool_choice names an unknown function",
       chat_body(R"("tool_choice":{"type":"function","function":{"name":"nope"}})"), "tool_choice.function.name",
       "nope"},
      {"tool_choice object without function", chat_body(R"("tool_choice":{"type":"function"})"), "tool_choice.function",
       "name"},
      {"tool_choice a number", chat_body(R"("tool_choice":3)"), "tool_choice", "string"},
      {"required without tools", with(R"("tool_choice":"required")"), "tool_choice", "tools"},
      {"parallel_tool_calls not a bool", chat_body(R"("parallel_tool_calls":"yes")"), "parallel_tool_calls", "boolean"},
      {"required with a response_format",
       chat_body(R"("tool_choice":"required","response_format":{"type":"json_object"})"), "response_format", "text"},
      {"required with a keyword the grammar cannot enforce",
       with(R"("tool_choice":"required","tools":[{"type":"function","function":{"name":"f","parameters":
         {"type":"object","properties":{"d":{"type":"string","format":"uri"}}}}}])"),
       "tools[0].function.parameters", "format"},
      {"tool_calls not a list", R"({"model":"m","messages":[{"role":"assistant","tool_calls":{}}]})",
       "messages[0].tool_calls", "array"},
      {"tool_call without function", R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"x"}]}]})",
       "messages[0].tool_calls[0].function", "required"},
  };
  for (const bad_case& c : cases) {
    INFO("case: " << c.name << "\nbody: " << c.body);
    const auto r = parse(c.body);
    REQUIRE(std::holds_alternative<api_error>(r));
    const api_error& e = std::get<api_error>(r);
    INFO("message: " << e.message);
    CHECK(e.status == 400);
    CHECK(e.param == c.param);
    CHECK_THAT(e.message, Contains(c.message_part));
  }
  // A keyword whose value cannot restrict is no error under an enforced choice either.
  CHECK(std::holds_alternative<generation_request>(
      parse(with(R"("tool_choice":"required","tools":[{"type":"function","function":{"name":"f","parameters":
         {"type":"object","properties":{"d":{"type":"array","items":{"type":"integer"},"uniqueItems":false}}}}}])"))));
  // Under auto the schemas are not enforced, so what the grammar cannot enforce is no error.
  CHECK(std::holds_alternative<generation_request>(
      parse(with(R"("tools":[{"type":"function","function":{"name":"f","parameters":
         {"type":"object","properties":{"d":{"type":"string","format":"uri"}}}}}])"))));
}

TEST_CASE("the call schema's grammar accepts calls and refuses the rest", "[tools]") {
  auto grammar_of = [](const std::string& fields) {
    const generation_request r = parse_ok(chat_body(fields));
    return sy::compile_json_schema(r.constraint.schema);
  };
  auto accepts = [](const sy::grammar::grammar& g, const std::string& doc) {
    const sy::grammar::matcher m(g);
    return m.accept(m.initial(), doc).accepting();
  };
  const auto named = grammar_of(R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})");
  CHECK(accepts(named, R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}})"));
  CHECK_FALSE(accepts(named, R"({"name": "get_time", "arguments": {"zone": "UTC"}})"));
  CHECK_FALSE(accepts(named, R"({"name": "get_weather", "arguments": {"unit": "c"}})"));  // city is required
  CHECK_FALSE(accepts(named, R"({"arguments": {"city": "Paris"}, "name": "get_weather"})"));

  const auto parallel = grammar_of(R"("tool_choice":"required")");
  CHECK(accepts(parallel, R"([{"name": "get_time", "arguments": {"zone": "UTC"}}, )"
                          R"({"name": "get_weather", "arguments": {"city": "Oslo"}}])"));
  CHECK_FALSE(accepts(parallel, "[]"));
  // Every call of the list is held to its function's parameters, the second as the first: a listed
  // property skipped in its place does not come back as an extra one, and parameters that list
  // their properties (get_weather says nothing of additionalProperties) take no others.
  for (const char* second : {R"({"city": "SAN", "unit": "CAB"})", R"({"city": "Oslo", "unit": ["l", "m"]})",
                             R"({"city": "Oslo", "unit": "c", "unit": "f"})", R"({"city": "Oslo", "country": "NO"})",
                             R"({"city": "Oslo", "unit": "k"})", R"({"city": 3})"}) {
    INFO(second);
    CHECK_FALSE(accepts(parallel, R"([{"name": "get_time", "arguments": {"zone": "UTC"}}, )"
                                  R"({"name": "get_weather", "arguments": )" +
                                      std::string(second) + "}]"));
    CHECK_FALSE(accepts(named, R"({"name": "get_weather", "arguments": )" + std::string(second) + "}"));
  }
  CHECK(accepts(parallel, R"([{"name": "get_weather", "arguments": {"city": "Oslo"}}, )"
                          R"({"name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}}])"));
  CHECK_FALSE(accepts(parallel, R"({"name": "get_time", "arguments": {"zone": "UTC"}})"));

  // A parameters schema with its own $defs: the references still resolve inside the call.
  const generation_request refs = parse_ok(
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":"required","tools":[
      {"type":"function","function":{"name":"route","parameters":{"type":"object","properties":{
        "from":{"$ref":"#/$defs/place"},"to":{"$ref":"#/$defs/place"}},"required":["from","to"],
        "$defs":{"place":{"type":"string","enum":["A","B"]}}}}}]})");
  const auto refs_grammar = sy::compile_json_schema(refs.constraint.schema);
  CHECK(accepts(refs_grammar, R"([{"name": "route", "arguments": {"from": "A", "to": "B"}}])"));
  CHECK_FALSE(accepts(refs_grammar, R"([{"name": "route", "arguments": {"from": "A", "to": "C"}}])"));

  const auto single = grammar_of(R"("tool_choice":"required","parallel_tool_calls":false)");
  CHECK(accepts(single, R"({"name": "get_time", "arguments": {"zone": "UTC"}})"));
  CHECK_FALSE(accepts(single, R"({"name": "get_time", "arguments": {"zone": "UTC", "x": 1}})"));
}

TEST_CASE("each family renders tools, past calls and results by its convention", "[tools]") {
  const std::vector<sy::chat_tool> tools = {{"get_time", R"({"type":"function","function":{"name":"get_time"}})", ""}};
  std::vector<sy::chat_message> conv = {{"user", "time?", {}, {}}};
  sy::chat_message call{"assistant", "", {{"c1", "get_time", R"({"zone":"UTC"})"}}, {}};
  sy::chat_message result{"tool", "12:00", {}, "c1"};
  const std::vector<sy::chat_message> round = {conv[0], call, result};

  sy::chat_template chatml = sy::chat_template::parse("chatml");
  chatml.default_system = "You are helpful.";
  const std::string c = chatml.apply(conv, true, tools);
  CHECK_THAT(c, Contains("<|im_start|>system\nYou are helpful.\n\n# Tools"));
  CHECK_THAT(c, Contains("<tools>\n" + tools[0].definition + "\n</tools>"));
  CHECK_THAT(c, Contains("<tool_call>"));
  const std::string cr = chatml.apply(round, true, tools);
  CHECK_THAT(cr, Contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
                          "{\"zone\":\"UTC\"}}\n</tool_call><|im_end|>"));
  CHECK_THAT(cr, Contains("<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>"));
  // Without tools and tool turns the rendering is the plain one.
  CHECK(chatml.apply(conv, true, {}) == chatml.apply(conv, true));

  const std::string l = sy::chat_template::parse("llama3").apply(round, true, tools);
  CHECK_THAT(l, Contains("<|start_header_id|>user<|end_header_id|>\n\nThese functions are available"));
  CHECK_THAT(l, Contains("{\"name\": \"get_time\", \"parameters\": {\"zone\":\"UTC\"}}<|eot_id|>"));
  CHECK_THAT(l, Contains("<|start_header_id|>ipython<|end_header_id|>\n\n12:00<|eot_id|>"));

  const std::string m = sy::chat_template::parse("mistral-v3").apply(round, true, tools);
  CHECK(m.rfind("[AVAILABLE_TOOLS] [" + tools[0].definition + "][/AVAILABLE_TOOLS][INST] time?[/INST]", 0) == 0);
  CHECK_THAT(
      m, Contains("[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {\"zone\":\"UTC\"}, \"id\": \"c1\"}]</s>"));
  CHECK_THAT(m, Contains("[TOOL_RESULTS] {\"content\": \"12:00\", \"call_id\": \"c1\"}[/TOOL_RESULTS]"));

  // A format without a convention of its own gets the hermes one over its own turns.
  const std::string g = sy::chat_template::parse("gemma").apply(round, true, tools);
  CHECK_THAT(g, Contains("<tools>"));
  CHECK_THAT(g, Contains("<start_of_turn>user\n<tool_response>\n12:00\n</tool_response><end_of_turn>"));
  // deepseek3: DeepSeek's own tokens, as V3.1's template writes past calls and results.
  const std::string d = sy::chat_template::parse("deepseek3").apply(round, true, tools);
  CHECK(d.rfind("## Tools\n", 0) == 0);
  CHECK_THAT(d, Contains("\n" + tools[0].definition + "\n"));
  CHECK_THAT(d,
             Contains("<｜User｜>time?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
                      "{\"zone\":\"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
                      "<｜tool▁output▁begin｜>12:00<｜tool▁output▁end｜><｜Assistant｜>"));
}

TEST_CASE("tool calls parse out of each family's text", "[tools]") {
  using sy::tool_call_style;
  const auto h = spec(tool_call_style::hermes);
  auto out = router::parse_tool_output(
      h,
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"CET\\\"}\"}\n</tool_call>");
  REQUIRE(out.calls.size() == 2);
  CHECK(out.content == "Let me check.");
  CHECK(out.calls[0].name == "get_weather");
  CHECK(out.calls[0].arguments == R"({"city":"Paris"})");
  CHECK(out.calls[1].arguments == R"({"zone":"CET"})");  // arguments given as a string

  // An unterminated last block (the model stopped right after it) still counts.
  out = router::parse_tool_output(h, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}");
  REQUIRE(out.calls.size() == 1);
  CHECK_FALSE(out.has_content);

  // An undeclared function, broken JSON or no call at all: content, as written.
  for (const std::string text : {"<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
                                 "<tool_call>{\"name\": \"get_time\", </tool_call>", "Just text.", ""}) {
    out = router::parse_tool_output(h, text);
    CHECK(out.calls.empty());
    CHECK(out.has_content);
    CHECK(out.content == text);
  }

  // DeepSeek's tokens: V3.1's call body (name, separator, arguments), several calls in one block,
  // text before it; V3's and R1's body (function, separator, name and a fenced JSON block).
  const auto ds = spec(tool_call_style::deepseek);
  out = router::parse_tool_output(
      ds,
      "Checking both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"CET\"}<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>");
  REQUIRE(out.calls.size() == 2);
  CHECK(out.content == "Checking both.");
  CHECK(out.calls[0].name == "get_weather");
  CHECK(out.calls[0].arguments == R"({"city":"Paris"})");
  CHECK(out.calls[1].name == "get_time");
  CHECK(out.calls[1].arguments == R"({"zone":"CET"})");
  out = router::parse_tool_output(ds,
                                  "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n"
                                  "{\"zone\": \"UTC\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  REQUIRE(out.calls.size() == 1);
  CHECK(out.calls[0].name == "get_time");
  CHECK(out.calls[0].arguments == R"({"zone":"UTC"})");
  CHECK_FALSE(out.has_content);
  // Cut off after the last call's arguments (the model stopped there): still a call.
  out = router::parse_tool_output(ds, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}");
  REQUIRE(out.calls.size() == 1);
  CHECK(out.calls[0].arguments == "{}");
  // An undeclared function, no separator, broken JSON, text between calls: content, as written.
  for (const std::string text :
       {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>rm_rf<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time {}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\"<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>and"
        "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}) {
    out = router::parse_tool_output(ds, text);
    CHECK(out.calls.empty());
    CHECK(out.content == text);
  }

  // A text that is only a call object, in any family (Llama 3.1 writes "parameters").
  out = router::parse_tool_output(spec(tool_call_style::llama3_json),
                                  "{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}");
  REQUIRE(out.calls.size() == 1);
  CHECK(out.calls[0].arguments == R"({"zone":"UTC"})");
  out = router::parse_tool_output(h, "```json\n{\"name\": \"get_time\", \"arguments\": {}}\n```");
  REQUIRE(out.calls.size() == 1);

  out = router::parse_tool_output(spec(tool_call_style::mistral),
                                  "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}, "
                                  "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]");
  REQUIRE(out.calls.size() == 2);
  // parallel_tool_calls false keeps the first.
  out = router::parse_tool_output(spec(tool_call_style::mistral, false, false),
                                  "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}, "
                                  "{\"name\": \"get_weather\", \"arguments\": {}}]");
  CHECK(out.calls.size() == 1);

  // Constrained text: the arguments are the document's own bytes.
  const auto k = spec(tool_call_style::hermes, true);
  out = router::parse_tool_output(k, "[{\"name\": \"get_time\", \"arguments\": {\"zone\":  \"UTC\"} }]");
  REQUIRE(out.calls.size() == 1);
  CHECK(out.calls[0].arguments == "{\"zone\":  \"UTC\"}");
  // Cut by max_tokens: the complete calls, the one cut short dropped, never the raw JSON as content.
  out = router::parse_tool_output(k, "[{\"name\": \"get_time\", \"arguments\": {\"zo");
  CHECK(out.calls.empty());
  CHECK_FALSE(out.has_content);
  out = router::parse_tool_output(k,
                                  "[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}},\n "
                                  "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ro");
  REQUIRE(out.calls.size() == 1);
  CHECK(out.calls[0].name == "get_time");
  CHECK(out.calls[0].arguments == "{\"zone\": \"UTC\"}");
  CHECK_FALSE(out.has_content);
  // Arguments that are whole before the call's own `}`: the call is complete.
  out = router::parse_tool_output(k, "[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"} ");
  REQUIRE(out.calls.size() == 1);
  CHECK(out.calls[0].arguments == "{\"zone\": \"UTC\"}");
  out = router::parse_tool_output(spec(tool_call_style::hermes, true, false),
                                  "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}");
  REQUIRE(out.calls.size() == 1);
  CHECK(out.calls[0].name == "get_weather");
}

TEST_CASE("a stream cut anywhere adds up to the whole-text parse", "[tools]") {
  using sy::tool_call_style;
  const auto h = spec(tool_call_style::hermes);
  for (const std::string text :
       {"Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}</tool_call> and done  ",
        "{\"name\": \"get_time\", \"arguments\": {}}", "Plain text with a < sign and <tool_ inside.  ",
        "  {not a call} ", "<tool_call>{broken"}) {
    check_stream_matches_whole(h, text);
  }
  check_stream_matches_whole(spec(tool_call_style::mistral),
                             "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]");
  for (const std::string text :
       {"Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"UTC\"}<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>",
        "No call here, only <｜tool▁ and text."}) {
    check_stream_matches_whole(spec(tool_call_style::deepseek), text);
  }
  const auto k = spec(tool_call_style::hermes, true);
  for (const std::string text :
       {"[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"U\\\"T C\" } },\n {\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"a b\", \"unit\": \"c\"}}]",
        "{\"name\": \"get_time\", \"arguments\": { }}"}) {
    check_stream_matches_whole(k, text);
  }
  // Cut by max_tokens: the stream's complete calls are the whole-text parse's; after them at most
  // the beginning of the call cut short (its arguments not a whole value).
  const std::string cut =
      "[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}},\n {\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"a b\"}}, {\"name\": \"get_time\", \"arguments\": {\"z";
  for (size_t end = 0; end <= cut.size(); ++end) {
    const std::string text = cut.substr(0, end);
    const router::tool_output whole = router::parse_tool_output(k, text);
    CHECK_FALSE(whole.has_content);
    for (const size_t step : {size_t{1}, size_t{5}, text.size() + 1}) {
      INFO("text: " << text << " step " << step);
      const reassembled r = stream_in_pieces(k, text, step);
      CHECK(r.content.empty());
      REQUIRE(r.names.size() >= whole.calls.size());
      CHECK(r.names.size() <= whole.calls.size() + 1);
      for (size_t i = 0; i < whole.calls.size(); ++i) {
        CHECK(r.names[i] == whole.calls[i].name);
        CHECK(r.arguments[i] == whole.calls[i].arguments);
      }
      if (r.names.size() > whole.calls.size()) CHECK_FALSE(json::accept(r.arguments.back()));
    }
  }
  // Constrained: the name goes out before the arguments are complete.
  router::tool_call_stream st(k);
  auto d = st.feed("{\"name\": \"get_time\", \"arguments\": {\"zo", false);
  REQUIRE(d.calls.size() == 1);
  CHECK(d.calls[0].first);
  CHECK(d.calls[0].name == "get_time");
  CHECK(d.calls[0].arguments == "{\"zo");
}

TEST_CASE("responses and chunks carry tool_calls in OpenAI's shapes", "[tools]") {
  const generation_request g = parse_ok(chat_body(R"("tool_choice":"required")"));
  router::response_meta meta;
  meta.id = "chatcmpl-1";
  meta.model = "m";
  meta.kind = endpoint::chat_completions;
  router::enable_tool_calls(meta, g, sy::chat_format::chatml);
  REQUIRE(meta.tools);
  const std::string text = R"([{"name": "get_time", "arguments": {"zone": "UTC"}}])";

  const json body = json::parse(router::format_response(meta, {{0, text, sy::finish_reason::stop, {}}}, {}));
  const json& choice = body["choices"][0];
  CHECK(choice["finish_reason"] == "tool_calls");
  CHECK(choice["message"]["content"].is_null());
  const json& call = choice["message"]["tool_calls"][0];
  CHECK(call["type"] == "function");
  CHECK(call["id"] == router::tool_call_id("chatcmpl-1", 0, 0));
  CHECK(call["function"]["name"] == "get_time");
  CHECK(json::parse(call["function"]["arguments"].get<std::string>()) == json{{"zone", "UTC"}});

  // Streamed in two pieces: the first chunk names the call, the last finishes with tool_calls.
  const json c1 = json::parse(router::format_chunk(meta, 0, text.substr(0, 40), true, sy::finish_reason::none, {}));
  const json& d1 = c1["choices"][0]["delta"];
  CHECK(d1["role"] == "assistant");
  CHECK(d1["tool_calls"][0]["index"] == 0);
  CHECK(d1["tool_calls"][0]["id"] == call["id"]);
  CHECK(d1["tool_calls"][0]["function"]["name"] == "get_time");
  const json c2 = json::parse(router::format_chunk(meta, 0, text.substr(40), false, sy::finish_reason::stop, {}));
  CHECK(c2["choices"][0]["finish_reason"] == "tool_calls");
  const std::string args = d1["tool_calls"][0]["function"]["arguments"].get<std::string>() +
                           c2["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].get<std::string>();
  CHECK(args == call["function"]["arguments"]);
  CHECK_FALSE(c2["choices"][0]["delta"]["tool_calls"][0].contains("id"));

  // Without tools offered the message is plain content.
  router::response_meta plain = meta;
  plain.tools.reset();
  const json p = json::parse(router::format_response(plain, {{0, "hi", sy::finish_reason::stop, {}}}, {}));
  CHECK(p["choices"][0]["message"]["content"] == "hi");
  CHECK_FALSE(p["choices"][0]["message"].contains("tool_calls"));
}
