// Pure parts of the response cache: stored-response encoding, the caching policy, Redis URL
// parsing, age buckets and the stats JSON.
#include "cache/cache_stats.hpp"
#include "cache/entry_mac.hpp"
#include "cache/redis_client.hpp"
#include "cache/response_cache.hpp"
#include "cache/stored_response.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <random>
#include <string>

using namespace sy::cache;

namespace {

stored_response sample_response() {
  stored_response r;
  r.endpoint = 1;
  r.model = "smollm2-135m";
  r.choices.push_back(
      {{"Hello", ",", " world", "!", std::string("\0\xff", 2)}, sy::finish_reason::stop, R"({"content":[]})", ""});
  r.choices.push_back({{"Hi"}, sy::finish_reason::length, "", ""});
  r.choices.push_back({{"Hey"}, sy::finish_reason::stop, "", "\n\nHuman:"});
  r.prompt_tokens = 31;
  r.completion_tokens = 7;
  r.cached_tokens = 16;
  r.generation_s = 0.125;
  r.created_unix_s = 1'700'000'123;
  return r;
}

// The encoding's trailing checksum (cache/stored_response.hpp), to forge well-formed records.
std::string with_checksum(std::string body) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : body) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  for (int i = 0; i < 8; ++i) body.push_back(static_cast<char>((h >> (8 * i)) & 0xff));
  return body;
}

}  // namespace

TEST_CASE("stored_response round-trips through encode and decode", "[cache_codec]") {
  stored_response r = sample_response();
  std::string bytes = encode(r);
  auto back = decode(bytes);
  REQUIRE(back);
  CHECK(*back == r);
  CHECK(back->text(0) == std::string("Hello, world!\0\xff", 15));
  CHECK(back->choices[1].finish_reason == sy::finish_reason::length);

  stored_response empty;
  auto back_empty = decode(encode(empty));
  REQUIRE(back_empty);
  CHECK(*back_empty == empty);
}

TEST_CASE("stored_response keeps finish reasons as their names", "[cache_codec]") {
  // The stored format predates the enum: each reason is the str of its name, so records written
  // before and after read the same.
  const std::string bytes = encode(sample_response());
  CHECK(bytes.find(std::string("\x04\0\0\0stop", 8)) != std::string::npos);
  CHECK(bytes.find(std::string("\x06\0\0\0length", 10)) != std::string::npos);

  // A name this build does not know (a newer router's) is a named refusal, not a guess.
  std::string body = bytes.substr(0, bytes.size() - 8);
  const size_t at = body.find("stop");
  REQUIRE(at != std::string::npos);
  body.replace(at, 4, "halt");
  decode_error why = decode_error::malformed;
  CHECK_FALSE(decode(with_checksum(body), &why));
  CHECK(why == decode_error::unknown_finish_reason);
  CHECK(name(why) == "unknown_finish_reason");
  // The forged checksum is right: the same body with a known name decodes.
  body.replace(at, 4, "stop");
  CHECK(decode(with_checksum(body)) == sample_response());

  why = decode_error::unknown_finish_reason;
  CHECK_FALSE(decode(std::string_view(bytes).substr(0, 20), &why));
  CHECK(why == decode_error::malformed);
  CHECK(name(why) == "malformed");
}

TEST_CASE("decode rejects every truncation, extension and single-bit flip", "[cache_codec]") {
  std::string bytes = encode(sample_response());
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("prefix length " << n);
    CHECK_FALSE(decode(std::string_view(bytes).substr(0, n)));
  }
  CHECK_FALSE(decode(bytes + '\0'));
  size_t flips_rejected = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string damaged = bytes;
      damaged[i] = static_cast<char>(damaged[i] ^ (1 << bit));
      flips_rejected += decode(damaged) ? 0 : 1;
    }
  }
  CHECK(flips_rejected == bytes.size() * 8);
}

TEST_CASE("decode survives random garbage", "[cache_codec]") {
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 2000; ++i) {
    std::string junk(rng() % 200, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (i % 2 == 0 && junk.size() >= 5) junk.replace(0, 5, std::string("SYRC\x01", 5));  // plausible header
    CHECK_FALSE(decode(junk));
  }
}

TEST_CASE("cacheable follows temperature, seed, opt-out and policy", "[cache_codec]") {
  cache_policy p;
  CHECK(cacheable(0.0f, false, false, p));
  CHECK(cacheable(-0.0f, false, false, p));
  CHECK_FALSE(cacheable(0.7f, false, false, p));
  CHECK(cacheable(0.7f, true, false, p));
  CHECK_FALSE(cacheable(0.0f, false, true, p));  // Cache-Control: no-store
  CHECK_FALSE(cacheable(0.7f, true, true, p));
  p.cache_seeded_sampling = false;
  CHECK_FALSE(cacheable(0.7f, true, false, p));
  CHECK(cacheable(0.0f, true, false, p));
  p.enabled = false;
  CHECK_FALSE(cacheable(0.0f, false, false, p));
}

TEST_CASE("parse_url reads redis:// and unix:// URLs", "[cache_codec]") {
  std::string err;
  auto a = redis_config::parse_url("redis://alice:p%40ss@cache.internal:6380/3", &err);
  REQUIRE(a);
  CHECK(a->host == "cache.internal");
  CHECK(a->port == 6380);
  CHECK(a->user == "alice");
  CHECK(a->password == "p@ss");
  CHECK(a->db == 3);
  CHECK(a->unix_socket.empty());

  auto b = redis_config::parse_url("redis://localhost", &err);
  REQUIRE(b);
  CHECK(b->host == "localhost");
  CHECK(b->port == 6379);
  CHECK(b->db == 0);
  CHECK(b->password.empty());

  auto c = redis_config::parse_url("redis://:secret@[::1]:7000/0", &err);
  REQUIRE(c);
  CHECK(c->host == "::1");
  CHECK(c->port == 7000);
  CHECK(c->user.empty());
  CHECK(c->password == "secret");

  auto d = redis_config::parse_url("unix:///run/redis/redis.sock?db=2&password=pw", &err);
  REQUIRE(d);
  CHECK(d->unix_socket == "/run/redis/redis.sock");
  CHECK(d->db == 2);
  CHECK(d->password == "pw");

  auto e = redis_config::parse_url("unix:///tmp/r.sock", &err);
  REQUIRE(e);
  CHECK(e->unix_socket == "/tmp/r.sock");
  CHECK(e->db == 0);
}

TEST_CASE("parse_url rejects malformed URLs and TLS with a message", "[cache_codec]") {
  const char* bad[] = {"rediss://host:6380",  "http://host",          "redis://",
                       "redis://host:0",      "redis://host:99999",   "redis://host:12ab",
                       "redis://host/x",      "redis://[::1",         "unix://relative.sock",
                       "unix:///a.sock?db=x", "unix:///a.sock?foo=1", "redis://u:p%zz@host"};
  for (const char* url : bad) {
    std::string err;
    INFO(url);
    CHECK_FALSE(redis_config::parse_url(url, &err));
    CHECK_FALSE(err.empty());
  }
  std::string err;
  redis_config::parse_url("rediss://host", &err);
  CHECK(err.find("TLS") != std::string::npos);
  CHECK_FALSE(redis_config::parse_url("ftp://x", nullptr));  // a null error pointer is allowed
}

TEST_CASE("hit ages fall into the documented buckets", "[cache_codec]") {
  CHECK(age_bucket(0) == 0);
  CHECK(age_bucket(59.9) == 0);
  CHECK(age_bucket(60) == 1);
  CHECK(age_bucket(599) == 1);
  CHECK(age_bucket(600) == 2);
  CHECK(age_bucket(3599) == 2);
  CHECK(age_bucket(3600) == 3);
  CHECK(age_bucket(86399) == 3);
  CHECK(age_bucket(86400) == 4);
  CHECK(k_age_bucket_names[age_bucket(30)] == "<1m");
}

TEST_CASE("to_json carries totals, series, breakdowns, ages and top prompts", "[cache_codec]") {
  cache_stats s;
  s.from_unix_s = 600;
  s.to_unix_s = 719;
  event_counts c;
  c.hit = 3;
  c.miss = 1;
  c.coalesced = 0;
  c.bypass = 0;
  c.tokens_saved = 30;
  c.device_ms_saved = 1500;
  s.total = c;
  s.series = {{10, c}, {11, {}}};
  s.by_tenant["acme"] = c;
  s.by_model["m|1"] = c;
  s.hit_age[1] = 3;
  s.top = {{"abc", 4, std::string("how do I \xff register?")}, {"def", 2, std::nullopt}};

  auto j = nlohmann::json::parse(to_json(s));
  CHECK(j["from"] == 600);
  CHECK(j["complete"] == true);
  CHECK(j["totals"]["hit"] == 3);
  CHECK(j["totals"]["requests"] == 4);
  CHECK(j["totals"]["hit_rate"].get<double>() == Approx(0.75));
  CHECK(j["totals"]["device_s_saved"].get<double>() == Approx(1.5));
  REQUIRE(j["series"].size() == 2);
  CHECK(j["series"][0]["t"] == 600);
  CHECK(j["series"][1]["requests"] == 0);
  CHECK(j["series"][1]["hit_rate"].get<double>() == 0.0);
  CHECK(j["by_tenant"]["acme"]["tokens_saved"] == 30);
  CHECK(j["by_model"]["m|1"]["hit"] == 3);
  CHECK(j["hit_age"]["<10m"] == 3);
  CHECK(j["hit_age"]["<1m"] == 0);
  REQUIRE(j["top_prompts"].size() == 2);
  CHECK(j["top_prompts"][0]["hash"] == "abc");
  CHECK(j["top_prompts"][0]["count"] == 4);
  CHECK(j["top_prompts"][0]["preview"].get<std::string>().find("register?") != std::string::npos);
  CHECK_FALSE(j["top_prompts"][1].contains("preview"));

  s.complete = false;
  s.error = "timeout: Resource temporarily unavailable";
  auto j2 = nlohmann::json::parse(to_json(s));
  CHECK(j2["complete"] == false);
  CHECK(j2["error"] == s.error);
}

TEST_CASE("a sealed entry opens only under its MAC key and its Redis key", "[cache_codec]") {
  const std::string mac_key = "0123456789abcdef-mac", redis_key = "r:default:aa11";
  const std::string encoded = encode(sample_response());
  const std::string sealed = seal(mac_key, redis_key, encoded);
  REQUIRE(sealed.size() == encoded.size() + k_entry_mac_bytes);
  const auto body = unseal(mac_key, redis_key, sealed);
  REQUIRE(body.has_value());
  CHECK(*body == encoded);
  CHECK_FALSE(unseal("another-key-0123456", redis_key, sealed));  // forged without the key
  CHECK_FALSE(unseal(mac_key, "r:default:bb22", sealed));         // moved under another key
  CHECK_FALSE(unseal(mac_key, redis_key, encoded));               // written unsealed
  CHECK_FALSE(unseal(mac_key, redis_key, sealed.substr(0, 20)));  // truncated
  for (size_t i = 0; i < sealed.size(); i += 7) {                 // any flipped bit, entry or MAC
    std::string flipped = sealed;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x10);
    CHECK_FALSE(unseal(mac_key, redis_key, flipped));
  }
}

TEST_CASE("redacted_url names the server without the password", "[cache_codec]") {
  std::string err;
  auto a = redis_config::parse_url("redis://alice:s3cret@cache.internal:6380/3", &err);
  REQUIRE(a);
  CHECK(a->redacted_url() == "redis://alice:***@cache.internal:6380/3");
  auto b = redis_config::parse_url("unix:///run/redis.sock?db=2&password=s3cret", &err);
  REQUIRE(b);
  CHECK(b->redacted_url() == "unix://:***@/run/redis.sock?db=2");
  auto c = redis_config::parse_url("redis://[::1]:7000", &err);
  REQUIRE(c);
  CHECK(c->redacted_url() == "redis://[::1]:7000/0");
}
