// Anthropic Messages API edge tests (router/openai/anthropic_api.hpp): a body with every mapped field
// becomes the native chat request /v1/chat/completions would make; bad and unsupported fields
// are 400s naming the field in Anthropic's terms; responses, stream events and errors have
// Anthropic's shapes, and a stream's tool_use input adds up to the non-streamed input.
#include <catch2/catch.hpp>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "router/openai/anthropic_api.hpp"
#include "tests/unit/sse_events.hpp"

using nlohmann::json;
using sy::router::api_error;
using sy::router::generation_request;
namespace router = sy::router;

namespace {

generation_request parse_ok(std::string_view body, bool count_only = false) {
  auto r = router::parse_anthropic_request(body, {}, count_only);
  if (const auto* e = std::get_if<api_error>(&r)) {
    INFO("unexpected error: " << e->param << ": " << e->message);
    FAIL("request was rejected");
  }
  return std::get<generation_request>(r);
}

api_error parse_err(std::string_view body) {
  auto r = router::parse_anthropic_request(body, {});
  INFO("body: " << body);
  REQUIRE(std::holds_alternative<api_error>(r));
  return std::get<api_error>(r);
}

std::vector<std::pair<std::string, json>> events(const std::string& text) { return sy::test::named_events(text); }

}  // namespace

TEST_CASE("anthropic: a body with every mapped field becomes the native chat request") {
  const auto g = parse_ok(R"({
    "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
    "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21", "is_error": true},
        {"type": "text", "text": "And?"}]}],
    "stop_sequences": ["END"], "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stream": true,
    "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true}, "metadata": {"user_id": "u"}})");
  CHECK(g.model == "m");
  CHECK(g.sampling.max_tokens == 64);
  CHECK(g.max_tokens_given);
  CHECK(g.stream);
  CHECK(g.sampling.stop == std::vector<std::string>{"END"});
  CHECK(g.sampling.temperature == Approx(0.5));
  CHECK(g.sampling.top_p == Approx(0.9));
  CHECK(g.sampling.top_k == 40);
  REQUIRE(g.messages.size() == 5);
  CHECK(g.messages[0].role == "system");
  CHECK(g.messages[0].content == "Be brief.");
  CHECK(g.messages[2].role == "assistant");
  CHECK(g.messages[2].content == "Let me look.");
  REQUIRE(g.messages[2].tool_calls.size() == 1);
  CHECK(g.messages[2].tool_calls[0].id == "toolu_1");
  CHECK(g.messages[2].tool_calls[0].arguments == R"({"city":"Paris"})");
  CHECK(g.messages[3].role == "tool");
  CHECK(g.messages[3].tool_call_id == "toolu_1");
  CHECK(g.messages[3].content == "Error: 21");
  CHECK(g.messages[4].role == "user");
  CHECK(g.messages[4].content == "And?");
  REQUIRE(g.tools.tools.size() == 1);
  CHECK(g.tools.choice == router::tool_choice_mode::required);
  CHECK_FALSE(g.tools.parallel);
  CHECK(g.constraint.kind == "json_schema");  // the call schema, as for tool_choice "required"
}

TEST_CASE("anthropic: tool_choice maps to OpenAI's choices") {
  const std::string tools = R"("tools": [{"name": "f", "input_schema": {"type": "object"}}])";
  const auto with = [&](const std::string& choice) {
    return parse_ok(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], )" + tools +
                    R"(, "tool_choice": )" + choice + "}")
        .tools;
  };
  CHECK(with(R"({"type": "auto"})").choice == router::tool_choice_mode::automatic);
  CHECK(with(R"({"type": "none"})").choice == router::tool_choice_mode::none);
  const auto named = with(R"({"type": "tool", "name": "f"})");
  CHECK(named.choice == router::tool_choice_mode::named);
  CHECK(named.named == "f");
}

TEST_CASE("anthropic: output_config.format is a JSON Schema the text is decoded under") {
  const auto g = parse_ok(R"({"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}],
    "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object",
      "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["b", "a"]}}}})");
  CHECK(g.constraint.kind == "json_schema");
  CHECK(g.constraint.schema.find(R"("b")") < g.constraint.schema.find(R"("a")"));  // the client's order
  CHECK(parse_ok(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                     "output_format": {"type": "json_schema", "schema": {"type": "object"}}})")
            .constraint.kind == "json_schema");
  CHECK(parse_err(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                      "output_config": {"format": {"type": "text"}}})")
            .param == "output_config.format.type");
  CHECK(parse_err(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                      "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"},
                      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}})")
            .param == "output_config.format");
}

TEST_CASE("anthropic: count_tokens needs no max_tokens, messages do") {
  CHECK(parse_ok(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})", true).model == "m");
  const api_error e = parse_err(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})");
  CHECK(e.status == 400);
  CHECK(e.param == "max_tokens");
  CHECK(e.code == "missing_required_parameter");
}

TEST_CASE("anthropic: bad and unsupported fields are 400s naming the field") {
  struct row {
    const char* body;
    const char* param;
  };
  for (const row& r : std::vector<row>{
           {R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]})",
            "messages[0].content[0].type"},
           {R"({"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]})", "messages[0].role"},
           {R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_use",
              "id": "a", "name": "f", "input": {}}]}]})",
            "messages[0].content[0].type"},
           {R"({"model": "m", "max_tokens": 4, "messages": [], "system": "s"})", "messages"},
           {R"({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]})", "max_tokens"},
           {R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "thinking",
              "thinking": "t", "signature": ""}]}]})",
            "messages[0].content[0].type"},
           {R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
              "stop_sequences": ["a", "b", "c", "d", "e"]})",
            "stop_sequences"},
           {R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
              "tools": [{"name": "f"}]})",
            "tools[0].input_schema"},
           {R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
              "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "g"}})",
            "tool_choice.name"},
           {R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
              "tools": [{"type": "web_search_20250305", "name": "web_search"}]})",
            "tools[0].type"},
           {R"([1])", ""},
       }) {
    INFO(r.body);
    const api_error e = parse_err(r.body);
    CHECK(e.status == 400);
    CHECK(e.param == r.param);
  }
  CHECK(parse_err("{not json").code == "invalid_json");
}

TEST_CASE("anthropic: thinking enabled or disabled is the template's thinking switch") {
  const auto with = [](const std::string& thinking) {
    return R"({"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "x"}], "thinking": )" +
           thinking + "}";
  };
  CHECK(parse_ok(with(R"({"type": "enabled", "budget_tokens": 1024})")).thinking == true);
  // budget_tokens is the worker's thinking budget (thinking_token_budget on the OpenAI route).
  CHECK(parse_ok(with(R"({"type": "enabled", "budget_tokens": 1500})")).sampling.thinking_budget == 1500);
  CHECK(parse_ok(with(R"({"type": "enabled", "budget_tokens": 99999999999})")).sampling.thinking_budget ==
        std::numeric_limits<int32_t>::max());
  CHECK(parse_ok(with(R"({"type": "disabled"})")).sampling.thinking_budget == 0);
  CHECK(parse_ok(with(R"({"type": "enabled", "budget_tokens": 100000, "display": "summarized"})")).thinking == true);
  CHECK(parse_ok(with(R"({"type": "disabled"})")).thinking == false);
  CHECK_FALSE(parse_ok(with(R"({"type": "adaptive"})")).thinking.has_value());  // the template's default
  CHECK_FALSE(parse_ok(with("null")).thinking.has_value());
  // count_tokens renders the same prompt.
  CHECK(parse_ok(R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
                     "thinking": {"type": "enabled", "budget_tokens": 2048}})",
                 true)
            .thinking == true);
  struct row {
    const char* thinking;
    const char* param;
    const char* code;
  };
  for (const row& r : std::vector<row>{
           {R"({"type": "enabled", "budget_tokens": 1023})", "thinking.budget_tokens", "invalid_value"},
           {R"({"type": "enabled", "budget_tokens": -2048})", "thinking.budget_tokens", "invalid_value"},
           {R"({"type": "enabled"})", "thinking.budget_tokens", "missing_required_parameter"},
           {R"({"type": "enabled", "budget_tokens": "2048"})", "thinking.budget_tokens", "invalid_type"},
           {R"({"type": "enabled", "budget_tokens": 2048.5})", "thinking.budget_tokens", "invalid_type"},
           {R"({"type": "on"})", "thinking.type", "invalid_value"},
           {R"({"budget_tokens": 2048})", "thinking.type", "missing_required_parameter"},
           {R"(true)", "thinking", "invalid_type"},
       }) {
    INFO(r.thinking);
    const api_error e = parse_err(with(r.thinking));
    CHECK(e.status == 400);
    CHECK(e.param == r.param);
    CHECK(e.code == r.code);
  }
  CHECK(parse_err(with(R"({"type": "enabled", "budget_tokens": 1000})")).message.find("at least 1024") !=
        std::string::npos);
}

TEST_CASE("anthropic: thinking blocks given back in assistant turns are dropped") {
  const auto g = parse_ok(R"({"model": "m", "max_tokens": 64, "messages": [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "They want Paris.", "signature": ""},
      {"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "Let me look."},
      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21"}]}],
    "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]})");
  REQUIRE(g.messages.size() == 3);
  CHECK(g.messages[1].content == "Let me look.");
  CHECK(g.messages[1].tool_calls.size() == 1);
}

TEST_CASE("anthropic: a response is an Anthropic message") {
  router::response_meta meta;
  meta.id = "msg_1";
  meta.model = "m";
  const auto g = parse_ok(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                              "stop_sequences": ["END"]})");
  router::enable_anthropic(meta, g, 7);
  router::choice_result c;
  c.text = "Hello";
  c.finish_reason = sy::finish_reason::stop;
  const json j = json::parse(router::format_response(meta, {c}, {7, 3, 0}));
  CHECK(j["type"] == "message");
  CHECK(j["role"] == "assistant");
  CHECK(j["content"] == json::parse(R"([{"type": "text", "text": "Hello"}])"));
  CHECK(j["stop_reason"] == "stop_sequence");
  CHECK(j["stop_sequence"] == "END");
  CHECK(j["usage"] == json::parse(R"({"input_tokens": 7, "cache_creation_input_tokens": 0,
                                      "cache_read_input_tokens": 0, "output_tokens": 3})"));
  c.finish_reason = sy::finish_reason::length;
  CHECK(json::parse(router::format_response(meta, {c}, {7, 3, 0}))["stop_reason"] == "max_tokens");
  router::anthropic_state st;
  CHECK(router::anthropic_stop_reason(st, sy::finish_reason::stop, false) == "end_turn");
  st.stop_sequences = {"END"};
  CHECK(router::anthropic_stop_reason(st, sy::finish_reason::stop, true) == "tool_use");
  CHECK(router::anthropic_stop_reason(st, sy::finish_reason::stop, false) == "stop_sequence");  // unknown: the sequence
  st.ended_on_eog = true;  // the dispatcher saw the end-of-generation token
  CHECK(router::anthropic_stop_reason(st, sy::finish_reason::stop, false) == "end_turn");
  st.ended_on_eog = false;
  CHECK(router::anthropic_stop_reason(st, sy::finish_reason::stop, false) == "stop_sequence");
  st.constrained = true;  // a grammar's end, not a stop string
  CHECK(router::anthropic_stop_reason(st, sy::finish_reason::stop, false) == "end_turn");
}

TEST_CASE("anthropic: stop_sequence names the exact sequence the worker found") {
  const auto g = parse_ok(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                              "stop_sequences": ["END", "\n\nHuman:", "###"]})");
  const auto meta_for = [&] {
    router::response_meta meta;
    meta.id = "msg_1";
    meta.model = "m";
    router::enable_anthropic(meta, g, 7);
    meta.anthropic->ended_on_eog = false;
    meta.anthropic->stop_matched = "\n\nHuman:";  // the second one, not the first
    return meta;
  };
  router::choice_result c;
  c.text = "Hello";
  c.finish_reason = sy::finish_reason::stop;
  const router::response_meta whole = meta_for();
  const json j = json::parse(router::format_response(whole, {c}, {7, 3, 0}));
  CHECK(j["stop_reason"] == "stop_sequence");
  CHECK(j["stop_sequence"] == "\n\nHuman:");
  CHECK(j["content"][0]["text"] == "Hello");

  const router::response_meta streamed = meta_for();
  std::vector<std::pair<std::string, json>> all;
  for (auto& e : events(router::format_chunk(streamed, 0, "Hello", true, sy::finish_reason::stop, {})))
    all.push_back(e);
  for (const auto& piece : router::format_stream_end(streamed, {7, 3, 0}, false))
    for (auto& e : events(piece)) all.push_back(e);
  REQUIRE(all.size() >= 2);
  const json& delta = all[all.size() - 2].second;
  CHECK(delta["type"] == "message_delta");
  CHECK(delta["delta"]["stop_reason"] == "stop_sequence");
  CHECK(delta["delta"]["stop_sequence"] == "\n\nHuman:");

  router::anthropic_state st;
  st.stop_sequences = {"END", "###"};
  st.stop_matched = "###";
  st.ended_on_eog = true;  // what the worker names wins
  CHECK(router::anthropic_stop_reason(st, sy::finish_reason::stop, false) == "stop_sequence");
  CHECK(router::anthropic_stop_reason(st, sy::finish_reason::length, false) == "max_tokens");
  st.stop_matched = "<|im_end|>";  // a stop string the client did not give: the end of the turn
  CHECK(router::anthropic_stop_reason(st, sy::finish_reason::stop, false) == "end_turn");
}

TEST_CASE("anthropic: usage says the prompt tokens read from the prefix cache apart, whole and streamed") {
  router::response_meta meta;
  meta.id = "msg_1";
  meta.model = "m";
  const auto g = parse_ok(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})");
  router::enable_anthropic(meta, g, 40);
  router::choice_result c;
  c.text = "Hi";
  c.finish_reason = sy::finish_reason::stop;
  const json whole = json::parse(router::format_response(meta, {c}, {40, 2, 32}));
  CHECK(whole["usage"] == json::parse(R"({"input_tokens": 8, "cache_creation_input_tokens": 0,
                                          "cache_read_input_tokens": 32, "output_tokens": 2})"));
  // A live stream: message_start has the whole prompt (the worker tells what its cache served
  // with the last frame), message_delta the final split, as Anthropic's cumulative usage does.
  std::vector<std::pair<std::string, json>> all;
  for (auto& e : events(router::format_chunk(meta, 0, "Hi", true, sy::finish_reason::stop, {}))) all.push_back(e);
  for (const auto& piece : router::format_stream_end(meta, {40, 2, 32}, false))
    for (auto& e : events(piece)) all.push_back(e);
  REQUIRE(all.front().first == "message_start");
  CHECK(all.front().second["message"]["usage"] == json::parse(R"({"input_tokens": 40, "cache_creation_input_tokens": 0,
                                                                  "cache_read_input_tokens": 0, "output_tokens": 0})"));
  const json& delta = all[all.size() - 2].second;
  REQUIRE(delta["type"] == "message_delta");
  CHECK(delta["usage"] == whole["usage"]);
  // Known before the stream (a cache replay: all of it): message_start says it too.
  router::response_meta replay;
  replay.id = "msg_2";
  replay.model = "m";
  router::enable_anthropic(replay, g, 40);
  replay.anthropic->cached_tokens = 40;
  const auto start = events(router::format_chunk(replay, 0, "Hi", true, sy::finish_reason::none, {}));
  CHECK(start.front().second["message"]["usage"]["input_tokens"] == 0);
  CHECK(start.front().second["message"]["usage"]["cache_read_input_tokens"] == 40);
}

TEST_CASE("anthropic: a stream is message_start, blocks, message_delta, message_stop") {
  router::response_meta meta;
  meta.id = "msg_1";
  meta.model = "m";
  const auto g = parse_ok(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})");
  router::enable_anthropic(meta, g, 5);
  std::vector<std::pair<std::string, json>> all;
  for (const auto& piece : {router::format_chunk(meta, 0, "Hel", true, sy::finish_reason::none, {}),
                            router::format_chunk(meta, 0, "lo", false, sy::finish_reason::none, {}),
                            router::format_chunk(meta, 0, "", false, sy::finish_reason::stop, {})})
    for (auto& e : events(piece)) all.push_back(e);
  for (const auto& piece : router::format_stream_end(meta, {5, 2, 0}, false))
    for (auto& e : events(piece)) all.push_back(e);
  std::vector<std::string> names;
  std::string text;
  for (const auto& [name, data] : all) {
    names.push_back(name);
    CHECK(data["type"] == name);
    if (name == "content_block_delta") text += data["delta"]["text"].get<std::string>();
  }
  CHECK(names == std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                          "content_block_delta", "content_block_stop", "message_delta",
                                          "message_stop"});
  CHECK(text == "Hello");
  CHECK(all[0].second["message"]["usage"]["input_tokens"] == 5);
  CHECK(all[5].second["delta"]["stop_reason"] == "end_turn");
  CHECK(all[5].second["usage"]["output_tokens"] == 2);
}

TEST_CASE("anthropic: a streamed tool_use's input adds up to the non-streamed input") {
  const auto g = parse_ok(R"({"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}],
    "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}],
    "tool_choice": {"type": "tool", "name": "f"}})");
  const std::string text = R"({"name": "f", "arguments": {"a": "b c"}})";
  const auto meta_for = [&] {
    router::response_meta meta;
    meta.id = "msg_2";
    meta.model = "m";
    meta.kind = router::endpoint::chat_completions;
    router::enable_tool_calls(meta, g, sy::chat_format::chatml);
    router::enable_anthropic(meta, g, 9);
    return meta;
  };
  router::response_meta whole = meta_for();
  router::choice_result c;
  c.text = text;
  c.finish_reason = sy::finish_reason::stop;
  const json j = json::parse(router::format_response(whole, {c}, {9, 12, 0}));
  REQUIRE(j["content"].size() == 1);
  CHECK(j["content"][0]["type"] == "tool_use");
  CHECK(j["content"][0]["name"] == "f");
  CHECK(j["content"][0]["input"] == json::parse(R"({"a": "b c"})"));
  CHECK(j["stop_reason"] == "tool_use");

  router::response_meta streamed = meta_for();
  std::string partial, tool_id, stop_reason;
  for (size_t i = 0; i < text.size(); i += 3) {
    const bool last = i + 3 >= text.size();
    for (const auto& [name, data] : events(router::format_chunk(
             streamed, 0, text.substr(i, 3), i == 0, last ? sy::finish_reason::stop : sy::finish_reason::none, {}))) {
      if (name == "content_block_start") tool_id = data["content_block"]["id"];
      if (name == "content_block_delta") {
        REQUIRE(data["delta"]["type"] == "input_json_delta");
        partial += data["delta"]["partial_json"].get<std::string>();
      }
    }
  }
  for (const auto& piece : router::format_stream_end(streamed, {9, 12, 0}, false))
    for (const auto& [name, data] : events(piece))
      if (name == "message_delta") stop_reason = data["delta"]["stop_reason"];
  CHECK(json::parse(partial) == j["content"][0]["input"]);
  CHECK(tool_id == j["content"][0]["id"]);
  CHECK(stop_reason == "tool_use");
}

TEST_CASE("anthropic: errors have Anthropic's shape, as bodies and as stream events") {
  api_error e = router::bad_request("max_tokens", "'max_tokens' is required", "missing_required_parameter");
  CHECK(json::parse(router::anthropic_error(e)) ==
        json::parse(R"({"type": "error", "error": {"type": "invalid_request_error",
                        "message": "'max_tokens' is required"}})"));
  e.status = 500;
  e.type = "server_error";
  CHECK(json::parse(router::anthropic_error(e))["error"]["type"] == "api_error");
  router::response_meta meta;
  meta.anthropic = std::make_shared<router::anthropic_state>();
  const auto ev = router::format_stream_error(meta, e);
  REQUIRE(ev.size() == 1);
  const auto parsed = events(ev[0]);
  REQUIRE(parsed.size() == 1);
  CHECK(parsed[0].first == "error");
  CHECK(parsed[0].second["type"] == "error");
  CHECK(json::parse(router::format_anthropic_count(42)) == json::parse(R"({"input_tokens": 42})"));
}
