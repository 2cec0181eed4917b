// Response cache keys (cache/cache_key.hpp): every output-affecting field changes the key,
// identical inputs agree, namespaces isolate, and the encoding is unambiguous.
#include "cache/cache_key.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

using sy::cache::key_input;

namespace {

key_input base_input() {
  key_input in;
  in.tenant_namespace = "acme";
  in.model = "smollm2-135m";
  in.endpoint = 1;
  in.prompt_tokens = {1, 9690, 198, 2683, 359, 253};
  in.sampling = {.temperature = 0.0f,
                 .top_k = 40,
                 .top_p = 0.9f,
                 .min_p = 0.05f,
                 .repetition_penalty = 1.1f,
                 .repeat_last_n = 64,
                 .seed = 42,
                 .has_seed = true,
                 .max_tokens = 128,
                 .stop = {"\n\n", "User:"},
                 .ignore_eos = false,
                 .logprobs = 0,
                 .thinking_budget = 0,
                 .thinking_end = {}};
  in.n = 1;
  in.want_logprobs = false;
  in.echo = false;
  return in;
}

bool is_lower_hex(const std::string& s) { return s.find_first_not_of("0123456789abcdef") == std::string::npos; }

}  // namespace

TEST_CASE("sha256_hex matches the FIPS 180-2 test vectors", "[cache_key]") {
  CHECK(sy::cache::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sy::cache::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("identical inputs give the same key in the documented layout", "[cache_key]") {
  key_input a = base_input(), b = base_input();
  std::string ka = sy::cache::make_key(a);
  CHECK(ka == sy::cache::make_key(b));
  const std::string prefix = "sy:v1:r:acme:";
  REQUIRE(ka.size() == prefix.size() + 64);
  CHECK(ka.substr(0, prefix.size()) == prefix);
  CHECK(is_lower_hex(ka.substr(prefix.size())));
}

TEST_CASE("changing any single field changes the key", "[cache_key]") {
  std::vector<std::pair<const char*, std::function<void(key_input&)>>> changes = {
      {"tenant_namespace", [](key_input& k) { k.tenant_namespace = "globex"; }},
      {"model", [](key_input& k) { k.model = "smollm2-360m"; }},
      {"endpoint", [](key_input& k) { k.endpoint = 0; }},
      {"prompt token value", [](key_input& k) { k.prompt_tokens[3] = 2684; }},
      {"prompt token appended", [](key_input& k) { k.prompt_tokens.push_back(0); }},
      {"prompt token removed", [](key_input& k) { k.prompt_tokens.pop_back(); }},
      {"temperature", [](key_input& k) { k.sampling.temperature = 0.7f; }},
      {"top_p", [](key_input& k) { k.sampling.top_p = 0.95f; }},
      {"min_p", [](key_input& k) { k.sampling.min_p = 0.0f; }},
      {"repetition_penalty", [](key_input& k) { k.sampling.repetition_penalty = 1.0f; }},
      {"top_k", [](key_input& k) { k.sampling.top_k = 41; }},
      {"repeat_last_n", [](key_input& k) { k.sampling.repeat_last_n = 128; }},
      {"max_tokens", [](key_input& k) { k.sampling.max_tokens = 129; }},
      {"n", [](key_input& k) { k.n = 2; }},
      {"logprobs", [](key_input& k) { k.sampling.logprobs = 5; }},
      {"want_logprobs", [](key_input& k) { k.want_logprobs = true; }},
      {"echo", [](key_input& k) { k.echo = true; }},
      {"ignore_eos", [](key_input& k) { k.sampling.ignore_eos = true; }},
      {"has_seed", [](key_input& k) { k.sampling.has_seed = false; }},
      {"seed", [](key_input& k) { k.sampling.seed = 43; }},
      {"seed high bits", [](key_input& k) { k.sampling.seed = 42 + (uint64_t(1) << 40); }},
      {"stop value", [](key_input& k) { k.sampling.stop[1] = "Assistant:"; }},
      {"stop order", [](key_input& k) { std::swap(k.sampling.stop[0], k.sampling.stop[1]); }},
      {"stop removed", [](key_input& k) { k.sampling.stop.pop_back(); }},
      {"stop empty string added", [](key_input& k) { k.sampling.stop.push_back(""); }},
      {"thinking budget",
       [](key_input& k) {
         k.sampling.thinking_budget = 64;
         k.sampling.thinking_end = "\n</think>\n\n";
       }},
      {"tools", [](key_input& k) { k.tools = "auto\n\nparallel\n{}"; }},
      {"tools and a constraint",
       [](key_input& k) {
         k.tools = "required\n\nparallel\n{}";
         k.constraint_kind = "json_schema";
         k.constraint_schema = "{}";
       }},
  };
  const std::string base_key = sy::cache::make_key(base_input());
  std::set<std::string> seen = {base_key};
  for (const auto& [what, change] : changes) {
    key_input in = base_input();
    change(in);
    std::string k = sy::cache::make_key(in);
    INFO("field: " << what);
    CHECK(k != base_key);
    CHECK(seen.insert(k).second);  // and differs from every other single change
  }
  CHECK(seen.size() == changes.size() + 1);
}

TEST_CASE("namespaces isolate identical requests", "[cache_key]") {
  key_input a = base_input(), b = base_input();
  b.tenant_namespace = "globex";
  std::string ka = sy::cache::make_key(a), kb = sy::cache::make_key(b);
  CHECK(ka != kb);
  CHECK(ka.substr(ka.size() - 64) != kb.substr(kb.size() - 64));  // the hash differs, not only the prefix
  CHECK(kb.rfind("sy:v1:r:globex:", 0) == 0);

  // A ':' in a namespace cannot forge another tenant's key: the namespace is also hashed.
  key_input c = base_input(), d = base_input();
  c.tenant_namespace = "a:b";
  d.tenant_namespace = "a";
  CHECK(sy::cache::make_key(c) != sy::cache::make_key(d));
}

TEST_CASE("the encoding is unambiguous across field boundaries", "[cache_key]") {
  key_input a = base_input(), b = base_input(), c = base_input();
  a.sampling.stop = {"ab", "c"};
  b.sampling.stop = {"a", "bc"};
  c.sampling.stop = {"abc"};
  std::set<std::string> keys = {sy::cache::make_key(a), sy::cache::make_key(b), sy::cache::make_key(c)};
  CHECK(keys.size() == 3);

  key_input m1 = base_input(), m2 = base_input();
  m1.tenant_namespace = "ab";
  m1.model = "c";
  m2.tenant_namespace = "a";
  m2.model = "bc";
  CHECK(sy::cache::canonical_bytes(m1) != sy::cache::canonical_bytes(m2));

  // Tokens are fixed-width: {256} is not {0, 1} or any other split of the same bytes.
  key_input t1 = base_input(), t2 = base_input();
  t1.prompt_tokens = {256};
  t2.prompt_tokens = {0, 1};
  CHECK(sy::cache::make_key(t1) != sy::cache::make_key(t2));
}

TEST_CASE("floats are compared by value: -0.0 is 0.0 and all NaNs are one", "[cache_key]") {
  key_input pos = base_input(), neg = base_input();
  pos.sampling.temperature = 0.0f;
  neg.sampling.temperature = -0.0f;
  REQUIRE(std::signbit(neg.sampling.temperature));
  CHECK(sy::cache::make_key(pos) == sy::cache::make_key(neg));

  key_input nan1 = base_input(), nan2 = base_input();
  nan1.sampling.top_p = std::numeric_limits<float>::quiet_NaN();
  nan2.sampling.top_p = -std::numeric_limits<float>::quiet_NaN();
  CHECK(sy::cache::make_key(nan1) == sy::cache::make_key(nan2));
  CHECK(sy::cache::make_key(nan1) != sy::cache::make_key(base_input()));

  // Adjacent floats differ: the full bit pattern is hashed, not a rounded value.
  key_input near = base_input();
  near.sampling.top_p = std::nextafter(base_input().sampling.top_p, 1.0f);
  CHECK(sy::cache::make_key(near) != sy::cache::make_key(base_input()));
}

TEST_CASE("prompt_hash depends on the model and prompt tokens only", "[cache_key]") {
  key_input in = base_input();
  std::string h = sy::cache::prompt_hash(in);
  CHECK(h.size() == 64);
  CHECK(is_lower_hex(h));

  key_input other_params = base_input();
  other_params.tenant_namespace = "globex";
  other_params.sampling.temperature = 0.8f;
  other_params.sampling.max_tokens = 7;
  other_params.sampling.stop.clear();
  other_params.endpoint = 0;
  CHECK(sy::cache::prompt_hash(other_params) == h);

  key_input other_model = base_input();
  other_model.model = "smollm2-360m";
  CHECK(sy::cache::prompt_hash(other_model) != h);

  key_input other_prompt = base_input();
  other_prompt.prompt_tokens.push_back(2);
  CHECK(sy::cache::prompt_hash(other_prompt) != h);

  CHECK(h != sy::cache::make_key(in).substr(sy::cache::make_key(in).size() - 64));
}
