// Responses API edge tests (router/openai/responses_api.hpp): a body with every mapped field becomes the
// native chat request /v1/chat/completions would make; input items (messages, function calls and
// their outputs) and a stored conversation become chat messages; bad and unsupported fields are
// 400s naming the field in the Responses API's terms; the response object, its stream's event
// sequence (numbered, adding up to the whole response), incomplete and failed responses, the
// stored record and the history a follow-up reads from it; the exchange that holds a finished
// response until its store write returned.
#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "router/http/responses_store.hpp"
#include "router/openai/responses_api.hpp"
#include "tests/unit/router_fakes.hpp"
#include "tests/unit/sse_events.hpp"

using nlohmann::json;
using sy::router::api_error;
using sy::router::generation_request;
using sy::router::responses_request;
namespace router = sy::router;

namespace {

responses_request parse_ok(std::string_view body) {
  auto r = router::parse_responses_request(body, {});
  if (const auto* e = std::get_if<api_error>(&r)) {
    INFO("unexpected error: " << e->param << ": " << e->message);
    FAIL("request was rejected");
  }
  return std::get<responses_request>(r);
}

generation_request chat_of(const responses_request& r, std::string_view history = "") {
  auto g = router::responses_generation(r, history, {});
  if (const auto* e = std::get_if<api_error>(&g)) {
    INFO("unexpected error: " << e->param << ": " << e->message);
    FAIL("request was rejected");
  }
  return std::get<generation_request>(g);
}

api_error parse_err(std::string_view body) {
  auto r = router::parse_responses_request(body, {});
  INFO("body: " << body);
  REQUIRE(std::holds_alternative<api_error>(r));
  return std::get<api_error>(r);
}

std::vector<std::pair<std::string, json>> events(const std::string& text) { return sy::test::named_events(text); }

router::response_meta meta_for(const responses_request& r, const generation_request& g, std::string_view history = "",
                               bool store = true) {
  router::response_meta meta;
  meta.id = "resp_0123456789abcdef";
  meta.model = "m";
  meta.created = 1700000000;
  meta.kind = router::endpoint::chat_completions;
  router::enable_tool_calls(meta, g, sy::chat_format::chatml);
  router::enable_responses(meta, r, history, store);
  return meta;
}

}  // namespace

TEST_CASE("responses: a body with every mapped field becomes the native chat request") {
  const auto r = parse_ok(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 64, "temperature": 0.5, "top_p": 0.9,
    "user": "u1", "metadata": {"k": "v"}, "parallel_tool_calls": false, "store": false, "stream": true,
    "input": [
      {"role": "user", "content": "Weather?"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
      {"role": "developer", "content": [{"type": "input_text", "text": "Use "}, {"type": "input_text", "text": "C."}]}
    ],
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": "auto"})");
  CHECK(r.model == "m");
  CHECK_FALSE(r.store);
  CHECK(r.stream);
  const auto g = chat_of(r);
  CHECK(g.kind == router::endpoint::chat_completions);
  CHECK(g.sampling.max_tokens == 64);
  CHECK(g.max_tokens_given);
  CHECK(g.sampling.temperature == Approx(0.5));
  CHECK(g.sampling.top_p == Approx(0.9));
  CHECK(g.stream);
  CHECK(g.user == "u1");
  CHECK_FALSE(g.tools.parallel);
  REQUIRE(g.messages.size() == 5);
  CHECK(g.messages[0].role == "system");
  CHECK(g.messages[0].content == "Be brief.");
  CHECK(g.messages[1].role == "user");
  CHECK(g.messages[2].role == "assistant");
  CHECK(g.messages[2].content == "Let me look.");
  REQUIRE(g.messages[2].tool_calls.size() == 1);  // the function_call joins the assistant turn
  CHECK(g.messages[2].tool_calls[0].id == "call_1");
  CHECK(g.messages[2].tool_calls[0].name == "get_weather");
  CHECK(json::parse(g.messages[2].tool_calls[0].arguments) == json::parse(R"({"city": "Paris"})"));
  CHECK(g.messages[3].role == "tool");
  CHECK(g.messages[3].tool_call_id == "call_1");
  CHECK(g.messages[3].content == "21 C");
  CHECK(g.messages[4].role == "system");  // developer
  CHECK(g.messages[4].content == "Use C.");
  REQUIRE(g.tools.tools.size() == 1);
  CHECK(g.tools.tools[0].name == "get_weather");
  // The echo: the request's parameters as the response shows them.
  const json echo = json::parse(r.echo);
  CHECK(echo["instructions"] == "Be brief.");
  CHECK(echo["max_output_tokens"] == 64);
  CHECK(echo["metadata"] == json::parse(R"({"k": "v"})"));
  CHECK(echo["parallel_tool_calls"] == false);
  CHECK(echo["store"] == false);
  CHECK(echo["tool_choice"] == "auto");
  CHECK(echo["tools"][0]["name"] == "get_weather");
  CHECK(echo["tools"][0]["strict"] == true);
  CHECK(echo["text"] == json::parse(R"({"format": {"type": "text"}})"));
}

TEST_CASE("responses: a string input is one user message, defaults echoed") {
  const auto r = parse_ok(R"({"model": "m", "input": "Hi"})");
  CHECK(r.store);
  CHECK(r.previous_response_id.empty());
  const auto g = chat_of(r);
  REQUIRE(g.messages.size() == 1);
  CHECK(g.messages[0].role == "user");
  CHECK(g.messages[0].content == "Hi");
  CHECK_FALSE(g.max_tokens_given);
  const json echo = json::parse(r.echo);
  CHECK(echo["temperature"] == 1.0);
  CHECK(echo["top_p"] == 1.0);
  CHECK(echo["max_output_tokens"].is_null());
  CHECK(echo["previous_response_id"].is_null());
  CHECK(echo["tools"] == json::array());
  CHECK(echo["metadata"] == json::object());
}

TEST_CASE("responses: tool_choice and text.format map to OpenAI's") {
  const std::string tools = R"("tools": [{"type": "function", "name": "f", "parameters": {"type": "object",
    "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false}}])";
  auto g = chat_of(parse_ok(R"({"model": "m", "input": "x", )" + tools + R"(, "tool_choice": "required"})"));
  CHECK(g.tools.choice == router::tool_choice_mode::required);
  g = chat_of(
      parse_ok(R"({"model": "m", "input": "x", )" + tools + R"(, "tool_choice": {"type": "function", "name": "f"}})"));
  CHECK(g.tools.choice == router::tool_choice_mode::named);
  CHECK(g.tools.named == "f");
  g = chat_of(parse_ok(R"({"model": "m", "input": "x", )" + tools + R"(, "tool_choice": "none"})"));
  CHECK_FALSE(g.tools.active());

  const auto r = parse_ok(R"({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "out",
    "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}})");
  g = chat_of(r);
  CHECK(g.constraint.kind == "json_schema");
  const json echo = json::parse(r.echo);
  CHECK(echo["text"]["format"]["type"] == "json_schema");
  CHECK(echo["text"]["format"]["name"] == "out");
  CHECK(echo["text"]["format"]["strict"] == true);
  g = chat_of(parse_ok(R"({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}})"));
  CHECK(g.constraint.kind == "json_object");
}

TEST_CASE("responses: bad and unsupported fields are 400s naming the field") {
  struct bad {
    std::string body;
    const char* param;
  };
  for (const bad& b : std::vector<bad>{
           {R"({"input": "x"})", "model"},
           {R"({"model": "m"})", "input"},
           {R"({"model": "m", "input": 7})", "input"},
           {R"({"model": "m", "input": []})", "input"},
           {R"({"model": "m", "input": [{"role": "tool", "content": "x"}]})", "input[0].role"},
           {R"({"model": "m", "input": [{"role": "user"}]})", "input[0].content"},
           {R"({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]})",
            "input[0].content[0].type"},
           {R"({"model": "m", "input": [{"type": "item_reference", "id": "x"}]})", "input[0].type"},
           {R"({"model": "m", "input": [{"type": "function_call", "name": "f"}]})", "input[0].call_id"},
           {R"({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]})", "input[0].output"},
           {R"({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type"},
           {R"({"model": "m", "input": "x", "tools": [{"type": "function"}]})", "tools[0].name"},
           {R"({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f", "parameters": 3}]})",
            "tools[0].parameters"},
           {R"({"model": "m", "input": "x", "tool_choice": "sometimes"})", "tool_choice"},
           {R"({"model": "m", "input": "x", "tool_choice": {"type": "file_search"}})", "tool_choice.type"},
           {R"({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}})", "text.format.type"},
           {R"({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}})",
            "text.format.schema"},
           {R"({"model": "m", "input": "x", "background": true})", "background"},
           {R"({"model": "m", "input": "x", "include": ["file_search_call.results"]})", "include[0]"},
           {R"({"model": "m", "input": "x", "include": "message.output_text.logprobs"})", "include"},
           {R"({"model": "m", "input": "x", "top_logprobs": "5"})", "top_logprobs"},
           {R"({"model": "m", "input": "x", "conversation": "conv_1"})", "conversation"},
           {R"({"model": "m", "input": "x", "prompt": {"id": "p"}})", "prompt"},
           {R"({"model": "m", "input": "x", "reasoning": {"effort": "low"}})", "reasoning.effort"},
           {R"({"model": "m", "input": "x", "truncation": "auto"})", "truncation"},
           {R"({"model": "m", "input": "x", "max_output_tokens": 0})", "max_output_tokens"},
           {R"({"model": "m", "input": "x", "temperature": 5})", "temperature"},
           {R"({"model": "m", "input": "x", "metadata": {"k": 1}})", "metadata.k"},
           {R"({"model": "m", "input": "x", "metadata": {"k": ")" + std::string(513, 'v') + R"("}})", "metadata"},
           {R"({"model": "m", "input": "x", "store": "yes"})", "store"},
           {R"({"model": "m", "input": "x", "previous_response_id": 5})", "previous_response_id"},
       }) {
    const api_error e = parse_err(b.body);
    INFO(b.body << " -> " << e.param << ": " << e.message);
    CHECK(e.status == 400);
    CHECK(e.type == "invalid_request_error");
    CHECK(e.param == b.param);
    CHECK_FALSE(e.message.empty());
  }
  CHECK(parse_err("{nope").code == "invalid_json");
  CHECK(parse_err(R"({"model": "m", "input": "x", "background": true})").code == "unsupported_parameter");
  // Accepted as the API's no-ops.
  parse_ok(R"({"model": "m", "input": "x", "background": false, "include": [], "truncation": "disabled",
               "reasoning": {}, "service_tier": "auto"})");
}

TEST_CASE("responses: a response object with its message, usage and echo") {
  const auto r = parse_ok(R"({"model": "m", "input": "x", "max_output_tokens": 8, "metadata": {"a": "b"}})");
  const auto g = chat_of(r);
  auto meta = meta_for(r, g);
  router::choice_result c;
  c.text = "Hello";
  c.finish_reason = sy::finish_reason::stop;
  const json j = json::parse(router::format_response(meta, {c}, {7, 3, 2}));
  CHECK(j["id"] == "resp_0123456789abcdef");
  CHECK(j["object"] == "response");
  CHECK(j["created_at"] == 1700000000);
  CHECK(j["status"] == "completed");
  CHECK(j["incomplete_details"].is_null());
  CHECK(j["error"].is_null());
  CHECK(j["model"] == "m");
  REQUIRE(j["output"].size() == 1);
  const json& m = j["output"][0];
  CHECK(m["type"] == "message");
  CHECK(m["role"] == "assistant");
  CHECK(m["status"] == "completed");
  CHECK(m["id"] == "msg_0123456789abcdef_0");
  CHECK(m["content"] ==
        json::parse(R"([{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}])"));
  CHECK(j["usage"] == json::parse(R"({"input_tokens": 7, "input_tokens_details": {"cached_tokens": 2,
    "cache_write_tokens": 0}, "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10})"));
  CHECK(j["max_output_tokens"] == 8);
  CHECK(j["metadata"] == json::parse(R"({"a": "b"})"));
  CHECK(j["store"] == true);
  CHECK(j["parallel_tool_calls"] == true);
  CHECK(j["tool_choice"] == "auto");
  // The record a follow-up reads: the conversation, then this response's output.
  const std::string record = router::responses_record(*meta.responses);
  CHECK(json::parse(*router::responses_stored_response(record)) == j);
  const json history = json::parse(*router::responses_history(record));
  CHECK(history == json::parse(R"([
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]}])"));
  // Its input items (GET /v1/responses/{id}/input_items), newest first unless asked.
  const json listed = json::parse(*router::format_input_items(record, "resp_0123456789abcdef", false, 20, ""));
  CHECK(listed["object"] == "list");
  REQUIRE(listed["data"].size() == 1);
  CHECK(listed["data"][0]["id"] == "msg_0123456789abcdef_in0");
  CHECK(listed["data"][0]["content"][0]["text"] == "x");
  CHECK(listed["data"][0]["status"] == "completed");
  CHECK(listed["has_more"] == false);
  CHECK(listed["first_id"] == listed["last_id"]);
  CHECK_FALSE(router::format_input_items("{}", "resp_1", true, 20, "").has_value());
  CHECK_FALSE(router::responses_history("not json").has_value());
  CHECK_FALSE(router::responses_history(R"({"response": {}})").has_value());
  // Cut by max_output_tokens: incomplete. Without a store, `store` says false.
  auto unstored = meta_for(r, g, "", false);
  c.finish_reason = sy::finish_reason::length;
  const json cut = json::parse(router::format_response(unstored, {c}, {7, 8, 0}));
  CHECK(cut["status"] == "incomplete");
  CHECK(cut["incomplete_details"] == json::parse(R"({"reason": "max_output_tokens"})"));
  CHECK(cut["output"][0]["status"] == "incomplete");
  CHECK(cut["store"] == false);
}

TEST_CASE("responses: a follow-up's history comes before its input") {
  const std::string history =
      R"([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "I am Ada."}]},
          {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi Ada."}]}])";
  const auto r = parse_ok(R"({"model": "m", "input": "Who am I?", "instructions": "Be brief.",
                              "previous_response_id": "resp_1"})");
  CHECK(r.previous_response_id == "resp_1");
  const auto g = chat_of(r, history);
  REQUIRE(g.messages.size() == 4);
  CHECK(g.messages[0].content == "Be brief.");
  CHECK(g.messages[1].content == "I am Ada.");
  CHECK(g.messages[2].role == "assistant");
  CHECK(g.messages[3].content == "Who am I?");
  // The stored conversation grows by this input.
  auto meta = meta_for(r, g, history);
  CHECK(json::parse(meta.responses->conversation).size() == 3);
}

TEST_CASE("responses: a text stream is the documented event sequence and adds up to the response") {
  const auto r = parse_ok(R"({"model": "m", "input": "x"})");
  const auto g = chat_of(r);
  auto meta = meta_for(r, g);
  std::vector<std::pair<std::string, json>> all;
  for (const auto& piece : {router::format_chunk(meta, 0, "", true, sy::finish_reason::none, {}),
                            router::format_chunk(meta, 0, "Hel", false, sy::finish_reason::none, {}),
                            router::format_chunk(meta, 0, "lo", false, sy::finish_reason::none, {}),
                            router::format_chunk(meta, 0, "", false, sy::finish_reason::stop, {})})
    for (auto& e : events(piece)) all.push_back(e);
  for (const auto& piece : router::format_stream_end(meta, {5, 2, 0}, false))
    for (auto& e : events(piece)) all.push_back(e);
  std::vector<std::string> names;
  std::string text;
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& [name, data] = all[i];
    names.push_back(name);
    CHECK(data["type"] == name);
    CHECK(data["sequence_number"] == i);
    if (name == "response.output_text.delta") text += data["delta"].get<std::string>();
  }
  CHECK(names == std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                          "response.content_part.added", "response.output_text.delta",
                                          "response.output_text.delta", "response.output_text.done",
                                          "response.content_part.done", "response.output_item.done",
                                          "response.completed"});
  CHECK(text == "Hello");
  CHECK(all[0].second["response"]["status"] == "in_progress");
  CHECK(all[0].second["response"]["output"] == json::array());
  CHECK(all[2].second["item"]["status"] == "in_progress");
  CHECK(all[6].second["text"] == "Hello");
  const json& done = all.back().second["response"];
  CHECK(done["status"] == "completed");
  CHECK(done["output"][0]["content"][0]["text"] == "Hello");
  CHECK(done["output"][0]["id"] == all[2].second["item"]["id"]);
  CHECK(done["usage"]["output_tokens"] == 2);
  CHECK(json::parse(meta.responses->final_response) == done);  // what the store keeps

  // The same text whole: the same output.
  auto whole = meta_for(r, g);
  router::choice_result c;
  c.text = "Hello";
  c.finish_reason = sy::finish_reason::stop;
  CHECK(json::parse(router::format_response(whole, {c}, {5, 2, 0}))["output"] == done["output"]);
}

TEST_CASE("responses: include message.output_text.logprobs and top_logprobs are the chat route's logprobs") {
  const auto asked = parse_ok(R"({"model": "m", "input": "x", "include": ["message.output_text.logprobs"],
                                  "top_logprobs": 2})");
  const auto g = chat_of(asked);
  CHECK(g.want_logprobs);
  CHECK(g.sampling.logprobs == 2);
  CHECK(json::parse(asked.echo)["top_logprobs"] == 2);
  // top_logprobs alone returns nothing, as the API's; without either, none.
  CHECK_FALSE(chat_of(parse_ok(R"({"model": "m", "input": "x", "top_logprobs": 2})")).want_logprobs);
  CHECK(parse_err(R"({"model": "m", "input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 99})")
            .param == "top_logprobs");

  const std::vector<router::token_logprobs> lps = {{"Hel", -0.5f, {{"Hel", -0.5f}, {"He", -1.5f}}},
                                                   {"lo", -0.25f, {{"lo", -0.25f}, {"p", -2.f}}}};
  auto whole = meta_for(asked, g);
  router::choice_result c;
  c.text = "Hello";
  c.finish_reason = sy::finish_reason::stop;
  c.logprobs = lps;
  const json body = json::parse(router::format_response(whole, {c}, {5, 2, 0}));
  const json& part = body["output"][0]["content"][0];
  REQUIRE(part["logprobs"].size() == 2);
  CHECK(part["logprobs"][0]["token"] == "Hel");
  CHECK(part["logprobs"][0]["logprob"] == -0.5);
  CHECK(part["logprobs"][0]["bytes"] == json::array({72, 101, 108}));
  CHECK(part["logprobs"][1]["top_logprobs"][1] == json{{"token", "p"}, {"logprob", -2.0}, {"bytes", {112}}});

  // Streamed: each delta carries the logprobs received with it; a token that makes no text yet
  // has its logprob go with the next delta. They add up to the whole response's.
  auto meta = meta_for(asked, g);
  std::vector<std::pair<std::string, json>> all;
  for (const auto& piece : {router::format_chunk(meta, 0, "", true, sy::finish_reason::none, {lps[0]}),
                            router::format_chunk(meta, 0, "Hello", false, sy::finish_reason::none, {lps[1]}),
                            router::format_chunk(meta, 0, "", false, sy::finish_reason::stop, {})})
    for (auto& e : events(piece)) all.push_back(e);
  for (const auto& piece : router::format_stream_end(meta, {5, 2, 0}, false))
    for (auto& e : events(piece)) all.push_back(e);
  json streamed = json::array();
  for (const auto& [name, data] : all)
    if (name == "response.output_text.delta")
      for (const auto& lp : data["logprobs"]) streamed.push_back(lp);
  CHECK(streamed == part["logprobs"]);
  const auto done =
      std::find_if(all.begin(), all.end(), [](const auto& e) { return e.first == "response.output_text.done"; });
  REQUIRE(done != all.end());
  CHECK(done->second["logprobs"] == part["logprobs"]);
  CHECK(all.back().second["response"]["output"] == body["output"]);
}

TEST_CASE("responses: a streamed function call's arguments add up to the non-streamed call") {
  const auto r = parse_ok(R"({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f",
    "parameters": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
    "additionalProperties": false}}], "tool_choice": {"type": "function", "name": "f"}})");
  const auto g = chat_of(r);
  const std::string text = R"({"name": "f", "arguments": {"a": "b c"}})";
  auto whole = meta_for(r, g);
  router::choice_result c;
  c.text = text;
  c.finish_reason = sy::finish_reason::stop;
  const json j = json::parse(router::format_response(whole, {c}, {9, 12, 0}));
  REQUIRE(j["output"].size() == 1);
  const json& call = j["output"][0];
  CHECK(call["type"] == "function_call");
  CHECK(call["name"] == "f");
  CHECK(call["status"] == "completed");
  CHECK(call["id"] == "fc_0123456789abcdef_0");
  CHECK(call["call_id"].get<std::string>().rfind("call_", 0) == 0);
  CHECK(json::parse(call["arguments"].get<std::string>()) == json::parse(R"({"a": "b c"})"));
  CHECK(j["tool_choice"] == json::parse(R"({"type": "function", "name": "f"})"));

  auto streamed = meta_for(r, g);
  std::string args, done_args;
  std::vector<std::string> names;
  for (size_t i = 0; i < text.size(); i += 3) {
    const bool last = i + 3 >= text.size();
    for (const auto& [name, data] : events(router::format_chunk(
             streamed, 0, text.substr(i, 3), i == 0, last ? sy::finish_reason::stop : sy::finish_reason::none, {}))) {
      names.push_back(name);
      if (name == "response.output_item.added") CHECK(data["item"]["call_id"] == call["call_id"]);
      if (name == "response.function_call_arguments.delta") args += data["delta"].get<std::string>();
      if (name == "response.function_call_arguments.done") done_args = data["arguments"];
    }
  }
  CHECK(args == call["arguments"]);
  CHECK(done_args == args);
  CHECK(names.back() == "response.output_item.done");
  const auto end = events(router::format_stream_end(streamed, {9, 12, 0}, false)[0]);
  REQUIRE(end.size() == 1);
  CHECK(end[0].first == "response.completed");
  CHECK(end[0].second["response"]["output"] == j["output"]);
}

TEST_CASE("responses: reasoning is an output item before the message") {
  const auto r = parse_ok(R"({"model": "m", "input": "x"})");
  const auto g = chat_of(r);
  auto whole = meta_for(r, g);
  router::enable_reasoning(whole, {});
  router::choice_result c;
  c.text = "<think>hmm</think>Yes.";
  c.finish_reason = sy::finish_reason::stop;
  router::usage_info u{4, 6, 0};
  u.reasoning_tokens = 1;
  const json j = json::parse(router::format_response(whole, {c}, u));
  REQUIRE(j["output"].size() == 2);
  CHECK(j["output"][0]["type"] == "reasoning");
  CHECK(j["output"][0]["content"] == json::parse(R"([{"type": "reasoning_text", "text": "hmm"}])"));
  CHECK(j["output"][0]["summary"] == json::array());
  CHECK(j["output"][1]["content"][0]["text"] == "Yes.");
  CHECK(j["usage"]["output_tokens_details"]["reasoning_tokens"] == 1);

  auto streamed = meta_for(r, g);
  router::enable_reasoning(streamed, {});
  std::vector<std::string> names;
  std::string thinking;
  for (const auto& piece : {router::format_chunk(streamed, 0, "<think>hm", true, sy::finish_reason::none, {}),
                            router::format_chunk(streamed, 0, "m</think>Yes.", false, sy::finish_reason::stop, {})})
    for (const auto& [name, data] : events(piece)) {
      names.push_back(name);
      if (name == "response.reasoning_text.delta") thinking += data["delta"].get<std::string>();
    }
  CHECK(thinking == "hmm");
  CHECK(std::find(names.begin(), names.end(), "response.reasoning_text.done") != names.end());
  const auto end = events(router::format_stream_end(streamed, u, false)[0]);
  CHECK(end[0].second["response"]["output"] == j["output"]);
  // Given back as input, reasoning items are dropped.
  const std::string record = router::responses_record(*whole.responses);
  CHECK(json::parse(*router::responses_history(record)).size() == 2);
}

TEST_CASE("responses: an empty answer is an empty message, and an error ends the stream failed") {
  const auto r = parse_ok(R"({"model": "m", "input": "x"})");
  const auto g = chat_of(r);
  auto whole = meta_for(r, g);
  router::choice_result c;
  c.finish_reason = sy::finish_reason::stop;
  const json j = json::parse(router::format_response(whole, {c}, {3, 1, 0}));
  REQUIRE(j["output"].size() == 1);
  CHECK(j["output"][0]["content"][0]["text"] == "");
  auto streamed = meta_for(r, g);
  const std::string first = router::format_chunk(streamed, 0, "", true, sy::finish_reason::stop, {});  // in this order
  const auto end = events(first + "\n\n" + router::format_stream_end(streamed, {3, 1, 0}, false)[0]);
  CHECK(end.back().second["response"]["output"] == j["output"]);

  auto failing = meta_for(r, g);
  api_error e;
  e.status = 504;
  e.type = "timeout_error";
  e.code = "deadline_exceeded";
  e.message = "the deadline passed";
  const auto ev = router::format_stream_error(failing, e);
  REQUIRE(ev.size() == 1);
  const auto parsed = events(ev[0]);
  REQUIRE(parsed.size() == 4);  // created, in_progress, error, failed
  CHECK(parsed[2].first == "error");
  CHECK(parsed[2].second["code"] == "deadline_exceeded");
  CHECK(parsed[3].first == "response.failed");
  CHECK(parsed[3].second["response"]["status"] == "failed");
  CHECK(parsed[3].second["response"]["error"]["message"] == "the deadline passed");
  CHECK(router::format_error(failing, e).find("\"error\"") != std::string::npos);  // a body: OpenAI's shape
  CHECK(json::parse(router::format_responses_deleted("resp_1")) ==
        json::parse(R"({"id": "resp_1", "object": "response.deleted", "deleted": true})"));
  CHECK(router::new_response_id().size() == 5 + 32);
  CHECK(router::new_response_id() != router::new_response_id());
}

TEST_CASE("responses: a finished response waits for its store write, streamed or not") {
  const auto r = parse_ok(R"({"model": "m", "input": "x"})");
  const auto g = chat_of(r);
  std::vector<std::string> records;
  std::vector<std::function<void()>> pending;  // the writes in flight: `then` not called yet
  const auto save = [&](std::string record, std::function<void()> then) {
    records.push_back(std::move(record));
    pending.push_back(std::move(then));
  };

  // Streamed: chunks pass (empty ones dropped); the last events and the end wait for the write.
  {
    auto meta = meta_for(r, g);
    auto inner = std::make_shared<sy::test::fake_exchange>();
    auto ex = router::responses_exchange(inner, meta.responses, save);
    ex->start_stream(200, {});
    ex->send_event(router::format_chunk(meta, 0, "Hi", true, sy::finish_reason::none, {}));
    ex->send_event("");  // a chunk with nothing to say
    ex->send_event(router::format_chunk(meta, 0, "", false, sy::finish_reason::stop, {}));
    const size_t before_end = inner->events.size();
    CHECK(before_end == 2);
    for (auto& e : router::format_stream_end(meta, {3, 1, 0}, false)) ex->send_event(std::move(e));
    ex->end_stream();
    CHECK(inner->events.size() == before_end);  // held
    CHECK(inner->log.back() != "end_stream");
    REQUIRE(records.size() == 1);
    REQUIRE(pending.size() == 1);
    const json rec = json::parse(records[0]);
    CHECK(rec["response"]["status"] == "completed");
    CHECK(rec["response"]["output"][0]["content"][0]["text"] == "Hi");
    CHECK(rec["conversation"].size() == 1);
    pending[0]();  // the write returned
    CHECK(inner->events.size() == before_end + 1);
    CHECK(events(inner->events.back())[0].first == "response.completed");
    CHECK(inner->log.back() == "end_stream");
  }
  // Whole: the body waits; an error passes at once, and nothing is stored.
  {
    auto meta = meta_for(r, g);
    auto inner = std::make_shared<sy::test::fake_exchange>();
    auto ex = router::responses_exchange(inner, meta.responses, save);
    router::choice_result c;
    c.text = "Yo";
    c.finish_reason = sy::finish_reason::stop;
    ex->respond({200, "application/json", {}, router::format_response(meta, {c}, {3, 1, 0})});
    CHECK(inner->responses.empty());
    REQUIRE(pending.size() == 2);
    pending[1]();
    REQUIRE(inner->responses.size() == 1);
    CHECK(inner->body()["output"][0]["content"][0]["text"] == "Yo");

    auto failed_meta = meta_for(r, g);
    auto failed_inner = std::make_shared<sy::test::fake_exchange>();
    auto failed = router::responses_exchange(failed_inner, failed_meta.responses, save);
    failed->respond({504, "application/json", {}, "{}"});
    CHECK(failed_inner->responses.size() == 1);
    CHECK(records.size() == 2);
  }
  // No store (store: false, or no Redis): nothing held.
  {
    auto meta = meta_for(r, g);
    auto inner = std::make_shared<sy::test::fake_exchange>();
    auto ex = router::responses_exchange(inner, meta.responses, {});
    router::choice_result c;
    c.finish_reason = sy::finish_reason::stop;
    ex->respond({200, "application/json", {}, router::format_response(meta, {c}, {3, 1, 0})});
    CHECK(inner->responses.size() == 1);
    CHECK(records.size() == 2);
  }
  CHECK(router::responses_store::key("a:b%", "resp_1") == "sy:v1:resp:a%3Ab%25:resp_1");
}

TEST_CASE("responses: input items page newest first, after an id") {
  const std::string record = R"({"response": {}, "conversation": [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "ok"}]})";
  const auto page = [&](bool desc, size_t limit, const std::string& after) {
    return json::parse(*router::format_input_items(record, "resp_ab", desc, limit, after));
  };
  json p = page(true, 2, "");
  REQUIRE(p["data"].size() == 2);
  CHECK(p["data"][0]["id"] == "fco_ab_in3");
  CHECK(p["data"][0]["output"] == "ok");
  CHECK(p["data"][1]["id"] == "fc_ab_in2");
  CHECK(p["has_more"] == true);
  p = page(true, 2, p["last_id"]);
  REQUIRE(p["data"].size() == 2);
  CHECK(p["data"][0]["content"][0]["annotations"] == json::array());  // an assistant message's output_text
  CHECK(p["data"][1]["id"] == "msg_ab_in0");
  CHECK(p["has_more"] == false);
  p = page(false, 20, "msg_ab_in0");
  CHECK(p["data"].size() == 3);
  CHECK(page(false, 20, "no_such_id")["data"].empty());
}
