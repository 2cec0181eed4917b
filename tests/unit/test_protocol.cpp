// Wire protocol tests: every message round-trips with every field set; decoding untrusted bytes
// (garbage, truncation, wrong types, over-size bodies, deep nesting, lying length headers,
// random mutations) only ever yields a message or an error — never a throw or a crash.
// Bodies that the encoder cannot produce are crafted with msgpack's packer directly.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <msgpack.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/wire/protocol.hpp"

namespace proto = sy::proto;
using proto::decode;
using proto::decode_errc;
using proto::msg_type;

namespace {

// Every byte value, including NUL and invalid UTF-8, plus some multi-byte UTF-8.
std::string all_bytes() {
  std::string s;
  for (int c = 0; c < 256; ++c) s += static_cast<char>(c);
  return s + "héllo wörld ✓ 日本語 🚀";
}

template <class T>
T round_trip(const T& m) {
  const std::string body = proto::encode(m);
  const proto::decode_result r = decode(proto::name(proto::type_of<T>), body);
  INFO((r.ok() ? std::string("ok") : r.failure().message));
  REQUIRE(r.ok());
  REQUIRE(r.value().index() == static_cast<size_t>(proto::type_of<T>));
  const T* out = r.get_if<T>();
  REQUIRE(out != nullptr);
  // The message-variant overload encodes the same bytes.
  CHECK(proto::encode(proto::message(m)) == body);
  return *out;
}

proto::tokenizer_spec make_tokenizer(size_t n_vocab) {
  proto::tokenizer_spec t;
  t.model = "gpt2";
  t.pre = "smollm";
  t.tokens.reserve(n_vocab);
  t.token_types.reserve(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) {
    std::string tok = "tok" + std::to_string(i);
    tok += static_cast<char>(i & 0xff);  // binary bytes too
    t.tokens.push_back(std::move(tok));
    t.token_types.push_back(i < 17 ? 3 : 1);
  }
  t.merges.reserve(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) t.merges.push_back("Ġ" + std::to_string(i) + " x");
  t.scores.reserve(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) t.scores.push_back(i == 3 ? -1e9f : -0.25f * static_cast<float>(i));
  t.bos_id = 1;
  t.eos_id = 2;
  t.unk_id = 0;
  t.pad_id = 2;
  t.eot_id = 3;
  t.eom_id = 4;
  t.fim_pre_id = 5;
  t.fim_suf_id = 6;
  t.fim_mid_id = 7;
  t.fim_pad_id = 8;
  t.fim_rep_id = 9;
  t.fim_sep_id = 10;
  t.add_bos = true;
  t.add_eos = true;
  t.add_space_prefix = true;
  t.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
  return t;
}

proto::submit make_submit() {
  proto::submit s;
  s.request_id = "req-\xe2\x9c\x93-\x01\x02";
  s.prompt = {1, 2, 127, 128, 255, 256, 65535, 65536, 49151, 2147483647, 0};
  s.sampling.temperature = 0.7f;
  s.sampling.top_k = 40;
  s.sampling.top_p = 0.95f;
  s.sampling.min_p = 0.05f;
  s.sampling.repetition_penalty = 1.1f;
  s.sampling.repeat_last_n = 128;
  s.sampling.seed = 0xfedcba9876543210ull;
  s.sampling.has_seed = true;
  s.sampling.max_tokens = 512;
  s.sampling.stop = {"\n\n", "</s>", "stöp ✓", std::string("\x00\xff", 2)};
  s.sampling.ignore_eos = true;
  s.sampling.logprobs = 5;
  s.priority = -3;
  s.budget_ms = 123'456;
  s.stream = false;
  return s;
}

proto::tokens make_tokens() {
  proto::tokens t;
  t.request_id = "r1";
  t.token_ids = {5, 6, 7};
  t.text = "abc ✓";
  t.finish_reason = sy::finish_reason::length;
  t.usage = {.prompt_tokens = 100, .cached_prompt_tokens = 64, .completion_tokens = 3};
  t.seq = 0xfffffffeu;
  for (int32_t id : t.token_ids) {
    proto::token_logprob e{.token = id, .logprob = -0.25f * float(id), .top = {}};
    for (int j = 0; j < 3; ++j) e.top.push_back({.token = id + j, .logprob = -1.5f * float(j)});
    t.logprobs.push_back(e);
  }
  return t;
}

// One valid body of each type, for the corruption tests.
std::vector<std::pair<msg_type, std::string>> valid_bodies() {
  proto::welcome w;
  w.worker_id = "w0";
  w.model_id = "smollm2-135m";
  w.context_length = 8192;
  w.kv_capacity_tokens = 65536;
  w.kv_block_size = 16;
  w.max_running = 64;
  w.tokenizer = make_tokenizer(40);
  proto::heartbeat hb{.running = 3,
                      .waiting = 4,
                      .free_kv_blocks = 10,
                      .total_kv_blocks = 20,
                      .step_time_ms = 12.5,
                      .steps = 99,
                      .draining = true,
                      .unix_ms = 1234};
  return {
      {msg_type::hello, proto::encode(proto::hello{.router_id = "router-a"})},
      {msg_type::welcome, proto::encode(w)},
      {msg_type::heartbeat, proto::encode(hb)},
      {msg_type::submit, proto::encode(make_submit())},
      {msg_type::cancel, proto::encode(proto::cancel{.request_id = "r1"})},
      {msg_type::tokens, proto::encode(make_tokens())},
      {msg_type::error,
       proto::encode(proto::error{.request_id = "r1", .code = proto::error_code::overloaded, .message = "busy"})},
      {msg_type::drain, proto::encode(proto::drain{.reason = "deploy"})},
      {msg_type::kv_events,
       proto::encode(proto::kv_events{
           .seq = 7, .reset = false, .model_id = "m", .stored = {1, 0xffffffffffffffffull, 300}, .evicted = {42}})},
      {msg_type::kv_resync, proto::encode(proto::kv_resync{.reason = "gap"})},
  };
}

// A msgpack map body built key by key.
class map_body {
 public:
  template <class T>
  map_body& add(const std::string& key, const T& value) {
    msgpack::pack(items_, key);
    msgpack::pack(items_, value);
    ++n_;
    return *this;
  }
  // Raw msgpack bytes as the value.
  map_body& add_raw(const std::string& key, const std::string& raw) {
    msgpack::pack(items_, key);
    items_.write(raw.data(), raw.size());
    ++n_;
    return *this;
  }
  std::string str() const {
    msgpack::sbuffer out;
    msgpack::packer<msgpack::sbuffer> pk(out);
    pk.pack_map(n_);
    out.write(items_.data(), items_.size());
    return std::string(out.data(), out.size());
  }

 private:
  msgpack::sbuffer items_;
  uint32_t n_ = 0;
};

// Decodes, and requires an error of `code` whose message contains `needle`.
proto::decode_error expect_error(msg_type t, const std::string& body, decode_errc code,
                                 const std::string& needle = "") {
  const proto::decode_result r = decode(proto::name(t), body);
  REQUIRE_FALSE(r.ok());
  INFO(r.failure().message);
  CHECK(r.failure().code == code);
  if (!needle.empty()) CHECK_THAT(r.failure().message, Catch::Contains(needle));
  return r.failure();
}

}  // namespace

TEST_CASE("protocol: type frames are the message names", "[protocol]") {
  const char* names[] = {"hello", "welcome", "heartbeat", "submit",    "cancel", "tokens",
                         "error", "drain",   "kv_events", "kv_resync", "embed",  "embeddings"};
  static_assert(std::size(names) == proto::k_n_msg_types);
  for (size_t i = 0; i < proto::k_n_msg_types; ++i) {
    const auto t = static_cast<msg_type>(i);
    CHECK(proto::name(t) == names[i]);
    REQUIRE(proto::parse_msg_type(names[i]).has_value());
    CHECK(*proto::parse_msg_type(names[i]) == t);
  }
  CHECK_FALSE(proto::parse_msg_type("Submit").has_value());
  CHECK_FALSE(proto::parse_msg_type("").has_value());
  CHECK(proto::type_of<proto::submit> == msg_type::submit);
  CHECK(proto::type_of<proto::drain> == msg_type::drain);
  CHECK(proto::type_of_message(proto::message(proto::tokens{})) == msg_type::tokens);
  CHECK(proto::max_body_bytes(msg_type::welcome) == 16u << 20);
  CHECK(proto::max_body_bytes(msg_type::submit) == 4u << 20);
  CHECK(proto::max_body_bytes(msg_type::heartbeat) == 256u << 10);
  CHECK(proto::max_body_bytes(msg_type::embed) == 4u << 20);
  CHECK(proto::max_body_bytes(msg_type::embeddings) == 16u << 20);
}

TEST_CASE("protocol: every message round-trips with every field set", "[protocol]") {
  SECTION("hello") {
    const proto::hello m{.version = 7, .router_id = all_bytes().substr(0, 128)};
    CHECK(round_trip(m) == m);
  }
  SECTION("welcome") {
    proto::welcome m;
    m.version = 3;
    m.worker_id = "worker-✓";
    m.model_id = "HuggingFaceTB/SmolLM2-135M-Instruct";
    m.context_length = 8192;
    m.kv_capacity_tokens = 1u << 20;
    m.kv_block_size = 16;
    m.max_running = 256;
    m.tokenizer = make_tokenizer(300);
    m.tokenizer.tokens[5] = all_bytes();
    m.tokenizer.tokens[6] = "";
    m.served_model_names = {"smollm2", std::string(proto::k_max_model_id_bytes, 'n')};
    CHECK(round_trip(m) == m);
  }
  SECTION("heartbeat") {
    const proto::heartbeat m{.running = 5,
                             .waiting = 70000,
                             .free_kv_blocks = 4000000000u,
                             .total_kv_blocks = 4294967295u,
                             .step_time_ms = 23.456789,
                             .steps = 0xffffffffffffffffull,
                             .draining = true,
                             .unix_ms = 1'700'000'000'000ull,
                             .kv_seq = 0xfffffffffffffffeull,
                             .free_window_kv_blocks = 4000000001u,
                             .total_window_kv_blocks = 4294967295u};
    CHECK(round_trip(m) == m);
    // Integral and huge floating values stay floats on the wire (msgpack-c's own pack_double
    // would turn 2^64 into an integer, with undefined behaviour).
    for (double v : {0.0, 2.0, 18446744073709551616.0, 1e300}) {
      proto::heartbeat h = m;
      h.step_time_ms = v;
      CHECK(round_trip(h) == h);
      CHECK(proto::encode(h).find("step_time_ms\xcb") != std::string::npos);
    }
  }
  SECTION("submit") {
    const proto::submit m = make_submit();
    CHECK(round_trip(m) == m);
  }
  SECTION("submit with a trace context") {
    proto::submit m = make_submit();
    m.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    CHECK(round_trip(m) == m);
    m.traceparent = std::string(65, 'x');  // bounded: 64 bytes
    CHECK_FALSE(proto::decode("submit", proto::encode(m)).ok());
  }
  SECTION("submit with empty vectors and extreme numbers") {
    proto::submit m;
    m.request_id = std::string(proto::k_max_id_bytes, 'x');
    m.priority = INT32_MIN;
    m.budget_ms = UINT32_MAX;
    m.sampling.top_k = INT32_MAX;
    m.sampling.max_tokens = 1;
    m.sampling.logprobs = proto::k_max_top_logprobs;
    m.sampling.top_p = std::numeric_limits<float>::denorm_min();  // top_p > 0
    m.sampling.temperature = 2.f;
    CHECK(round_trip(m) == m);
    CHECK(proto::encode(m).find("temperature\xca\x40\x00\x00\x00") != std::string::npos);
  }
  SECTION("cancel") {
    const proto::cancel m{.request_id = "\x7f\x80\xfe"};
    CHECK(round_trip(m) == m);
  }
  SECTION("tokens") {
    const proto::tokens m = make_tokens();
    CHECK(round_trip(m) == m);
    proto::tokens running{.request_id = "r2",
                          .token_ids = {},
                          .text = "",
                          .finish_reason = sy::finish_reason::none,
                          .usage = {},
                          .logprobs = {},
                          .seq = 0,
                          .stop = {}};
    CHECK(round_trip(running) == running);
    proto::tokens on_stop = make_tokens();
    on_stop.finish_reason = sy::finish_reason::stop;
    on_stop.stop = "\n\nHuman:";
    CHECK(round_trip(on_stop) == on_stop);
    for (size_t i = 0; i < sy::k_n_finish_reasons; ++i) {
      proto::tokens t = make_tokens();
      t.finish_reason = static_cast<sy::finish_reason>(i);
      CHECK(round_trip(t) == t);
      // On the wire as its name, a msgpack fixstr ("" while running), as peers of every version read it.
      const std::string wire_name(sy::name(t.finish_reason));
      CHECK(proto::encode(t).find("finish_reason" + std::string(1, char(0xa0 + wire_name.size())) + wire_name) !=
            std::string::npos);
    }
  }
  SECTION("error") {
    const proto::error m{.request_id = "", .code = proto::error_code::unknown_version, .message = all_bytes()};
    CHECK(round_trip(m) == m);
  }
  SECTION("hello and welcome with the kv_events opt-in") {
    const proto::hello h{.version = 1, .router_id = "r", .kv_events = true};
    CHECK(round_trip(h) == h);
    proto::welcome w;
    w.worker_id = "w";
    w.kv_events = true;
    w.kv_hash_salt = 0xfedcba9876543211ull;
    CHECK(round_trip(w) == w);
  }
  SECTION("kv_events") {
    proto::kv_events m{.seq = 0xffffffffffffffffull, .reset = true, .model_id = "m", .stored = {}, .evicted = {}};
    CHECK(round_trip(m) == m);
    for (uint64_t i = 1; i <= proto::k_max_kv_hashes; ++i) {
      m.stored.push_back(i * 0x9e3779b97f4a7c15ull | 1);
      m.evicted.push_back(i);
    }
    CHECK(proto::encode(m).size() <= proto::max_body_bytes(msg_type::kv_events));  // the largest one fits
    CHECK(round_trip(m) == m);
  }
  SECTION("kv_resync") {
    CHECK(round_trip(proto::kv_resync{.reason = "gap"}) == proto::kv_resync{.reason = "gap"});
    CHECK(round_trip(proto::kv_resync{}) == proto::kv_resync{});
  }
  SECTION("drain") {
    const proto::drain m{.reason = "rolling update ✓"};
    CHECK(round_trip(m) == m);
    CHECK(round_trip(proto::drain{}) == proto::drain{});
  }
}

TEST_CASE("protocol: a 49152-token tokenizer spec fits the welcome limit", "[protocol]") {
  proto::welcome m;
  m.worker_id = "w";
  m.model_id = "smollm2";
  m.tokenizer = make_tokenizer(49152);
  const std::string body = proto::encode(m);
  INFO("welcome body bytes: " << body.size());
  CHECK(body.size() < proto::k_max_welcome_body_bytes / 4);
  const proto::decode_result r = decode("welcome", body);
  REQUIRE(r.ok());
  CHECK(*r.get_if<proto::welcome>() == m);
  CHECK(r.get_if<proto::welcome>()->tokenizer.tokens.size() == 49152);
}

TEST_CASE("protocol: an unknown type frame is an error", "[protocol]") {
  const std::string body = proto::encode(proto::cancel{.request_id = "r"});
  for (std::string type : {std::string("bogus"), std::string(""), std::string("SUBMIT"), std::string("submit\0", 7),
                           std::string(1000, '\xff')}) {
    const proto::decode_result r = decode(type, body);
    REQUIRE_FALSE(r.ok());
    CHECK(r.failure().code == decode_errc::unknown_type);
    CHECK_THAT(r.failure().message, Catch::StartsWith("unknown message type"));
    CHECK(r.failure().message.size() < 200);  // the frame is not echoed unbounded
  }
  CHECK_THAT(decode("x\x01", body).failure().message, Catch::Contains("x\\x01"));
  CHECK(proto::name(decode_errc::unknown_type) == "unknown_type");
}

TEST_CASE("protocol: garbage bytes are malformed", "[protocol]") {
  const std::vector<std::string> garbage = {
      "",
      std::string("\xc1", 1),      // never-used byte
      std::string("\x00", 1),      // a lone integer
      "hello world",               // fixstr header then junk
      std::string("\x91\x01", 2),  // an array, not a map
      std::string("\xa3"
                  "abc",
                  4),                  // a string
      std::string("\x80\x80", 2),      // two maps: trailing bytes
      std::string("\x81\x01\x02", 3),  // a map, but with an integer key (checked below)
  };
  for (size_t i = 0; i + 1 < garbage.size(); ++i) {
    INFO("garbage #" << i);
    const proto::decode_result r = decode("submit", garbage[i]);
    REQUIRE_FALSE(r.ok());
    CHECK(r.failure().code == decode_errc::malformed);
  }
  // A map whose only key is not a string carries no fields: request_id stays empty.
  expect_error(msg_type::submit, garbage.back(), decode_errc::invalid_field, "request_id");
  expect_error(msg_type::cancel, std::string("\x80\x80", 2), decode_errc::malformed, "trailing");
  expect_error(msg_type::cancel, std::string("\x91\x01", 2), decode_errc::malformed, "not a map");
}

TEST_CASE("protocol: every prefix of a valid submit body is an error", "[protocol]") {
  const std::string body = proto::encode(make_submit());
  REQUIRE(decode("submit", body).ok());
  for (size_t n = 0; n < body.size(); ++n) {
    INFO("prefix of " << n << " bytes of " << body.size());
    const proto::decode_result r = decode("submit", std::string_view(body).substr(0, n));
    REQUIRE_FALSE(r.ok());
    CHECK(r.failure().code == decode_errc::malformed);
  }
}

TEST_CASE("protocol: wrong value types name the field", "[protocol]") {
  expect_error(msg_type::submit, map_body().add("request_id", "r").add("prompt", "1 2 3").str(),
               decode_errc::invalid_field, "submit: prompt: expected an array");
  expect_error(msg_type::submit, map_body().add("request_id", "r").add("prompt", std::vector<std::string>{"a"}).str(),
               decode_errc::invalid_field, "prompt[0]: expected an integer");
  expect_error(msg_type::submit, map_body().add("request_id", 42).str(), decode_errc::invalid_field,
               "request_id: expected a string");
  {
    const std::string sampling = map_body().add("top_k", "forty").str();
    expect_error(msg_type::submit, map_body().add("request_id", "r").add_raw("sampling", sampling).str(),
                 decode_errc::invalid_field, "sampling.top_k: expected an integer");
  }
  {
    const std::string sampling = map_body().add_raw("stop", "\x92\xa2ok\x03").str();  // ["ok", 3]
    expect_error(msg_type::submit, map_body().add("request_id", "r").add_raw("sampling", sampling).str(),
                 decode_errc::invalid_field, "sampling.stop[1]: expected a string");
  }
  expect_error(msg_type::submit, map_body().add("request_id", "r").add("sampling", 5).str(), decode_errc::invalid_field,
               "sampling: expected a map");
  expect_error(msg_type::submit, map_body().add("request_id", "r").add("stream", 1).str(), decode_errc::invalid_field,
               "stream: expected a boolean");
  expect_error(msg_type::submit,
               map_body().add("request_id", "r").add("prompt", std::vector<int64_t>{1, 1ll << 31}).str(),
               decode_errc::invalid_field, "prompt[1]: expected an integer in [-2147483648, 2147483647]");
  expect_error(msg_type::heartbeat, map_body().add("running", -1).str(), decode_errc::invalid_field,
               "running: expected an integer in [0, 4294967295]");
  expect_error(msg_type::heartbeat, map_body().add("step_time_ms", "fast").str(), decode_errc::invalid_field,
               "step_time_ms: expected a number");
  expect_error(msg_type::tokens, map_body().add("request_id", "r").add("usage", std::vector<int>{1, 2, 3}).str(),
               decode_errc::invalid_field, "usage: expected a map");
  {
    const std::string entry = map_body().add("token", 1).add("logprob", -0.5).add("top", 7).str();
    std::string logprobs = "\x91" + entry;
    expect_error(
        msg_type::tokens,
        map_body().add("request_id", "r").add("token_ids", std::vector<int>{1}).add_raw("logprobs", logprobs).str(),
        decode_errc::invalid_field, "logprobs[0].top: expected an array");
  }
  // Numbers where a float is wanted may be integers; strings may come as bin.
  {
    const std::string sampling = map_body().add("temperature", 1).str();
    msgpack::sbuffer bin;
    msgpack::packer<msgpack::sbuffer>(bin).pack_bin(3).pack_bin_body("r\0x", 3);
    const proto::decode_result r = decode(
        "submit",
        map_body().add_raw("request_id", std::string(bin.data(), bin.size())).add_raw("sampling", sampling).str());
    REQUIRE(r.ok());
    CHECK(r.get_if<proto::submit>()->request_id == std::string("r\0x", 3));
    CHECK(r.get_if<proto::submit>()->sampling.temperature == 1.f);
  }
}

TEST_CASE("protocol: over-size bodies are refused before parsing", "[protocol]") {
  // Valid msgpack, just too big: a cancel with a 300 KiB request id.
  const std::string big = proto::encode(proto::cancel{.request_id = std::string(300 << 10, 'x')});
  expect_error(msg_type::cancel, big, decode_errc::too_large, "over the limit of 262144");
  expect_error(msg_type::submit, std::string(proto::k_max_submit_body_bytes + 1, '\x80'), decode_errc::too_large);
  expect_error(msg_type::welcome, std::string(proto::k_max_welcome_body_bytes + 1, '\x80'), decode_errc::too_large);
  // A submit may be bigger than the other types: a 128k-token prompt.
  proto::submit s = make_submit();
  s.prompt.assign(128 * 1024, 49151);
  const std::string body = proto::encode(s);
  CHECK(body.size() > proto::k_max_other_body_bytes);
  const proto::decode_result r = decode("submit", body);
  REQUIRE(r.ok());
  CHECK(r.get_if<proto::submit>()->prompt.size() == 128 * 1024);
}

TEST_CASE("protocol: deep nesting is refused", "[protocol]") {
  const size_t depth = 10000;
  SECTION("inside an unknown key") {
    std::string body = map_body().add_raw("x", std::string(depth, '\x91') + '\x00').str();
    expect_error(msg_type::submit, body, decode_errc::malformed, "nested deeper than");
  }
  SECTION("at the top level") {
    expect_error(msg_type::drain, std::string(depth, '\x91') + '\x00', decode_errc::malformed, "nested deeper than");
  }
  SECTION("maps of maps") {
    std::string body;
    for (size_t i = 0; i < depth; ++i) body += "\x81\xa1k";
    body += '\xc0';
    expect_error(msg_type::heartbeat, body, decode_errc::malformed, "nested deeper than");
  }
  SECTION("truncated deep nesting") {
    expect_error(msg_type::drain, std::string(depth, '\x91'), decode_errc::malformed);
  }
}

TEST_CASE("protocol: length headers larger than the body are refused", "[protocol]") {
  const auto with_value = [](const std::string& raw) {
    return map_body().add("request_id", "r").add_raw("prompt", raw).str();
  };
  // array32 / map32 / str32 / bin32 declaring 4G entries, followed by next to nothing.
  expect_error(msg_type::submit, with_value(std::string("\xdd\xff\xff\xff\xff\x01", 6)), decode_errc::malformed,
               "elements in all");
  expect_error(msg_type::submit, with_value(std::string("\xdf\xff\xff\xff\xff\x01", 6)), decode_errc::malformed,
               "elements in all");
  expect_error(msg_type::submit,
               with_value(std::string("\xdb\xff\xff\xff\xff"
                                      "abc",
                                      8)),
               decode_errc::malformed, "truncated");
  expect_error(msg_type::submit,
               with_value(std::string("\xc6\xff\xff\xff\xff"
                                      "abc",
                                      8)),
               decode_errc::malformed, "truncated");
  // Within the element budget but longer than the body: truncated.
  expect_error(msg_type::submit, with_value(std::string("\xdd\x00\x07\xff\xff\x01\x02", 7)), decode_errc::malformed,
               "truncated");
  // Top-level map declaring 4G pairs.
  expect_error(msg_type::cancel, std::string("\xdf\xff\xff\xff\xff\xa1k\x01", 8), decode_errc::malformed,
               "elements in all");
  // Many headers each declaring a large array, in a welcome (largest budget).
  std::string nested;
  for (int i = 0; i < 6; ++i) nested += std::string("\xdd\x00\x0f\xff\xff", 5);
  expect_error(msg_type::welcome, map_body().add_raw("tokenizer", nested).str(), decode_errc::malformed,
               "elements in all");
}

TEST_CASE("protocol: value bounds are checked and name the field", "[protocol]") {
  const auto submit_err = [](const proto::submit& s, const std::string& needle) {
    return expect_error(msg_type::submit, proto::encode(s), decode_errc::invalid_field, needle);
  };
  {
    proto::submit s = make_submit();
    s.request_id = std::string(proto::k_max_id_bytes + 1, 'r');
    const proto::decode_error e = submit_err(s, "submit: request_id: longer than 128 bytes");
    CHECK(e.request_id.empty());  // the id itself is bad: nothing to name
  }
  {
    proto::submit s = make_submit();
    s.request_id = "";
    submit_err(s, "request_id: missing or empty");
  }
  {
    proto::submit s = make_submit();
    s.prompt.assign(proto::k_max_prompt_tokens + 1, 0);
    submit_err(s, "prompt: more than 524288 elements");
  }
  {
    proto::submit s = make_submit();
    s.prompt[3] = -1;
    submit_err(s, "prompt[3]: negative token id");
  }
  {
    proto::submit s = make_submit();
    s.sampling.stop.assign(proto::k_max_stop_strings + 1, "x");
    submit_err(s, "sampling.stop: more than 32 elements");
  }
  {
    proto::submit s = make_submit();
    s.sampling.stop[1] = std::string(proto::k_max_stop_bytes + 1, 's');
    submit_err(s, "sampling.stop[1]: longer than 1024 bytes");
  }
  {
    proto::submit s = make_submit();
    s.sampling.stop[2] = "";
    submit_err(s, "sampling.stop[2]: empty");
  }
  {
    proto::submit s = make_submit();
    s.sampling.logprobs = 1000000;
    const proto::decode_error e = submit_err(s, "sampling.logprobs: outside [0, 20]");
    // The request id was fine: the reply can end that request.
    CHECK(e.request_id == s.request_id);
    const proto::error w = proto::to_wire(e);
    CHECK(w.request_id == s.request_id);
    CHECK(w.code == proto::error_code::invalid_request);
    CHECK_THAT(w.message, Catch::Contains("sampling.logprobs"));
  }
  for (auto [field, mutate] : std::vector<std::pair<std::string, void (*)(proto::wire_sampling&)>>{
           {"sampling.temperature", [](proto::wire_sampling& p) { p.temperature = -1; }},
           {"sampling.temperature", [](proto::wire_sampling& p) { p.temperature = NAN; }},
           {"sampling.top_k", [](proto::wire_sampling& p) { p.top_k = -5; }},
           {"sampling.top_p", [](proto::wire_sampling& p) { p.top_p = 1.5f; }},
           {"sampling.min_p", [](proto::wire_sampling& p) { p.min_p = NAN; }},
           {"sampling.repetition_penalty", [](proto::wire_sampling& p) { p.repetition_penalty = 0; }},
           {"sampling.repeat_last_n", [](proto::wire_sampling& p) { p.repeat_last_n = -1; }},
           {"sampling.max_tokens", [](proto::wire_sampling& p) { p.max_tokens = -1; }},
           {"sampling.max_tokens: less than 1", [](proto::wire_sampling& p) { p.max_tokens = 0; }},
           {"sampling.top_p: outside (0, 1]", [](proto::wire_sampling& p) { p.top_p = 0; }},
       }) {
    proto::submit s = make_submit();
    mutate(s.sampling);
    submit_err(s, field);
  }
  {
    proto::tokens t = make_tokens();
    expect_error(msg_type::tokens, map_body().add("request_id", "r1").add("finish_reason", "exploded").str(),
                 decode_errc::invalid_field, "finish_reason: not one of");
    t = make_tokens();
    t.stop = "END";  // finish_reason length
    expect_error(msg_type::tokens, proto::encode(t), decode_errc::invalid_field,
                 "stop: given without finish_reason stop");
    t = make_tokens();
    t.logprobs.pop_back();
    expect_error(msg_type::tokens, proto::encode(t), decode_errc::invalid_field,
                 "logprobs: neither empty nor one per token");
    t = make_tokens();
    t.logprobs[1].top.assign(proto::k_max_top_logprobs + 1, {});
    expect_error(msg_type::tokens, proto::encode(t), decode_errc::invalid_field,
                 "logprobs[1].top: more than 20 elements");
    t = make_tokens();
    t.usage.cached_prompt_tokens = t.usage.prompt_tokens + 1;
    expect_error(msg_type::tokens, proto::encode(t), decode_errc::invalid_field, "usage.cached_prompt_tokens");
    t = make_tokens();
    t.token_ids.assign(proto::k_max_tokens_per_message + 1, 1);
    t.logprobs.clear();
    expect_error(msg_type::tokens, proto::encode(t), decode_errc::invalid_field, "token_ids: more than 1024 elements");
  }
  {
    proto::heartbeat hb{.free_kv_blocks = 11, .total_kv_blocks = 10};
    expect_error(msg_type::heartbeat, proto::encode(hb), decode_errc::invalid_field, "free_kv_blocks");
    proto::heartbeat w{
        .free_kv_blocks = 1, .total_kv_blocks = 10, .free_window_kv_blocks = 3, .total_window_kv_blocks = 2};
    expect_error(msg_type::heartbeat, proto::encode(w), decode_errc::invalid_field, "free_window_kv_blocks");
  }
  {
    proto::welcome w;
    w.tokenizer = make_tokenizer(10);
    w.tokenizer.token_types.pop_back();
    expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field, "tokenizer.token_types");
    w.tokenizer = make_tokenizer(10);
    w.tokenizer.eos_id = 10;
    expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field, "tokenizer.eos_id");
    w.tokenizer = make_tokenizer(10);
    w.tokenizer.scores.pop_back();
    expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field, "tokenizer.scores");
    w.tokenizer = make_tokenizer(10);
    w.tokenizer.scores[7] = std::nanf("");
    expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field, "tokenizer.scores[7]: not a number");
    w.tokenizer = make_tokenizer(10);
    w.tokenizer.eot_id = -2;
    expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field, "tokenizer.eot_id");
    w.tokenizer = make_tokenizer(10);
    w.tokenizer.fim_sep_id = 10;
    expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field, "tokenizer.fim_sep_id");
    w.tokenizer = make_tokenizer(10);
    w.tokenizer.tokens[4] = std::string(proto::k_max_token_bytes + 1, 't');
    expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field,
                 "tokenizer.tokens[4]: longer than 4096 bytes");
  }
  expect_error(msg_type::cancel, proto::encode(proto::cancel{}), decode_errc::invalid_field, "request_id");
  expect_error(msg_type::error,
               map_body().add("request_id", "").add("code", std::string(65, 'c')).add("message", "").str(),
               decode_errc::invalid_field, "code: longer than 64 bytes");
  {  // A code from a newer peer still ends its request: it reads as other, a worker fault.
    const proto::decode_result r =
        decode("error", map_body().add("request_id", "r1").add("code", "brand_new").add("message", "m").str());
    REQUIRE(r.get_if<proto::error>() != nullptr);
    CHECK(r.get_if<proto::error>()->code == proto::error_code::other);
  }
  expect_error(msg_type::drain, proto::encode(proto::drain{.reason = std::string(1025, 'r')}),
               decode_errc::invalid_field, "reason");
  // A decode error without a request becomes a connection-level bad_message.
  const proto::error w = proto::to_wire(expect_error(msg_type::cancel, "\xc1", decode_errc::malformed));
  CHECK(w.request_id.empty());
  CHECK(w.code == proto::error_code::bad_message);
}

TEST_CASE("protocol: protocol versions", "[protocol]") {
  CHECK_FALSE(proto::check_version(proto::k_protocol_version).has_value());
  const std::optional<proto::error> e = proto::check_version(proto::k_protocol_version + 1);
  REQUIRE(e.has_value());
  CHECK(e->code == proto::error_code::unknown_version);
  CHECK(e->request_id.empty());
  CHECK_THAT(e->message, Catch::Contains("version 2") && Catch::Contains("version 1"));
  REQUIRE(proto::check_version(0).has_value());

  // The version travels in hello and welcome and must be present there.
  const proto::decode_result r = decode("hello", proto::encode(proto::hello{.version = 9, .router_id = "r"}));
  REQUIRE(r.ok());
  CHECK(proto::check_version(r.get_if<proto::hello>()->version).has_value());
  expect_error(msg_type::hello, map_body().add("router_id", "r").str(), decode_errc::invalid_field,
               "hello: version: missing");
  expect_error(msg_type::welcome, map_body().add("worker_id", "w").str(), decode_errc::invalid_field,
               "welcome: version: missing");
  expect_error(msg_type::hello, map_body().add("version", -1).str(), decode_errc::invalid_field,
               "version: expected an integer");
}

TEST_CASE("protocol: forward compatibility", "[protocol]") {
  SECTION("unknown keys are ignored, at the top and nested") {
    msgpack::sbuffer ext;
    msgpack::packer<msgpack::sbuffer>(ext).pack_ext(2, 5).pack_ext_body("ab", 2);
    const std::string sampling = map_body().add("top_k", 7).add("future_knob", std::vector<double>{1.5, 2.5}).str();
    const std::string body = map_body()
                                 .add("request_id", "r9")
                                 .add("prompt", std::vector<int>{1, 2, 3})
                                 .add_raw("sampling", sampling)
                                 .add("tenant", "acme")
                                 .add_raw("blob", std::string(ext.data(), ext.size()))
                                 .add("nested", std::map<std::string, std::vector<int>>{{"a", {1}}})
                                 .str();
    const proto::decode_result r = decode("submit", body);
    INFO((r.ok() ? "" : r.failure().message));
    REQUIRE(r.ok());
    const proto::submit& s = *r.get_if<proto::submit>();
    CHECK(s.request_id == "r9");
    CHECK(s.prompt == std::vector<int32_t>{1, 2, 3});
    CHECK(s.sampling.top_k == 7);
  }
  SECTION("missing keys keep the defaults") {
    const proto::decode_result r =
        decode("submit", map_body().add("request_id", "r").add("prompt", std::vector<int>{4}).str());
    REQUIRE(r.ok());
    proto::submit expected;
    expected.request_id = "r";
    expected.prompt = {4};
    CHECK(*r.get_if<proto::submit>() == expected);
    CHECK(r.get_if<proto::submit>()->stream == true);
    CHECK(r.get_if<proto::submit>()->sampling.max_tokens == 256);

    const proto::decode_result hb = decode("heartbeat", std::string("\x80", 1));
    REQUIRE(hb.ok());
    CHECK(*hb.get_if<proto::heartbeat>() == proto::heartbeat{});
    const proto::decode_result d = decode("drain", std::string("\x80", 1));
    REQUIRE(d.ok());
    CHECK(d.get_if<proto::drain>()->reason.empty());
  }
  SECTION("a tokenizer spec from before scores, eot/eom/fim ids, add_eos and add_space_prefix") {
    // What an older worker sends: a byte-level BPE spec with only the original keys.
    const std::string spec = map_body()
                                 .add("model", "gpt2")
                                 .add("pre", "smollm")
                                 .add("tokens", std::vector<std::string>{"a", "b", "ab"})
                                 .add("merges", std::vector<std::string>{"a b"})
                                 .add("bos_id", 0)
                                 .add("eos_id", 2)
                                 .add("add_bos", true)
                                 .str();
    const proto::decode_result r =
        decode("welcome", map_body().add("version", proto::k_protocol_version).add_raw("tokenizer", spec).str());
    INFO((r.ok() ? "" : r.failure().message));
    REQUIRE(r.ok());
    const proto::tokenizer_spec& t = r.get_if<proto::welcome>()->tokenizer;
    CHECK(t.tokens.size() == 3);
    CHECK(t.add_bos);
    CHECK(t.scores.empty());
    CHECK(t.eot_id == -1);
    CHECK(t.eom_id == -1);
    CHECK(t.fim_pad_id == -1);
    CHECK_FALSE(t.add_eos);
    CHECK_FALSE(t.add_space_prefix);  // byte-level BPE never adds one
  }
  SECTION("a heartbeat with and without the window pool's blocks") {
    // What a worker from before the window pool sends: only the main pool. Its binding pool is
    // the main one.
    const std::string old = map_body()
                                .add("running", 1)
                                .add("waiting", 0)
                                .add("free_kv_blocks", 7)
                                .add("total_kv_blocks", 64)
                                .add("step_time_ms", 2.5)
                                .add("steps", 9)
                                .add("draining", false)
                                .add("unix_ms", 5)
                                .add("kv_seq", 3)
                                .str();
    const proto::decode_result r = decode("heartbeat", old);
    REQUIRE(r.ok());
    const proto::heartbeat& hb = *r.get_if<proto::heartbeat>();
    CHECK(hb.free_kv_blocks == 7);
    CHECK(hb.free_window_kv_blocks == 0);
    CHECK(hb.total_window_kv_blocks == 0);
    CHECK(proto::free_kv_blocks_binding(hb) == 7);

    // What a worker with the window pool sends: the old keys with their old values and types,
    // which is all an older router reads (it ignores keys it does not know, as above), and the
    // window pool's pair after them.
    const proto::heartbeat now{.running = 1,
                               .free_kv_blocks = 500,
                               .total_kv_blocks = 2081,
                               .kv_seq = 3,
                               .free_window_kv_blocks = 0,
                               .total_window_kv_blocks = 659};
    const std::string body = proto::encode(now);
    const msgpack::object_handle oh = msgpack::unpack(body.data(), body.size());
    const auto fields = oh.get().as<std::map<std::string, msgpack::object>>();
    CHECK(fields.size() == 11);
    CHECK(fields.at("free_kv_blocks").as<uint32_t>() == 500);
    CHECK(fields.at("total_kv_blocks").as<uint32_t>() == 2081);
    CHECK(fields.at("free_window_kv_blocks").as<uint32_t>() == 0);
    CHECK(fields.at("total_window_kv_blocks").as<uint32_t>() == 659);
    CHECK(round_trip(now) == now);
    // Out of window blocks with main blocks free: the window pool binds.
    CHECK(proto::free_kv_blocks_binding(now) == 0);
    proto::heartbeat roomy = now;
    roomy.free_window_kv_blocks = 659;
    CHECK(proto::free_kv_blocks_binding(roomy) == 500);
  }
  SECTION("nil counts as missing") {
    const proto::decode_result r =
        decode("submit", map_body().add("request_id", "r").add("priority", msgpack::type::nil_t()).str());
    REQUIRE(r.ok());
    CHECK(r.get_if<proto::submit>()->priority == 0);
  }
}

TEST_CASE("protocol: randomly mutated bodies decode to a value or an error", "[protocol]") {
  const auto bodies = valid_bodies();
  for (const auto& [t, body] : bodies) REQUIRE(decode(proto::name(t), body).ok());

  std::mt19937_64 rng(20240601);
  int n_ok = 0, n_err = 0;
  int by_code[4] = {};
  for (int iter = 0; iter < 20000; ++iter) {
    const auto& [t, original] = bodies[rng() % bodies.size()];
    std::string b = original;
    const int n_edits = 1 + int(rng() % 4);
    for (int e = 0; e < n_edits; ++e) {
      const size_t pos = b.empty() ? 0 : rng() % b.size();
      switch (rng() % 4) {
        case 0:
          if (!b.empty()) b[pos] = static_cast<char>(b[pos] ^ (1u << (rng() % 8)));  // flip a bit
          break;
        case 1:
          if (!b.empty()) b[pos] = static_cast<char>(rng());  // replace a byte
          break;
        case 2:
          b.insert(b.begin() + pos, static_cast<char>(rng()));
          break;
        case 3:
          if (!b.empty()) b.erase(pos, 1 + rng() % 3);
          break;
      }
    }
    // Sometimes decode under the wrong type too.
    const msg_type as = rng() % 8 == 0 ? static_cast<msg_type>(rng() % proto::k_n_msg_types) : t;
    proto::decode_result r = decode(proto::name(as), b);
    if (r.ok()) {
      ++n_ok;
      // Whatever decodes also re-encodes to something that decodes to the same value.
      const proto::decode_result again = decode(proto::name(as), proto::encode(r.value()));
      REQUIRE(again.ok());
      CHECK(again.value() == r.value());
    } else {
      ++n_err;
      ++by_code[static_cast<int>(r.failure().code)];
      REQUIRE_FALSE(r.failure().message.empty());
    }
  }
  INFO("ok " << n_ok << ", errors " << n_err << " (malformed " << by_code[2] << ", invalid_field " << by_code[3]
             << ")");
  CHECK(n_ok + n_err == 20000);
  CHECK(n_err > 1000);
  CHECK(n_ok > 100);
}

TEST_CASE("protocol: kv_events from a hostile peer is refused with the field named", "[protocol]") {
  // seq is required and starts at 1.
  expect_error(msg_type::kv_events, map_body().add("stored", std::vector<uint64_t>{1}).str(),
               decode_errc::invalid_field, "seq: missing");
  auto kv = [](uint64_t seq, std::vector<uint64_t> stored, std::vector<uint64_t> evicted) {
    proto::kv_events m;
    m.seq = seq;
    m.stored = std::move(stored);
    m.evicted = std::move(evicted);
    return proto::encode(m);
  };
  expect_error(msg_type::kv_events, kv(0, {}, {}), decode_errc::invalid_field, "seq");
  expect_error(msg_type::kv_events, map_body().add("seq", -1).str(), decode_errc::invalid_field, "seq");
  expect_error(msg_type::kv_events, map_body().add("seq", 1.5).str(), decode_errc::invalid_field, "seq");
  // 0 is no block hash (it means "no parent").
  expect_error(msg_type::kv_events, kv(1, {5, 0}, {}), decode_errc::invalid_field, "stored[1]");
  expect_error(msg_type::kv_events, kv(1, {}, {0}), decode_errc::invalid_field, "evicted[0]");
  // Wrong types.
  expect_error(msg_type::kv_events, map_body().add("seq", 1).add("stored", "1 2 3").str(), decode_errc::invalid_field,
               "stored: expected an array");
  expect_error(msg_type::kv_events, map_body().add("seq", 1).add("stored", std::vector<int64_t>{-4}).str(),
               decode_errc::invalid_field, "stored[0]");
  expect_error(msg_type::kv_events, map_body().add("seq", 1).add("evicted", std::vector<std::string>{"h"}).str(),
               decode_errc::invalid_field, "evicted[0]");
  expect_error(msg_type::kv_events, map_body().add("seq", 1).add("reset", 1).str(), decode_errc::invalid_field,
               "reset");
  expect_error(msg_type::kv_events, map_body().add("seq", 1).add("model_id", std::string(257, 'm')).str(),
               decode_errc::invalid_field, "model_id");
  // Over the per-message bound: senders split.
  expect_error(msg_type::kv_events, kv(1, std::vector<uint64_t>(proto::k_max_kv_hashes + 1, 7), {}),
               decode_errc::invalid_field, "stored: more than 8192");
  // A header that claims far more hashes than the body holds.
  expect_error(msg_type::kv_events,
               map_body().add("seq", 1).add_raw("stored", std::string("\xdd\xff\xff\xff\xff", 5)).str(),
               decode_errc::malformed);
  expect_error(msg_type::kv_resync, map_body().add("reason", std::string(1025, 'r')).str(), decode_errc::invalid_field,
               "reason");
  // Unknown keys are ignored (a later field does not break this build).
  const proto::decode_result r = decode("kv_events", map_body().add("seq", 3).add("future", "x").str());
  REQUIRE(r.ok());
  CHECK(r.get_if<proto::kv_events>()->seq == 3);
}

TEST_CASE("protocol: served model names are bounded and non-empty", "[protocol]") {
  proto::welcome w;
  w.served_model_names = {"a", ""};
  expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field, "served_model_names[1]");
  w.served_model_names = {std::string(proto::k_max_model_id_bytes + 1, 'x')};
  expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field, "served_model_names");
  w.served_model_names.assign(proto::k_max_served_model_names + 1, "x");
  expect_error(msg_type::welcome, proto::encode(w), decode_errc::invalid_field, "served_model_names");
  w.served_model_names.assign(proto::k_max_served_model_names, "x");
  CHECK(decode("welcome", proto::encode(w)).ok());
}
