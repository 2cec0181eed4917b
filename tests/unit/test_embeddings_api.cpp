// POST /v1/embeddings at the edge (router/openai/embeddings_api.hpp): every shape of `input`, the options,
// the 400s in OpenAI's error shape, the response body (float and base64), and the embed /
// embeddings wire messages (common/wire/protocol.hpp) with their checks.
#include <catch2/catch.hpp>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "common/wire/protocol.hpp"
#include "router/openai/embeddings_api.hpp"

using nlohmann::json;
using sy::router::api_error;
using sy::router::api_limits;
using sy::router::embedding_request;

namespace {

embedding_request ok(const std::string& body) {
  auto r = sy::router::parse_embedding_request(body, api_limits{});
  if (auto* e = std::get_if<api_error>(&r)) FAIL("refused: " << e->message);
  return std::get<embedding_request>(r);
}

api_error refused(const std::string& body) {
  auto r = sy::router::parse_embedding_request(body, api_limits{});
  REQUIRE(std::holds_alternative<api_error>(r));
  return std::get<api_error>(r);
}

}  // namespace

TEST_CASE("embeddings input: a string, strings, token ids, arrays of token ids", "[embeddings]") {
  auto one = ok(R"({"model":"m","input":"hello"})");
  CHECK(one.model == "m");
  CHECK(one.texts == std::vector<std::string>{"hello"});
  CHECK(one.token_inputs.empty());
  CHECK_FALSE(one.base64);
  CHECK(one.dimensions == 0);
  CHECK(one.n_inputs() == 1);

  auto many = ok(R"({"model":"m","input":["a","b","c"],"user":"u-1"})");
  CHECK(many.texts == std::vector<std::string>{"a", "b", "c"});
  CHECK(many.user == "u-1");

  auto ids = ok(R"({"model":"m","input":[1,2,3]})");
  REQUIRE(ids.token_inputs.size() == 1);
  CHECK(ids.token_inputs[0] == std::vector<int32_t>{1, 2, 3});
  CHECK(ids.texts.empty());

  auto nested = ok(R"({"model":"m","input":[[1,2],[3]],"encoding_format":"base64","dimensions":576})");
  CHECK(nested.token_inputs == std::vector<std::vector<int32_t>>{{1, 2}, {3}});
  CHECK(nested.base64);
  CHECK(nested.dimensions == 576);

  auto fmt = ok(R"({"model":"m","input":"x","encoding_format":"float","priority":-3,"timeout":2.5,"queue_timeout":1})");
  CHECK_FALSE(fmt.base64);
  CHECK(fmt.priority == -3);
  CHECK(fmt.timeout_s == 2.5);
  CHECK(fmt.queue_timeout_s == 1);
  CHECK(ok(R"({"model":"m","input":"x","encoding_format":null,"dimensions":null})").dimensions == 0);
}

TEST_CASE("bad embeddings requests are 400s naming the field", "[embeddings]") {
  struct bad {
    const char* body;
    const char* param;
    const char* code;
  };
  const bad cases[] = {
      {R"({"model":"m","input":""})", "input", "invalid_value"},
      {R"({"model":"m","input":[]})", "input", "invalid_value"},
      {R"({"model":"m","input":["a",""]})", "input[1]", "invalid_value"},
      {R"({"model":"m","input":[[1],[]]})", "input[1]", "invalid_value"},
      {R"({"model":"m","input":["a",1]})", "input[1]", "invalid_type"},
      {R"({"model":"m","input":[[1],"a"]})", "input[1]", "invalid_type"},
      {R"({"model":"m","input":[1,"a"]})", "input", "invalid_type"},
      {R"({"model":"m","input":[1.5]})", "input", "invalid_type"},
      {R"({"model":"m","input":[-1]})", "input", "invalid_value"},
      {R"({"model":"m","input":[true]})", "input[0]", "invalid_type"},
      {R"({"model":"m","input":7})", "input", "invalid_type"},
      {R"({"model":"m","input":{"a":1}})", "input", "invalid_type"},
      {R"({"model":"m"})", "input", "missing_required_parameter"},
      {R"({"input":"x"})", "model", "missing_required_parameter"},
      {R"({"model":"","input":"x"})", "model", "invalid_value"},
      {R"({"model":3,"input":"x"})", "model", "invalid_type"},
      {R"({"model":"m","input":"x","encoding_format":"int8"})", "encoding_format", "invalid_value"},
      {R"({"model":"m","input":"x","encoding_format":1})", "encoding_format", "invalid_type"},
      {R"({"model":"m","input":"x","dimensions":0})", "dimensions", "invalid_value"},
      {R"({"model":"m","input":"x","dimensions":"8"})", "dimensions", "invalid_type"},
      {R"({"model":"m","input":"x","user":5})", "user", "invalid_type"},
      {R"({"model":"m","input":"x","timeout":0})", "timeout", "invalid_value"},
      {R"({"model":"m","input":"x","queue_timeout":-1})", "queue_timeout", "invalid_value"},
      {R"({"model":"m","input":"x")", "", "invalid_json"},
      {R"(["model"])", "", "invalid_json"},
  };
  for (const bad& b : cases) {
    INFO(b.body);
    const api_error e = refused(b.body);
    CHECK(e.status == 400);
    CHECK(e.type == "invalid_request_error");
    CHECK(e.param == b.param);
    CHECK(e.code == b.code);
    CHECK_FALSE(e.message.empty());
  }
  std::string over = R"({"model":"m","input":[)";
  for (size_t i = 0; i <= sy::router::k_max_embedding_inputs; ++i) over += i ? ",\"a\"" : "\"a\"";
  over += "]}";
  CHECK(refused(over).message.find("2048") != std::string::npos);
  api_limits small;
  small.max_prompt_bytes = 8;
  auto r = sy::router::parse_embedding_request(R"({"model":"m","input":["12345","67890"]})", small);
  REQUIRE(std::holds_alternative<api_error>(r));
  CHECK(std::get<api_error>(r).param == "input");
}

TEST_CASE("the embeddings response in OpenAI's shape, as floats or base64", "[embeddings]") {
  const std::vector<std::vector<float>> data = {{0.6f, -0.8f, 0.f}, {1.f, 0.f, 1e-7f}};
  const json f = json::parse(sy::router::format_embeddings("my-model", data, false, 7));
  CHECK(f["object"] == "list");
  CHECK(f["model"] == "my-model");
  CHECK(f["usage"] == json({{"prompt_tokens", 7}, {"total_tokens", 7}}));
  REQUIRE(f["data"].size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(f["data"][i]["object"] == "embedding");
    CHECK(f["data"][i]["index"] == i);
    REQUIRE(f["data"][i]["embedding"].size() == 3);
    for (size_t k = 0; k < 3; ++k)  // the shortest text that reads back as the same float
      CHECK(static_cast<float>(f["data"][i]["embedding"][k].get<double>()) == data[i][k]);
  }
  const json b = json::parse(sy::router::format_embeddings("m\"q", data, true, 7));
  CHECK(b["model"] == "m\"q");
  CHECK(b["data"][0]["embedding"] == sy::router::base64_floats(data[0]));
  // Little-endian float32: 1.0f is 00 00 80 3f, "AACAPw==".
  const float one[] = {1.f};
  CHECK(sy::router::base64_floats(one) == "AACAPw==");
  const float two[] = {1.f, 2.f};  // 00 00 80 3f 00 00 00 40
  CHECK(sy::router::base64_floats(two) == "AACAPwAAAEA=");
  const float three[] = {1.f, 2.f, -2.f};  // ... 00 00 00 c0
  CHECK(sy::router::base64_floats(three) == "AACAPwAAAEAAAADA");
  CHECK(sy::router::base64_floats({}) == "");
}

TEST_CASE("embed and embeddings messages round-trip and are checked", "[embeddings]") {
  namespace proto = sy::proto;
  proto::embed e;
  e.request_id = "7-1.0";
  e.inputs = {{1, 2, 3}, {4}};
  e.dimensions = 576;
  e.priority = -2;
  e.budget_ms = 1500;
  auto d = proto::decode(proto::name(proto::msg_type::embed), proto::encode(e));
  REQUIRE(d.ok());
  REQUIRE(d.get_if<proto::embed>());
  CHECK(*d.get_if<proto::embed>() == e);

  proto::embeddings m;
  m.request_id = "7-1.0";
  m.data = {{0.5f, -0.25f}, {1.f, 0.f}};
  m.prompt_tokens = 4;
  auto back = proto::decode("embeddings", proto::encode(m));
  REQUIRE(back.ok());
  CHECK(*back.get_if<proto::embeddings>() == m);

  auto refuse = [](const std::string& type, const std::string& body, const char* field) {
    auto r = proto::decode(type, body);
    REQUIRE_FALSE(r.ok());
    CHECK(r.failure().code == proto::decode_errc::invalid_field);
    CHECK(r.failure().message.find(field) != std::string::npos);
    CHECK(r.failure().request_id == "7-1.0");  // the reply can end the request
  };
  proto::embed empty = e;
  empty.inputs = {};
  refuse("embed", proto::encode(empty), "inputs");
  proto::embed hole = e;
  hole.inputs = {{1}, {}};
  refuse("embed", proto::encode(hole), "inputs[1]");
  proto::embed negative = e;
  negative.inputs = {{1, -5}};
  refuse("embed", proto::encode(negative), "inputs[0]");
  proto::embeddings ragged = m;
  ragged.data = {{1.f, 0.f}, {1.f}};
  refuse("embeddings", proto::encode(ragged), "data[1]");
  proto::embeddings nan = m;
  nan.data = {{std::nanf("")}};
  refuse("embeddings", proto::encode(nan), "data[0]");
  CHECK(std::string(sy::name(sy::error_code::embeddings_not_supported)) == "embeddings_not_supported");
  CHECK(sy::parse_error_code("embeddings_not_supported") == sy::error_code::embeddings_not_supported);
}
