// OpenAI API edge tests: a request with every field parses into the expected native struct for
// each endpoint; a table of bad bodies each yields the exact status, code and param; parsing
// never throws (garbage, deep nesting, invalid UTF-8); every formatted body parses back as JSON
// with exactly the keys of the OpenAI shapes, including token texts that split a UTF-8 char.
#include <catch2/catch.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "router/openai/openai_request.hpp"
#include "router/openai/openai_response.hpp"

using nlohmann::json;
using sy::router::api_error;
using sy::router::api_limits;
using sy::router::endpoint;
using sy::router::generation_request;
namespace router = sy::router;
namespace proto = sy::proto;

namespace {

using parse_result = std::variant<generation_request, api_error>;

parse_result parse(endpoint kind, std::string_view body, const api_limits& limits = {}) {
  return router::parse_generation_request(kind, body, limits);
}

generation_request parse_ok(endpoint kind, std::string_view body, const api_limits& limits = {}) {
  const parse_result r = parse(kind, body, limits);
  if (const auto* e = std::get_if<api_error>(&r)) {
    INFO("unexpected error: " << e->code << " / " << e->param << ": " << e->message);
    FAIL("request was rejected");
  }
  return std::get<generation_request>(r);
}

api_error parse_err(endpoint kind, std::string_view body, const api_limits& limits = {}) {
  const parse_result r = parse(kind, body, limits);
  INFO("body: " << body);
  REQUIRE(std::holds_alternative<api_error>(r));
  return std::get<api_error>(r);
}

std::set<std::string> keys(const json& j) {
  std::set<std::string> out;
  for (const auto& [k, v] : j.items()) out.insert(k);
  return out;
}

// Parses a formatted body; fails the test when it is not JSON.
json parsed(const std::string& text) {
  INFO("text: " << text);
  REQUIRE(json::accept(text));
  return json::parse(text);
}

const std::string k_replacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

TEST_CASE("completions request with every field parses into the native struct", "[openai_api]") {
  const generation_request r = parse_ok(endpoint::completions, R"({
    "model": "smollm2", "prompt": "Once upon a time", "n": 3, "stream": true,
    "stream_options": {"include_usage": true}, "echo": true, "temperature": 0.5, "top_p": 0.9,
    "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "seed": -1, "max_tokens": 100, "stop": ["\n", "END"],
    "ignore_eos": true, "logprobs": 5, "priority": -3, "timeout": 2.5, "queue_timeout": 0.5, "user": "alice",
    "some_future_field": {"x": [1, 2]}, "suffix": null
  })");
  CHECK(r.kind == endpoint::completions);
  CHECK(r.model == "smollm2");
  CHECK(r.prompt_text == "Once upon a time");
  CHECK_FALSE(r.prompt_is_tokens);
  CHECK(r.prompt_tokens.empty());
  CHECK(r.messages.empty());
  CHECK(r.n == 3);
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.echo);
  CHECK(r.sampling.temperature == Approx(0.5f));
  CHECK(r.sampling.top_p == Approx(0.9f));
  CHECK(r.sampling.top_k == 40);
  CHECK(r.sampling.min_p == Approx(0.05f));
  CHECK(r.sampling.repetition_penalty == Approx(1.1f));
  CHECK(r.sampling.has_seed);
  CHECK(r.sampling.seed == UINT64_MAX);  // -1's bit pattern
  CHECK(r.sampling.max_tokens == 100);
  CHECK(r.max_tokens_given);
  CHECK(r.sampling.stop == std::vector<std::string>{"\n", "END"});
  CHECK(r.sampling.ignore_eos);
  CHECK(r.sampling.logprobs == 5);
  CHECK(r.want_logprobs);
  REQUIRE(r.priority.has_value());
  CHECK(*r.priority == -3);
  REQUIRE(r.timeout_s.has_value());
  CHECK(*r.timeout_s == 2.5);
  REQUIRE(r.queue_timeout_s.has_value());
  CHECK(*r.queue_timeout_s == 0.5);
  CHECK(r.user == "alice");
  CHECK(r.sampling.repeat_last_n == proto::wire_sampling{}.repeat_last_n);
}

TEST_CASE("chat request with every field parses into the native struct", "[openai_api]") {
  const generation_request r = parse_ok(endpoint::chat_completions, R"({
    "model": "smollm2",
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "developer", "content": [{"type": "text", "text": "No "}, {"type": "text", "text": "emoji."}]},
      {"role": "user", "content": "Hi", "name": "bob"},
      {"role": "assistant", "content": null, "tool_calls": []},
      {"role": "assistant", "content": "Hello!"},
      {"role": "user", "content": [{"type": "text", "text": "Tell me a joke"}]}
    ],
    "n": 2, "stream": true, "stream_options": {"include_usage": false}, "temperature": 0,
    "top_p": 1, "top_k": -1, "min_p": 0, "repetition_penalty": 2, "presence_penalty": -2,
    "frequency_penalty": 2, "seed": 42, "max_tokens": 50, "max_completion_tokens": 70,
    "stop": "###", "ignore_eos": false, "logprobs": true, "top_logprobs": 3, "priority": 7,
    "timeout": 30, "user": "carol", "echo": "ignored for chat", "tools": null
  })");
  CHECK(r.kind == endpoint::chat_completions);
  CHECK(r.model == "smollm2");
  REQUIRE(r.messages.size() == 6);
  const std::vector<std::pair<std::string, std::string>> want = {{"system", "Be brief."}, {"system", "No emoji."},
                                                                 {"user", "Hi"},          {"assistant", ""},
                                                                 {"assistant", "Hello!"}, {"user", "Tell me a joke"}};
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("message " << i);
    CHECK(r.messages[i].role == want[i].first);
    CHECK(r.messages[i].content == want[i].second);
  }
  CHECK(r.prompt_text.empty());
  CHECK(r.prompt_tokens.empty());
  CHECK(r.n == 2);
  CHECK(r.stream);
  CHECK_FALSE(r.include_usage);
  CHECK_FALSE(r.echo);
  CHECK(r.sampling.temperature == 0.f);
  CHECK(r.sampling.top_p == 1.f);
  CHECK(r.sampling.top_k == 0);
  CHECK(r.sampling.min_p == 0.f);
  CHECK(r.sampling.repetition_penalty == 2.f);
  CHECK(r.sampling.has_seed);
  CHECK(r.sampling.seed == 42u);
  CHECK(r.sampling.max_tokens == 70);  // max_completion_tokens wins
  CHECK(r.max_tokens_given);
  CHECK(r.sampling.stop == std::vector<std::string>{"###"});
  CHECK_FALSE(r.sampling.ignore_eos);
  CHECK(r.want_logprobs);
  CHECK(r.sampling.logprobs == 3);
  REQUIRE(r.priority.has_value());
  CHECK(*r.priority == 7);
  REQUIRE(r.timeout_s.has_value());
  CHECK(*r.timeout_s == 30.0);
  CHECK(r.user == "carol");
}

TEST_CASE("a minimal request gets OpenAI defaults and leaves max_tokens to the router", "[openai_api]") {
  const generation_request c = parse_ok(endpoint::completions, R"({"model":"m","prompt":"x"})");
  proto::wire_sampling want;
  want.temperature = 1.f;
  want.top_p = 1.f;
  CHECK(c.sampling == want);
  CHECK(c.n == 1);
  CHECK_FALSE(c.stream);
  CHECK_FALSE(c.include_usage);
  CHECK_FALSE(c.echo);
  CHECK_FALSE(c.max_tokens_given);
  CHECK_FALSE(c.want_logprobs);
  CHECK_FALSE(c.priority.has_value());
  CHECK_FALSE(c.timeout_s.has_value());
  CHECK(c.user.empty());

  const generation_request h =
      parse_ok(endpoint::chat_completions, R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  CHECK(h.sampling == want);
  CHECK_FALSE(h.max_tokens_given);
  CHECK_FALSE(h.want_logprobs);
}

TEST_CASE("null for an optional field means absent", "[openai_api]") {
  const generation_request r = parse_ok(endpoint::completions, R"({"model":"m","prompt":"x","n":null,
    "stream":null,"stream_options":null,"temperature":null,"top_p":null,"top_k":null,"min_p":null,
    "repetition_penalty":null,"seed":null,"max_tokens":null,"max_completion_tokens":null,"stop":null,
    "ignore_eos":null,"logprobs":null,"priority":null,"timeout":null,"user":null,"echo":null})");
  proto::wire_sampling want;
  want.temperature = 1.f;
  CHECK(r.sampling == want);
  CHECK(r.n == 1);
  CHECK_FALSE(r.max_tokens_given);
  CHECK_FALSE(r.want_logprobs);
  CHECK_FALSE(r.priority.has_value());
  CHECK_FALSE(r.timeout_s.has_value());
}

TEST_CASE("completions prompt forms: string, token ids and the one-element batch", "[openai_api]") {
  const generation_request ids = parse_ok(endpoint::completions, R"({"model":"m","prompt":[1, 0, 2147483647, 5.0]})");
  CHECK(ids.prompt_is_tokens);
  CHECK(ids.prompt_tokens == std::vector<int32_t>{1, 0, 2147483647, 5});
  CHECK(ids.prompt_text.empty());

  const generation_request nested = parse_ok(endpoint::completions, R"({"model":"m","prompt":[[7, 8]]})");
  CHECK(nested.prompt_is_tokens);
  CHECK(nested.prompt_tokens == std::vector<int32_t>{7, 8});

  const generation_request one = parse_ok(endpoint::completions, R"({"model":"m","prompt":["héllo ✓"]})");
  CHECK_FALSE(one.prompt_is_tokens);
  CHECK(one.prompt_text == "héllo ✓");
  CHECK(one.prompt_tokens.empty());

  const generation_request escaped = parse_ok(endpoint::completions, R"({"model":"m","prompt":"a\u00e9\ud83d\ude80"})");
  CHECK(escaped.prompt_text == "a\xC3\xA9\xF0\x9F\x9A\x80");
}

TEST_CASE("integers given as integral floats are accepted, seeds keep their bit pattern", "[openai_api]") {
  const generation_request r =
      parse_ok(endpoint::completions, R"({"model":"m","prompt":"x","n":2.0,"max_tokens":1e2,"top_k":-1.0,
        "seed":18446744073709551615,"priority":-2147483648,"logprobs":0})");
  CHECK(r.n == 2);
  CHECK(r.sampling.max_tokens == 100);
  CHECK(r.sampling.top_k == 0);
  CHECK(r.sampling.seed == UINT64_MAX);
  CHECK(*r.priority == INT32_MIN);
  CHECK(r.want_logprobs);
  CHECK(r.sampling.logprobs == 0);

  CHECK(parse_ok(endpoint::completions, R"({"model":"m","prompt":"x","seed":-9223372036854775808})").sampling.seed ==
        (uint64_t{1} << 63));
  CHECK(parse_ok(endpoint::completions, R"({"model":"m","prompt":"x","seed":0})").sampling.has_seed);
  CHECK(parse_ok(endpoint::completions, R"({"model":"m","prompt":"x","top_k":0})").sampling.top_k == 0);
  CHECK(parse_ok(endpoint::completions, R"({"model":"m","prompt":"x","max_tokens":1048576})").sampling.max_tokens ==
        1048576);
}

TEST_CASE("completions logprobs accepts an int or a bool", "[openai_api]") {
  const generation_request t = parse_ok(endpoint::completions, R"({"model":"m","prompt":"x","logprobs":true})");
  CHECK(t.want_logprobs);
  CHECK(t.sampling.logprobs == 0);
  const generation_request f = parse_ok(endpoint::completions, R"({"model":"m","prompt":"x","logprobs":false})");
  CHECK_FALSE(f.want_logprobs);
  const generation_request n = parse_ok(endpoint::completions, R"({"model":"m","prompt":"x","logprobs":20})");
  CHECK(n.want_logprobs);
  CHECK(n.sampling.logprobs == 20);

  const generation_request chat = parse_ok(
      endpoint::chat_completions, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true})");
  CHECK(chat.want_logprobs);
  CHECK(chat.sampling.logprobs == 0);
  const generation_request chat_off = parse_ok(
      endpoint::chat_completions, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":false})");
  CHECK_FALSE(chat_off.want_logprobs);
}

TEST_CASE("bad requests are rejected with the exact status, code and param", "[openai_api]") {
  struct bad_case {
    const char* name;
    endpoint kind;
    std::string body;
    const char* code;
    const char* param;
  };
  const endpoint C = endpoint::completions;
  const endpoint H = endpoint::chat_completions;
  // Body builders: a valid request plus `extra` fields.
  auto cmp = [](const std::string& extra) { return R"({"model":"m","prompt":"hi",)" + extra + "}"; };
  auto chat = [](const std::string& extra) {
    return R"({"model":"m","messages":[{"role":"user","content":"hi"}],)" + extra + "}";
  };
  auto msgs = [](const std::string& messages) { return R"({"model":"m","messages":)" + messages + "}"; };
  const std::string long_stop(proto::k_max_stop_bytes + 1, 's');

  const std::vector<bad_case> cases = {
      // The body itself.
      {"malformed JSON", C, R"({"model":)", "invalid_json", ""},
      {"empty body", C, "", "invalid_json", ""},
      {"trailing garbage", C, R"({"model":"m","prompt":"x"} x)", "invalid_json", ""},
      {"array body", C, "[1,2]", "invalid_json", ""},
      {"string body", H, R"("hello")", "invalid_json", ""},
      {"null body", H, "null", "invalid_json", ""},
      {"invalid UTF-8 byte in a string", C, "{\"model\":\"m\",\"prompt\":\"a\xFF\xFE\"}", "invalid_json", ""},
      {"overlong UTF-8 in a string", C, "{\"model\":\"m\",\"prompt\":\"\xC0\xAF\"}", "invalid_json", ""},
      {"lone surrogate escape", C, R"({"model":"m","prompt":"\ud800"})", "invalid_json", ""},
      // model
      {"missing model", C, R"({"prompt":"hi"})", "missing_required_parameter", "model"},
      {"null model", H, R"({"model":null,"messages":[{"role":"user","content":"hi"}]})", "missing_required_parameter",
       "model"},
      {"model not a string", C, R"({"model":5,"prompt":"hi"})", "invalid_type", "model"},
      {"empty model", C, R"({"model":"","prompt":"hi"})", "invalid_value", "model"},
      // prompt
      {"missing prompt", C, R"({"model":"m"})", "missing_required_parameter", "prompt"},
      {"empty prompt", C, R"({"model":"m","prompt":""})", "invalid_value", "prompt"},
      {"prompt is a number", C, R"({"model":"m","prompt":5})", "invalid_type", "prompt"},
      {"prompt is an object", C, R"({"model":"m","prompt":{"text":"hi"}})", "invalid_type", "prompt"},
      {"prompt is an empty array", C, R"({"model":"m","prompt":[]})", "invalid_value", "prompt"},
      {"several prompts", C, R"({"model":"m","prompt":["a","b"]})", "invalid_value", "prompt"},
      {"several token prompts", C, R"({"model":"m","prompt":[[1],[2]]})", "invalid_value", "prompt"},
      {"one empty string prompt", C, R"({"model":"m","prompt":[""]})", "invalid_value", "prompt"},
      {"one empty token prompt", C, R"({"model":"m","prompt":[[]]})", "invalid_value", "prompt"},
      {"negative token id", C, R"({"model":"m","prompt":[1,-2]})", "invalid_value", "prompt"},
      {"token id beyond int32", C, R"({"model":"m","prompt":[4294967296]})", "invalid_value", "prompt"},
      {"fractional token id", C, R"({"model":"m","prompt":[1.5]})", "invalid_type", "prompt"},
      {"boolean token id", C, R"({"model":"m","prompt":[true]})", "invalid_type", "prompt"},
      {"mixed token ids and text", C, R"({"model":"m","prompt":[1,"a"]})", "invalid_type", "prompt"},
      {"nested wrong type", C, R"({"model":"m","prompt":[[1,"a"]]})", "invalid_type", "prompt"},
      {"triply nested tokens", C, R"({"model":"m","prompt":[[[1]]]})", "invalid_type", "prompt"},
      {"echo not a boolean", C, cmp(R"("echo":"yes")"), "invalid_type", "echo"},
      // n, stream, stream_options
      {"n zero", C, cmp(R"("n":0)"), "invalid_value", "n"},
      {"n too large", C, cmp(R"("n":9)"), "invalid_value", "n"},
      {"n a string", H, chat(R"("n":"2")"), "invalid_type", "n"},
      {"n fractional", H, chat(R"("n":1.5)"), "invalid_type", "n"},
      {"n a boolean", H, chat(R"("n":true)"), "invalid_type", "n"},
      {"stream a string", C, cmp(R"("stream":"true")"), "invalid_type", "stream"},
      {"stream_options without stream", C, cmp(R"("stream_options":{"include_usage":true})"), "invalid_value",
       "stream_options"},
      {"stream_options with stream false", H, chat(R"("stream":false,"stream_options":{})"), "invalid_value",
       "stream_options"},
      {"stream_options not an object", H, chat(R"("stream":true,"stream_options":5)"), "invalid_type",
       "stream_options"},
      {"include_usage not a boolean", H, chat(R"("stream":true,"stream_options":{"include_usage":"yes"})"),
       "invalid_type", "stream_options.include_usage"},
      // Sampling numbers.
      {"temperature a string", C, cmp(R"("temperature":"hot")"), "invalid_type", "temperature"},
      {"temperature a boolean", C, cmp(R"("temperature":true)"), "invalid_type", "temperature"},
      {"temperature above 2", C, cmp(R"("temperature":2.5)"), "invalid_value", "temperature"},
      {"temperature negative", C, cmp(R"("temperature":-0.1)"), "invalid_value", "temperature"},
      {"number literal no double holds", C, cmp(R"("temperature":1e999)"), "invalid_json", ""},
      {"top_p zero", C, cmp(R"("top_p":0)"), "invalid_value", "top_p"},
      {"top_p above 1", C, cmp(R"("top_p":1.01)"), "invalid_value", "top_p"},
      {"top_p an array", C, cmp(R"("top_p":[1])"), "invalid_type", "top_p"},
      {"top_k below -1", H, chat(R"("top_k":-2)"), "invalid_value", "top_k"},
      {"top_k fractional", H, chat(R"("top_k":2.5)"), "invalid_type", "top_k"},
      {"min_p above 1", H, chat(R"("min_p":1.5)"), "invalid_value", "min_p"},
      {"min_p a string", H, chat(R"("min_p":"0.1")"), "invalid_type", "min_p"},
      {"repetition_penalty zero", C, cmp(R"("repetition_penalty":0)"), "invalid_value", "repetition_penalty"},
      {"repetition_penalty above 2", C, cmp(R"("repetition_penalty":2.5)"), "invalid_value", "repetition_penalty"},
      {"presence_penalty above 2", C, cmp(R"("presence_penalty":3)"), "invalid_value", "presence_penalty"},
      {"frequency_penalty a string", C, cmp(R"("frequency_penalty":"x")"), "invalid_type", "frequency_penalty"},
      {"frequency_penalty below -2", C, cmp(R"("frequency_penalty":-2.5)"), "invalid_value", "frequency_penalty"},
      {"seed a string", C, cmp(R"("seed":"1")"), "invalid_type", "seed"},
      {"seed fractional", C, cmp(R"("seed":1.5)"), "invalid_type", "seed"},
      {"seed beyond 64 bits", C, cmp(R"("seed":1e30)"), "invalid_value", "seed"},
      // max_tokens
      {"max_tokens zero", C, cmp(R"("max_tokens":0)"), "invalid_value", "max_tokens"},
      {"max_tokens negative", C, cmp(R"("max_tokens":-5)"), "invalid_value", "max_tokens"},
      {"max_tokens above the cap", C, cmp(R"("max_tokens":1048577)"), "invalid_value", "max_tokens"},
      {"max_tokens beyond int32", C, cmp(R"("max_tokens":2147483648)"), "invalid_value", "max_tokens"},
      {"max_tokens beyond uint64", C, cmp(R"("max_tokens":99999999999999999999999)"), "invalid_value", "max_tokens"},
      {"max_tokens huge float", C, cmp(R"("max_tokens":1e30)"), "invalid_value", "max_tokens"},
      {"max_tokens a string", C, cmp(R"("max_tokens":"10")"), "invalid_type", "max_tokens"},
      {"max_tokens fractional", C, cmp(R"("max_tokens":10.5)"), "invalid_type", "max_tokens"},
      {"max_completion_tokens zero", H, chat(R"("max_completion_tokens":0)"), "invalid_value", "max_completion_tokens"},
      {"max_completion_tokens bad beside a good max_tokens", H, chat(R"("max_tokens":5,"max_completion_tokens":-1)"),
       "invalid_value", "max_completion_tokens"},
      // stop, ignore_eos
      {"stop a number", C, cmp(R"("stop":5)"), "invalid_type", "stop"},
      {"stop empty string", C, cmp(R"("stop":"")"), "invalid_value", "stop"},
      {"stop array with an empty string", C, cmp(R"("stop":["a",""])"), "invalid_value", "stop"},
      {"stop array with a number", C, cmp(R"("stop":["a",1])"), "invalid_type", "stop"},
      {"too many stop strings", H, chat(R"("stop":["a","b","c","d","e"])"), "invalid_value", "stop"},
      {"stop string too long", H, chat(R"("stop":[")" + long_stop + R"("])"), "invalid_value", "stop"},
      {"ignore_eos a number", C, cmp(R"("ignore_eos":1)"), "invalid_type", "ignore_eos"},
      // logprobs
      {"completions logprobs too many", C, cmp(R"("logprobs":21)"), "invalid_value", "logprobs"},
      {"completions logprobs negative", C, cmp(R"("logprobs":-1)"), "invalid_value", "logprobs"},
      {"completions logprobs a string", C, cmp(R"("logprobs":"5")"), "invalid_type", "logprobs"},
      {"chat logprobs an int", H, chat(R"("logprobs":1)"), "invalid_type", "logprobs"},
      {"top_logprobs without logprobs", H, chat(R"("top_logprobs":2)"), "invalid_value", "top_logprobs"},
      {"top_logprobs with logprobs false", H, chat(R"("logprobs":false,"top_logprobs":0)"), "invalid_value",
       "top_logprobs"},
      {"top_logprobs too many", H, chat(R"("logprobs":true,"top_logprobs":21)"), "invalid_value", "top_logprobs"},
      {"top_logprobs a string", H, chat(R"("logprobs":true,"top_logprobs":"3")"), "invalid_type", "top_logprobs"},
      // priority, timeout, user
      {"priority a string", C, cmp(R"("priority":"high")"), "invalid_type", "priority"},
      {"priority beyond int32", C, cmp(R"("priority":3000000000)"), "invalid_value", "priority"},
      {"timeout zero", C, cmp(R"("timeout":0)"), "invalid_value", "timeout"},
      {"timeout negative", C, cmp(R"("timeout":-1)"), "invalid_value", "timeout"},
      {"timeout a string", C, cmp(R"("timeout":"5")"), "invalid_type", "timeout"},
      {"timeout absurdly long", C, cmp(R"("timeout":1e300)"), "invalid_value", "timeout"},
      {"queue_timeout zero", C, cmp(R"("queue_timeout":0)"), "invalid_value", "queue_timeout"},
      {"queue_timeout a string", C, cmp(R"("queue_timeout":"5")"), "invalid_type", "queue_timeout"},
      {"user a number", H, chat(R"("user":5)"), "invalid_type", "user"},
      // messages
      {"missing messages", H, R"({"model":"m"})", "missing_required_parameter", "messages"},
      {"messages a string", H, msgs(R"("hi")"), "invalid_type", "messages"},
      {"empty messages", H, msgs("[]"), "invalid_value", "messages"},
      {"message not an object", H, msgs("[5]"), "invalid_type", "messages[0]"},
      {"message without role", H, msgs(R"([{"content":"hi"}])"), "missing_required_parameter", "messages[0].role"},
      {"role not a string", H, msgs(R"([{"role":1,"content":"hi"}])"), "invalid_type", "messages[0].role"},
      {"unknown role", H, msgs(R"([{"role":"user","content":"a"},{"role":"wizard","content":"b"}])"), "invalid_value",
       "messages[1].role"},
      {"function role", H, msgs(R"([{"role":"function","content":"42"}])"), "invalid_value", "messages[0].role"},
      {"user without content", H, msgs(R"([{"role":"system","content":"a"},{"role":"user"}])"),
       "missing_required_parameter", "messages[1].content"},
      {"user with null content", H, msgs(R"([{"role":"user","content":null}])"), "missing_required_parameter",
       "messages[0].content"},
      {"content a number", H, msgs(R"([{"role":"user","content":5}])"), "invalid_type", "messages[0].content"},
      {"image content part", H,
       msgs(R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}])"),
       "invalid_value", "messages[0].content[1].type"},
      {"content part without type", H, msgs(R"([{"role":"user","content":[{"text":"a"}]}])"),
       "missing_required_parameter", "messages[0].content[0].type"},
      {"content part a string", H, msgs(R"([{"role":"user","content":["hi"]}])"), "invalid_type",
       "messages[0].content[0]"},
      {"content part text a number", H, msgs(R"([{"role":"user","content":[{"type":"text","text":5}]}])"),
       "invalid_type", "messages[0].content[0].text"},
      {"content part without text", H, msgs(R"([{"role":"user","content":[{"type":"text"}]}])"),
       "missing_required_parameter", "messages[0].content[0].text"},
      {"every content empty", H, msgs(R"([{"role":"system","content":""},{"role":"user","content":[]}])"),
       "invalid_value", "messages"},
      {"only an assistant without content", H, msgs(R"([{"role":"assistant"}])"), "invalid_value", "messages"},
  };

  for (const bad_case& c : cases) {
    INFO("case: " << c.name);
    const parse_result r = parse(c.kind, c.body);
    REQUIRE(std::holds_alternative<api_error>(r));
    const api_error& e = std::get<api_error>(r);
    INFO("message: " << e.message);
    CHECK(e.status == 400);
    CHECK(e.type == "invalid_request_error");
    CHECK(e.code == c.code);
    CHECK(e.param == c.param);
    CHECK_FALSE(e.message.empty());
  }
}

TEST_CASE("type errors name the field and the type received", "[openai_api]") {
  const api_error e = parse_err(endpoint::completions, R"({"model":"m","prompt":"x","max_tokens":"10"})");
  CHECK(e.message == "'max_tokens' must be an integer, got string");
  const api_error b = parse_err(endpoint::completions, R"({"model":"m","prompt":"x","temperature":false})");
  CHECK(b.message == "'temperature' must be a number, got boolean");
  const api_error j = parse_err(endpoint::completions, "{nope");
  CHECK(j.message.find("not valid JSON") != std::string::npos);
  const api_error o = parse_err(endpoint::completions, "[]");
  CHECK(o.message.find("JSON object") != std::string::npos);
}

TEST_CASE("limits from the router flags are enforced", "[openai_api]") {
  api_limits limits;
  limits.max_n = 2;
  limits.max_tokens_cap = 100;
  limits.max_prompt_bytes = 8;
  limits.max_messages = 2;
  limits.max_stop = 1;
  limits.max_top_logprobs = 3;

  auto code_param = [&](endpoint kind, const std::string& body) {
    const api_error e = parse_err(kind, body, limits);
    CHECK(e.status == 400);
    return e.code + " " + e.param;
  };
  const auto C = endpoint::completions;
  const auto H = endpoint::chat_completions;
  CHECK(code_param(C, R"({"model":"m","prompt":"x","n":3})") == "invalid_value n");
  CHECK(code_param(C, R"({"model":"m","prompt":"x","max_tokens":101})") == "invalid_value max_tokens");
  CHECK(code_param(C, R"({"model":"m","prompt":"123456789"})") == "invalid_value prompt");
  CHECK(code_param(C, R"({"model":"m","prompt":["123456789"]})") == "invalid_value prompt");
  CHECK(code_param(C, R"({"model":"m","prompt":[1,2,3]})") == "invalid_value prompt");  // 12 bytes of ids
  CHECK(code_param(C, R"({"model":"m","prompt":"x","stop":["a","b"]})") == "invalid_value stop");
  CHECK(code_param(C, R"({"model":"m","prompt":"x","logprobs":4})") == "invalid_value logprobs");
  CHECK(code_param(H, R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},
    {"role":"user","content":"c"}]})") == "invalid_value messages");
  CHECK(code_param(H, R"({"model":"m","messages":[{"role":"user","content":"12345"},
    {"role":"user","content":"6789"}]})") == "invalid_value messages");
  CHECK(code_param(H, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,
    "top_logprobs":4})") == "invalid_value top_logprobs");

  // Exactly at each limit is fine.
  const generation_request ok =
      parse_ok(C, R"({"model":"m","prompt":"12345678","n":2,"max_tokens":100,"stop":"a","logprobs":3})", limits);
  CHECK(ok.prompt_text == "12345678");
  CHECK(ok.n == 2);
  CHECK(ok.sampling.max_tokens == 100);
  CHECK(ok.sampling.logprobs == 3);
  CHECK(parse_ok(C, R"({"model":"m","prompt":[1,2]})", limits).prompt_tokens.size() == 2);
  CHECK(parse_ok(H, R"({"model":"m","messages":[{"role":"user","content":"1234"},{"role":"user","content":"5678"}]})",
                 limits)
            .messages.size() == 2);
}

TEST_CASE("parsing never throws on hostile bodies", "[openai_api]") {
  const std::string deep_array = std::string(100000, '[') + std::string(100000, ']');
  const std::string deep_prompt = R"({"model":"m","prompt":)" + deep_array + "}";
  const std::string deep_open = std::string(100000, '{');
  std::string all_bytes;
  for (int c = 0; c < 256; ++c) all_bytes += static_cast<char>(c);
  const std::string nul_inside = std::string("{\"model\":\"m\",\0\"prompt\":\"x\"}", 27);

  for (const std::string& body : {deep_array, deep_prompt, deep_open, all_bytes, nul_inside}) {
    for (const endpoint kind : {endpoint::completions, endpoint::chat_completions}) {
      parse_result r = generation_request{};
      REQUIRE_NOTHROW(r = parse(kind, body));
      REQUIRE(std::holds_alternative<api_error>(r));
      CHECK(std::get<api_error>(r).status == 400);
    }
  }
  // The deeply nested prompt is well-formed JSON: a type error, not a parse error.
  CHECK(parse_err(endpoint::completions, deep_prompt).code == "invalid_type");
}

TEST_CASE("bad_request builds a 400 invalid_request_error", "[openai_api]") {
  const api_error e = router::bad_request("n", "'n' is wrong");
  CHECK(e.status == 400);
  CHECK(e.type == "invalid_request_error");
  CHECK(e.code == "invalid_value");
  CHECK(e.param == "n");
  CHECK(e.message == "'n' is wrong");
  CHECK(router::bad_request("", "x", "invalid_json").code == "invalid_json");
}

// ---- Formatting --------------------------------------------------------------------------------

namespace {

router::response_meta meta_for(endpoint kind, bool want_logprobs) {
  router::response_meta m;
  m.id = kind == endpoint::completions ? "cmpl-abc" : "chatcmpl-abc";
  m.model = "smollm2";
  m.created = 1700000000;
  m.kind = kind;
  m.want_logprobs = want_logprobs;
  return m;
}

std::vector<router::token_logprobs> sample_logprobs() {
  router::token_logprobs a;
  a.token = "Hel";
  a.logprob = -0.25f;
  a.top = {{"Hel", -0.25f}, {"He", -1.5f}};
  router::token_logprobs b;
  b.token = "lo";
  b.logprob = -0.5f;
  b.top = {{"lo", -0.5f}, {"p", -2.f}};
  return {a, b};
}

void check_envelope(const json& j, const router::response_meta& m, const char* object) {
  CHECK(j.at("id") == m.id);
  CHECK(j.at("object") == object);
  CHECK(j.at("created") == m.created);
  CHECK(j.at("model") == m.model);
}

void check_usage(const json& u, uint32_t prompt, uint32_t completion, uint32_t cached) {
  CHECK(keys(u) ==
        std::set<std::string>{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"});
  CHECK(u.at("prompt_tokens") == prompt);
  CHECK(u.at("completion_tokens") == completion);
  CHECK(u.at("total_tokens") == prompt + completion);
  CHECK(u.at("prompt_tokens_details") == json{{"cached_tokens", cached}});
}

}  // namespace

TEST_CASE("completions response has the text_completion shape", "[openai_api]") {
  const auto m = meta_for(endpoint::completions, false);
  router::choice_result c0{0, "Hello", sy::finish_reason::stop, {}, "END"};
  router::choice_result c1{1, "Bye", sy::finish_reason::length, {}};
  router::usage_info usage{12, 5, 4};
  const std::string body = router::format_response(m, {c0, c1}, usage);
  CHECK(body.rfind(R"({"id":"cmpl-abc","object":"text_completion",)", 0) == 0);  // OpenAI's key order
  const json j = parsed(body);
  CHECK(keys(j) == std::set<std::string>{"id", "object", "created", "model", "choices", "usage"});
  check_envelope(j, m, "text_completion");
  REQUIRE(j.at("choices").size() == 2);
  const json& ch = j["choices"][1];
  CHECK(keys(ch) == std::set<std::string>{"index", "text", "logprobs", "finish_reason", "stop_reason"});
  CHECK(ch.at("index") == 1);
  CHECK(ch.at("text") == "Bye");
  CHECK(ch.at("logprobs").is_null());
  CHECK(ch.at("finish_reason") == "length");
  CHECK(ch.at("stop_reason").is_null());
  CHECK(j["choices"][0].at("finish_reason") == "stop");
  CHECK(j["choices"][0].at("stop_reason") == "END");
  CHECK(j["choices"][0].at("text") == "Hello");
  check_usage(j.at("usage"), 12, 5, 4);
}

TEST_CASE("completions logprobs have tokens, token_logprobs, top_logprobs and text_offset", "[openai_api]") {
  const auto m = meta_for(endpoint::completions, true);
  router::choice_result c{0, "Hello", sy::finish_reason::stop, sample_logprobs()};
  const json j = parsed(router::format_response(m, {c}, {}));
  const json& lp = j.at("choices").at(0).at("logprobs");
  CHECK(keys(lp) == std::set<std::string>{"tokens", "token_logprobs", "top_logprobs", "text_offset"});
  CHECK(lp.at("tokens") == json::array({"Hel", "lo"}));
  CHECK(lp.at("token_logprobs") == json::array({-0.25, -0.5}));
  CHECK(lp.at("top_logprobs") == json::parse(R"([{"Hel":-0.25,"He":-1.5},{"lo":-0.5,"p":-2.0}])"));
  CHECK(lp.at("text_offset") == json::array({0, 3}));

  // No alternatives requested: one empty object per token.
  router::choice_result bare{0, "Hi", sy::finish_reason::stop, {{"Hi", -0.1f, {}}}};
  const json b = parsed(router::format_response(m, {bare}, {}));
  CHECK(b["choices"][0]["logprobs"]["top_logprobs"] == json::parse("[{}]"));
  // Floats come out in their shortest form, not widened to double noise.
  CHECK(router::format_response(m, {bare}, {}).find("[-0.1]") != std::string::npos);
}

TEST_CASE("chat response has the chat.completion shape with logprobs content", "[openai_api]") {
  const auto m = meta_for(endpoint::chat_completions, true);
  router::choice_result c{0, "Hello", sy::finish_reason::stop, sample_logprobs()};
  const json j = parsed(router::format_response(m, {c}, {3, 2, 0}));
  CHECK(keys(j) == std::set<std::string>{"id", "object", "created", "model", "choices", "usage"});
  check_envelope(j, m, "chat.completion");
  REQUIRE(j.at("choices").size() == 1);
  const json& ch = j["choices"][0];
  CHECK(keys(ch) == std::set<std::string>{"index", "message", "logprobs", "finish_reason", "stop_reason"});
  CHECK(ch.at("index") == 0);
  CHECK(ch.at("message") == json{{"role", "assistant"}, {"content", "Hello"}});
  CHECK(ch.at("finish_reason") == "stop");
  CHECK(ch.at("stop_reason").is_null());  // the end of the turn: no stop string
  const json& lp = ch.at("logprobs");
  CHECK(keys(lp) == std::set<std::string>{"content"});
  REQUIRE(lp.at("content").size() == 2);
  const json& t0 = lp["content"][0];
  CHECK(keys(t0) == std::set<std::string>{"token", "logprob", "bytes", "top_logprobs"});
  CHECK(t0.at("token") == "Hel");
  CHECK(t0.at("logprob") == -0.25);
  CHECK(t0.at("bytes") == json::array({72, 101, 108}));
  REQUIRE(t0.at("top_logprobs").size() == 2);
  CHECK(t0["top_logprobs"][1] == json::parse(R"({"token":"He","logprob":-1.5,"bytes":[72,101]})"));
  check_usage(j.at("usage"), 3, 2, 0);

  const json off = parsed(router::format_response(meta_for(endpoint::chat_completions, false), {c}, {}));
  CHECK(off["choices"][0].at("logprobs").is_null());
}

TEST_CASE("chat chunks carry the role first and content only when non-empty", "[openai_api]") {
  const auto m = meta_for(endpoint::chat_completions, false);
  const json first = parsed(router::format_chunk(m, 0, "", true, sy::finish_reason::none, {}));
  CHECK(keys(first) == std::set<std::string>{"id", "object", "created", "model", "choices"});
  check_envelope(first, m, "chat.completion.chunk");
  REQUIRE(first.at("choices").size() == 1);
  const json& c0 = first["choices"][0];
  CHECK(keys(c0) == std::set<std::string>{"index", "delta", "logprobs", "finish_reason"});
  CHECK(c0.at("delta") == json{{"role", "assistant"}});
  CHECK(c0.at("logprobs").is_null());
  CHECK(c0.at("finish_reason").is_null());

  const json mid = parsed(router::format_chunk(m, 1, "lo", false, sy::finish_reason::none, {}));
  CHECK(mid["choices"][0].at("index") == 1);
  CHECK(mid["choices"][0].at("delta") == json{{"content", "lo"}});

  const json last = parsed(router::format_chunk(m, 0, "", false, sy::finish_reason::length, {}));
  CHECK(last["choices"][0].at("delta") == json::object());
  CHECK(last["choices"][0].at("finish_reason") == "length");
  CHECK(last["choices"][0].at("stop_reason").is_null());  // the last chunk has one, null here

  const auto ml = meta_for(endpoint::chat_completions, true);
  const json with_lp = parsed(router::format_chunk(ml, 0, "Hello", true, sy::finish_reason::stop, sample_logprobs()));
  CHECK(with_lp["choices"][0].at("delta") == json{{"role", "assistant"}, {"content", "Hello"}});
  CHECK(with_lp["choices"][0]["logprobs"]["content"].size() == 2);
  CHECK(with_lp["choices"][0]["logprobs"]["content"][1]["token"] == "lo");
}

TEST_CASE("completions chunks have the text_completion shape", "[openai_api]") {
  const auto m = meta_for(endpoint::completions, true);
  const json j = parsed(router::format_chunk(m, 2, "Hello", true, sy::finish_reason::none, sample_logprobs()));
  CHECK(keys(j) == std::set<std::string>{"id", "object", "created", "model", "choices"});
  check_envelope(j, m, "text_completion");
  REQUIRE(j.at("choices").size() == 1);
  const json& c = j["choices"][0];
  CHECK(keys(c) == std::set<std::string>{"index", "text", "logprobs", "finish_reason"});  // no stop_reason yet
  CHECK(c.at("index") == 2);
  CHECK(c.at("text") == "Hello");
  CHECK(c.at("finish_reason").is_null());
  CHECK(c.at("logprobs").at("tokens") == json::array({"Hel", "lo"}));

  const json end =
      parsed(router::format_chunk(meta_for(endpoint::completions, false), 0, "", false, sy::finish_reason::stop, {}));
  CHECK(end["choices"][0].at("text") == "");
  CHECK(end["choices"][0].at("logprobs").is_null());
  CHECK(end["choices"][0].at("finish_reason") == "stop");
}

TEST_CASE("stop_reason names the stop string that ended a choice, null otherwise", "[openai_api]") {
  for (const endpoint kind : {endpoint::completions, endpoint::chat_completions}) {
    INFO("chat: " << (kind == endpoint::chat_completions));
    const auto m = meta_for(kind, false);
    // Non-streamed: every choice has one.
    router::choice_result by_stop{0, "Par", sy::finish_reason::stop, {}, "\n\nHuman:"};
    router::choice_result by_eos{1, "Paris.", sy::finish_reason::stop, {}, {}};
    router::choice_result by_length{2, "Paris is", sy::finish_reason::length, {}, {}};
    const json j = parsed(router::format_response(m, {by_stop, by_eos, by_length}, {}));
    CHECK(j["choices"][0].at("stop_reason") == "\n\nHuman:");
    CHECK(j["choices"][1].at("stop_reason").is_null());
    CHECK(j["choices"][2].at("stop_reason").is_null());
    // A stop named beside another finish reason is not one (a worker names it only with stop).
    router::choice_result odd{0, "x", sy::finish_reason::length, {}, "END"};
    CHECK(parsed(router::format_response(m, {odd}, {}))["choices"][0].at("stop_reason").is_null());
    // Streamed: the choice's last chunk only, after finish_reason.
    const std::string mid = router::format_chunk(m, 0, "Pa", true, sy::finish_reason::none, {}, nullptr, "END");
    CHECK_FALSE(parsed(mid)["choices"][0].contains("stop_reason"));
    const std::string end = router::format_chunk(m, 0, "r", false, sy::finish_reason::stop, {}, nullptr, "END");
    CHECK(parsed(end)["choices"][0].at("stop_reason") == "END");
    CHECK(end.find(R"("finish_reason":"stop","stop_reason":"END")") != std::string::npos);  // vLLM's order
    CHECK(parsed(router::format_chunk(m, 0, "", false, sy::finish_reason::stop, {}))["choices"][0]
              .at("stop_reason")
              .is_null());
  }
}

TEST_CASE("usage chunk has empty choices and the usage object", "[openai_api]") {
  for (const endpoint kind : {endpoint::completions, endpoint::chat_completions}) {
    const auto m = meta_for(kind, false);
    const json j = parsed(router::format_usage_chunk(m, {7, 9, 3}));
    CHECK(keys(j) == std::set<std::string>{"id", "object", "created", "model", "choices", "usage"});
    check_envelope(j, m, kind == endpoint::completions ? "text_completion" : "chat.completion.chunk");
    CHECK(j.at("choices") == json::array());
    check_usage(j.at("usage"), 7, 9, 3);
  }
}

TEST_CASE("a token text with half a UTF-8 char formats without throwing", "[openai_api]") {
  // "日" is E6 97 A5; the first token holds only E6 97.
  router::token_logprobs half;
  half.token = "\xE6\x97";
  half.logprob = -1.f;
  half.top = {{"\xE6\x97", -1.f}, {"\xE6\x98", -2.f}, {"\xE6", -3.f}};
  for (const endpoint kind : {endpoint::completions, endpoint::chat_completions}) {
    const auto m = meta_for(kind, true);
    std::string body, chunk;
    REQUIRE_NOTHROW(body = router::format_response(m, {{0, "a\xE6\x97", sy::finish_reason::length, {half}}}, {}));
    REQUIRE_NOTHROW(chunk = router::format_chunk(m, 0, "\xE6\x97", true, sy::finish_reason::none, {half}));
    const json j = parsed(body);
    parsed(chunk);
    if (kind == endpoint::completions) {
      CHECK(j["choices"][0]["text"] == "a" + k_replacement);
      const json& lp = j["choices"][0]["logprobs"];
      CHECK(lp["tokens"][0] == k_replacement);
      // Three different broken keys collapse into one valid key: the first (most likely) wins.
      CHECK(lp["top_logprobs"][0] == json{{k_replacement, -1.0}});
    } else {
      CHECK(j["choices"][0]["message"]["content"] == "a" + k_replacement);
      const json& t = j["choices"][0]["logprobs"]["content"][0];
      CHECK(t["bytes"] == json::array({0xE6, 0x97}));  // the raw bytes survive
      CHECK(t["token"] == k_replacement);
      CHECK(t["top_logprobs"][2]["bytes"] == json::array({0xE6}));
    }
  }
  // Every other kind of broken byte, in the id and model too.
  std::string junk;
  for (int c = 0x80; c < 0x100; ++c) junk += static_cast<char>(c);
  auto m = meta_for(endpoint::chat_completions, false);
  m.model = junk;
  junk += "\xED\xA0\x80\xF4\x90\x80\x80\xF0\x9F\x9A";  // a surrogate, > U+10FFFF, a cut 4-byte char
  std::string out;
  REQUIRE_NOTHROW(out = router::format_chunk(m, 0, junk, true, sy::finish_reason::none, {}));
  parsed(out);
  // Token texts and choice texts are repaired the same way.
  m.want_logprobs = true;
  const json j = parsed(router::format_response(m, {{0, junk, sy::finish_reason::stop, {{junk, -1.f, {}}}}}, {}));
  const json& content = j["choices"][0]["message"]["content"];
  CHECK(content == j["choices"][0]["logprobs"]["content"][0]["token"]);
  CHECK(content.get<std::string>().find(k_replacement) != std::string::npos);
}

TEST_CASE("non-finite logprobs are clamped to -9999", "[openai_api]") {
  const auto m = meta_for(endpoint::chat_completions, true);
  router::token_logprobs t;
  t.token = "x";
  t.logprob = -std::numeric_limits<float>::infinity();
  t.top = {{"x", std::numeric_limits<float>::quiet_NaN()}, {"y", -1e30f}};
  const json j = parsed(router::format_response(m, {{0, "x", sy::finish_reason::stop, {t}}}, {}));
  const json& e = j["choices"][0]["logprobs"]["content"][0];
  CHECK(e["logprob"] == -9999.0);
  CHECK(e["top_logprobs"][0]["logprob"] == -9999.0);
  CHECK(e["top_logprobs"][1]["logprob"] == -9999.0);
}

TEST_CASE("format_error writes the OpenAI error body with nulls for empty fields", "[openai_api]") {
  api_error e = router::bad_request("max_tokens", "'max_tokens' must be an integer, got string", "invalid_type");
  const json j = parsed(router::format_error(e));
  CHECK(keys(j) == std::set<std::string>{"error"});
  CHECK(keys(j["error"]) == std::set<std::string>{"message", "type", "param", "code"});
  CHECK(j["error"]["message"] == "'max_tokens' must be an integer, got string");
  CHECK(j["error"]["type"] == "invalid_request_error");
  CHECK(j["error"]["param"] == "max_tokens");
  CHECK(j["error"]["code"] == "invalid_type");

  api_error overloaded;
  overloaded.status = 503;
  overloaded.type = "overloaded_error";
  overloaded.message = "try later \xE6";  // broken UTF-8 must not throw either
  std::string out;
  REQUIRE_NOTHROW(out = router::format_error(overloaded));
  const json o = parsed(out);
  CHECK(o["error"]["param"].is_null());
  CHECK(o["error"]["code"].is_null());
  CHECK(o["error"]["type"] == "overloaded_error");
  CHECK(o["error"]["message"] == "try later " + k_replacement);
}

TEST_CASE("format_error's body is byte for byte what a JSON library writes of it", "[openai_api]") {
  // router/base/api_error.cpp writes it without one (the HTTP server's refusals use it too).
  api_error e = router::make_error(413, "invalid_request_error", "body_too_large", "a \"quoted\"\\ line\n\x01\ttab é");
  const json want = {{"error", {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", e.code}}}};
  nlohmann::ordered_json ordered;
  ordered["error"]["message"] = e.message;
  ordered["error"]["type"] = e.type;
  ordered["error"]["param"] = nullptr;
  ordered["error"]["code"] = e.code;
  CHECK(router::format_error(e) == ordered.dump());
  CHECK(parsed(router::format_error(e)) == want);
  e.param = "max_tokens";
  ordered["error"]["param"] = e.param;
  CHECK(router::format_error(e) == ordered.dump());
}

TEST_CASE("an error from parsing formats into a parseable error body", "[openai_api]") {
  const api_error e = parse_err(endpoint::completions, "{\"model\":\"m\",\"prompt\":\"\xFF\"}");
  const json j = parsed(router::format_error(e));
  CHECK(j["error"]["code"] == "invalid_json");
  CHECK(j["error"]["param"].is_null());
}

TEST_CASE("format_models lists every model card", "[openai_api]") {
  const json j = parsed(router::format_models(
      {{"smollm2", "smollm2", 1700000000, 8192}, {"Qwen/Qwen2-0.5B", "qwen", 1700000001, 32768}}));
  CHECK(keys(j) == std::set<std::string>{"object", "data"});
  CHECK(j["object"] == "list");
  REQUIRE(j["data"].size() == 2);
  const json& d = j["data"][1];
  CHECK(keys(d) == std::set<std::string>{"id", "object", "created", "owned_by", "root", "max_model_len"});
  CHECK(d["id"] == "Qwen/Qwen2-0.5B");  // an alias: its root is the model's id
  CHECK(d["object"] == "model");
  CHECK(d["created"] == 1700000001);
  CHECK(d["owned_by"] == "switchyard");
  CHECK(d["root"] == "qwen");
  CHECK(d["max_model_len"] == 32768);
  CHECK(j["data"][0]["id"] == "smollm2");

  const json empty = parsed(router::format_models({}));
  CHECK(empty["data"] == json::array());
}

TEST_CASE("format_model is one card, as listed", "[openai_api]") {
  const router::model_card c{"HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1", 1700000000, 2048};
  CHECK(parsed(router::format_model(c)) == parsed(router::format_models({c}))["data"][0]);
}

TEST_CASE("stream_options.continuous_usage_stats is read, with or without include_usage", "[openai_api]") {
  const char* base = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":)";
  auto with = [&](const char* options) {
    return parse_ok(endpoint::chat_completions, std::string(base) + options + "}");
  };
  CHECK_FALSE(with(R"({"include_usage":true})").continuous_usage);
  const generation_request both = with(R"({"include_usage":true,"continuous_usage_stats":true})");
  CHECK((both.include_usage && both.continuous_usage));
  const generation_request alone = with(R"({"continuous_usage_stats":true})");
  CHECK((!alone.include_usage && alone.continuous_usage));
  const api_error e = parse_err(endpoint::chat_completions, std::string(base) + R"({"continuous_usage_stats":"yes"}})");
  CHECK(e.code == "invalid_type");
  CHECK(e.param == "stream_options.continuous_usage_stats");
}

TEST_CASE("a chunk carries the usage so far only when asked", "[openai_api]") {
  const auto m = meta_for(endpoint::chat_completions, false);
  const router::usage_info u{40, 3, 0};
  const json j = parsed(router::format_chunk(m, 0, "lo", false, sy::finish_reason::none, {}, &u));
  CHECK(keys(j) == std::set<std::string>{"id", "object", "created", "model", "choices", "usage"});
  check_usage(j.at("usage"), 40, 3, 0);
  CHECK(j["choices"][0].at("delta") == json{{"content", "lo"}});
  CHECK_FALSE(parsed(router::format_chunk(m, 0, "lo", false, sy::finish_reason::none, {})).contains("usage"));
}

namespace {

router::tokenize_request tokenize_ok(std::string_view body) {
  auto r = router::parse_tokenize_request(body, {});
  if (const auto* e = std::get_if<api_error>(&r)) FAIL("rejected: " << e->param << ": " << e->message);
  return std::get<router::tokenize_request>(r);
}

api_error tokenize_err(std::string_view body) {
  auto r = router::parse_tokenize_request(body, {});
  REQUIRE(std::holds_alternative<api_error>(r));
  return std::get<api_error>(r);
}

}  // namespace

TEST_CASE("tokenize requests in vLLM's and llama-server's shapes", "[openai_api]") {
  const auto p = tokenize_ok(R"({"model":"m","prompt":"Hello","add_special_tokens":false,"return_token_strs":true})");
  CHECK((p.model == "m" && !p.is_chat && p.prompt == "Hello"));
  CHECK((!p.add_special_tokens && p.return_token_strs));
  const auto defaults = tokenize_ok(R"({"prompt":""})");  // an empty text has zero tokens, not an error
  CHECK((defaults.model.empty() && defaults.add_special_tokens && defaults.add_generation_prompt));
  const auto llama = tokenize_ok(R"({"content":"Hi there","add_special":false})");
  CHECK((llama.prompt == "Hi there" && !llama.add_special_tokens));
  const auto chat = tokenize_ok(R"({"messages":[{"role":"developer","content":[{"type":"text","text":"be brief"}]},)"
                                R"({"role":"user","content":"hi"}],"add_generation_prompt":false})");
  REQUIRE(chat.is_chat);
  REQUIRE(chat.messages.size() == 2);
  CHECK((chat.messages[0].role == "system" && chat.messages[0].content == "be brief"));
  CHECK_FALSE(chat.add_generation_prompt);
}

TEST_CASE("bad tokenize and detokenize bodies name the field", "[openai_api]") {
  struct row {
    const char* body;
    const char* code;
    const char* param;
  };
  const row rows[] = {
      {R"({"model":"m"})", "missing_required_parameter", "prompt"},
      {R"({"prompt":7})", "invalid_type", "prompt"},
      {R"({"content":["x"]})", "invalid_type", "content"},
      {R"({"prompt":"x","messages":[{"role":"user","content":"x"}]})", "invalid_value", "messages"},
      {R"({"messages":[]})", "invalid_value", "messages"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "invalid_value", "messages[0].role"},
      {R"({"model":5,"prompt":"x"})", "invalid_type", "model"},
      {R"({"prompt":"x","add_special_tokens":1})", "invalid_type", "add_special_tokens"},
      {R"([1,2])", "invalid_json", ""},
  };
  for (const row& r : rows) {
    INFO(r.body);
    const api_error e = tokenize_err(r.body);
    CHECK(e.status == 400);
    CHECK(e.code == r.code);
    CHECK(e.param == r.param);
  }
  api_limits small;
  small.max_prompt_bytes = 8;
  auto big = router::parse_tokenize_request(R"({"prompt":"123456789"})", small);
  REQUIRE(std::holds_alternative<api_error>(big));
  CHECK(std::get<api_error>(big).param == "prompt");
  auto many = router::parse_detokenize_request(R"({"tokens":[1,2,3]})", small);  // 8 bytes: 2 ids
  REQUIRE(std::holds_alternative<api_error>(many));
  CHECK(std::get<api_error>(many).param == "tokens");
}

TEST_CASE("detokenize requests take token ids and format back as prompt and content", "[openai_api]") {
  auto ok = router::parse_detokenize_request(R"({"model":"m","tokens":[0,5,49151]})", {});
  REQUIRE(std::holds_alternative<router::detokenize_request>(ok));
  CHECK(std::get<router::detokenize_request>(ok).tokens == std::vector<int32_t>{0, 5, 49151});
  for (const char* bad : {R"({"tokens":[-1]})", R"({"tokens":[1.5]})", R"({"tokens":"1"})", R"({})"}) {
    INFO(bad);
    auto r = router::parse_detokenize_request(bad, {});
    REQUIRE(std::holds_alternative<api_error>(r));
    CHECK(std::get<api_error>(r).param == "tokens");
  }
  const json d = parsed(router::format_detokenize("caf\xC3"));  // half a character: replaced
  CHECK(keys(d) == std::set<std::string>{"prompt", "content"});
  CHECK(d["prompt"] == "caf\xEF\xBF\xBD");
  CHECK(d["content"] == d["prompt"]);
}

TEST_CASE("tokenize responses have vLLM's keys", "[openai_api]") {
  const json j = parsed(router::format_tokenize({1, 2, 3}, 2048, {}));
  CHECK(keys(j) == std::set<std::string>{"count", "max_model_len", "tokens"});
  CHECK((j["count"] == 3 && j["max_model_len"] == 2048 && j["tokens"] == json::array({1, 2, 3})));
  const json s = parsed(router::format_tokenize({1, 2}, 2048, {"\xC4\xA0Hello", "a"}));
  CHECK(s["token_strs"] == json::array({"\xC4\xA0Hello", "a"}));
  CHECK(parsed(router::format_version()).at("version").is_string());
}

TEST_CASE("chat_template_kwargs: enable_thinking and thinking are read, other keys are accepted", "[openai_api]") {
  const std::string msgs = R"("model":"m","messages":[{"role":"user","content":"hi"}])";
  CHECK_FALSE(parse_ok(endpoint::chat_completions, "{" + msgs + "}").thinking.has_value());  // the template's default
  CHECK(parse_ok(endpoint::chat_completions,
                 "{" + msgs + R"(,"chat_template_kwargs":{"enable_thinking":false,"custom":1}})")
            .thinking == false);
  CHECK_FALSE(parse_ok(endpoint::chat_completions, "{" + msgs + R"(,"chat_template_kwargs":{}})").thinking.has_value());
  // DeepSeek-V3.1's name for the same switch; both given, they must agree.
  CHECK(parse_ok(endpoint::chat_completions, "{" + msgs + R"(,"chat_template_kwargs":{"thinking":true}})").thinking ==
        true);
  CHECK(parse_ok(endpoint::chat_completions,
                 "{" + msgs + R"(,"chat_template_kwargs":{"thinking":false,"enable_thinking":false}})")
            .thinking == false);
  const api_error d = parse_err(endpoint::chat_completions,
                                "{" + msgs + R"(,"chat_template_kwargs":{"thinking":true,"enable_thinking":false}})");
  CHECK((d.code == "invalid_value" && d.param == "chat_template_kwargs.thinking"));
  CHECK_THAT(d.message, Catch::Contains("disagree"));
  const api_error n = parse_err(endpoint::chat_completions, "{" + msgs + R"(,"chat_template_kwargs":{"thinking":1}})");
  CHECK(n.param == "chat_template_kwargs.thinking");
  const api_error e = parse_err(endpoint::chat_completions, "{" + msgs + R"(,"chat_template_kwargs":[1]})");
  CHECK((e.code == "invalid_type" && e.param == "chat_template_kwargs"));
  const api_error b =
      parse_err(endpoint::chat_completions, "{" + msgs + R"(,"chat_template_kwargs":{"enable_thinking":"no"}})");
  CHECK(b.param == "chat_template_kwargs.enable_thinking");
  const auto t =
      router::parse_tokenize_request("{" + msgs + R"(,"chat_template_kwargs":{"enable_thinking":false}})", {});
  REQUIRE(std::holds_alternative<router::tokenize_request>(t));
  CHECK(std::get<router::tokenize_request>(t).thinking == false);
}

TEST_CASE("thinking_token_budget (vLLM's) is the sampling's thinking budget", "[openai_api]") {
  const std::string msgs = R"("model":"m","messages":[{"role":"user","content":"hi"}])";
  CHECK(parse_ok(endpoint::chat_completions, "{" + msgs + "}").sampling.thinking_budget == 0);
  CHECK(parse_ok(endpoint::chat_completions, "{" + msgs + R"(,"thinking_token_budget":64})").sampling.thinking_budget ==
        64);
  for (const char* bad : {R"(,"thinking_token_budget":0})", R"(,"thinking_token_budget":-1})"}) {
    const api_error e = parse_err(endpoint::chat_completions, "{" + msgs + bad);
    CHECK((e.code == "invalid_value" && e.param == "thinking_token_budget"));
  }
  CHECK(parse_err(endpoint::chat_completions, "{" + msgs + R"(,"thinking_token_budget":"8"})").code == "invalid_type");
}
