// The one sampling-parameters struct (common/sampling_params.hpp): its field list covers every
// field, so the wire and the response-cache key see them all; validate() is the one rule set
// that the router, the protocol decoder and the engine apply.
#include "common/sampling_params.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cache/cache_key.hpp"
#include "common/wire/protocol.hpp"

using sy::sampling_params;

namespace {

// Converts to any field type: T{any_field{}, ...} compiles for at most as many initializers as
// the aggregate T has fields.
struct any_field {
  template <class T>
  operator T() const;
};

template <class T, class... A>
constexpr size_t aggregate_field_count() {
  if constexpr (requires { T{A{}..., any_field{}}; })
    return aggregate_field_count<T, A..., any_field>();
  else
    return sizeof...(A);
}

size_t visited_field_count() {
  size_t n = 0;
  sampling_params p;
  sy::visit_fields(p, [&n](std::string_view, auto&, sy::field_bounds) { ++n; });
  return n;
}

// A value different from `v` and still in range (for the values typical() sets).
void change(float& v) { v = v * 0.5f; }
void change(int32_t& v) { v = v + 1; }
void change(uint64_t& v) { v = v + (uint64_t{1} << 40); }
void change(bool& v) { v = !v; }
void change(std::vector<std::string>& v) { v.push_back("x"); }
void change(std::string& v) { v += "x"; }

// `p` with only its i-th visited field changed; `name` gets that field's name.
sampling_params with_field_changed(sampling_params p, size_t i, std::string& name) {
  size_t at = 0;
  sy::visit_fields(p, [&](std::string_view field, auto& v, sy::field_bounds) {
    if (at++ != i) return;
    change(v);
    name = field;
  });
  return p;
}

// No field at a value that change() leaves in place.
sampling_params typical() {
  return {.temperature = 0.7f,
          .top_k = 40,
          .top_p = 0.9f,
          .min_p = 0.05f,
          .repetition_penalty = 1.1f,
          .seed = 7,
          .has_seed = true,
          .max_tokens = 32,
          .stop = {"\n\n"},
          .logprobs = 2,
          .thinking_budget = 16,
          .thinking_end = "\n</think>\n\n"};
}

std::string key_of(const sampling_params& p) {
  sy::cache::key_input k;
  k.tenant_namespace = "t";
  k.model = "m";
  k.prompt_tokens = {1, 2, 3};
  k.sampling = p;
  return sy::cache::make_key(k);
}

}  // namespace

TEST_CASE("visit_fields visits every field of sampling_params", "[sampling_params]") {
  // Fails when a field is added to the struct but not to visit_fields(): such a field would be
  // neither on the wire nor in the response-cache key.
  STATIC_REQUIRE(aggregate_field_count<sampling_params>() >= 14);  // the counting works (14 in 2026)
  CHECK(visited_field_count() == aggregate_field_count<sampling_params>());
}

TEST_CASE("changing any one sampling field changes the response-cache key", "[sampling_params]") {
  const sampling_params base = typical();
  std::set<std::string> keys = {key_of(base)};
  std::set<std::string> names;
  for (size_t i = 0; i < visited_field_count(); ++i) {
    std::string name;
    const sampling_params p = with_field_changed(base, i, name);
    INFO("field " << name);
    REQUIRE_FALSE(p == base);  // the change took
    CHECK(keys.insert(key_of(p)).second);
    CHECK(names.insert(name).second);
  }
  CHECK(keys.size() == visited_field_count() + 1);
}

TEST_CASE("every sampling field goes over the wire under its visit_fields name", "[sampling_params]") {
  const sampling_params base = typical();
  for (size_t i = 0; i < visited_field_count(); ++i) {
    std::string name;
    sy::proto::submit m;
    m.request_id = "r";
    m.prompt = {1, 2, 3};
    m.sampling = with_field_changed(base, i, name);
    INFO("field " << name);
    const std::string body = sy::proto::encode(m);
    CHECK(body.find(name) != std::string::npos);
    const sy::proto::decode_result r = sy::proto::decode("submit", body);
    REQUIRE(r.get_if<sy::proto::submit>() != nullptr);
    CHECK(r.get_if<sy::proto::submit>()->sampling == m.sampling);
  }
}

TEST_CASE("validate: one rule for every range, top_p = 0 refused", "[sampling_params]") {
  CHECK_FALSE(sy::validate(sampling_params{}).has_value());
  CHECK_FALSE(sy::validate(typical()).has_value());

  struct bad_case {
    const char* field;
    void (*mutate)(sampling_params&);
  };
  const bad_case cases[] = {
      {"temperature", [](sampling_params& p) { p.temperature = -0.1f; }},
      {"temperature", [](sampling_params& p) { p.temperature = std::numeric_limits<float>::infinity(); }},
      {"top_k", [](sampling_params& p) { p.top_k = -1; }},
      // Nucleus sampling over no mass keeps no token: refused everywhere, as the router always did.
      {"top_p", [](sampling_params& p) { p.top_p = 0.f; }},
      {"top_p", [](sampling_params& p) { p.top_p = 1.0001f; }},
      {"top_p", [](sampling_params& p) { p.top_p = std::nanf(""); }},
      {"min_p", [](sampling_params& p) { p.min_p = -0.01f; }},
      {"min_p", [](sampling_params& p) { p.min_p = 1.01f; }},
      {"repetition_penalty", [](sampling_params& p) { p.repetition_penalty = 0.f; }},
      {"repeat_last_n", [](sampling_params& p) { p.repeat_last_n = -1; }},
      {"max_tokens", [](sampling_params& p) { p.max_tokens = 0; }},
      {"stop", [](sampling_params& p) { p.stop.assign(sy::k_max_stop_strings + 1, "s"); }},
      {"stop[1]",
       [](sampling_params& p) {
         p.stop = {"a", ""};
       }},
      {"stop[0]", [](sampling_params& p) { p.stop = {std::string(sy::k_max_stop_bytes + 1, 's')}; }},
      {"logprobs", [](sampling_params& p) { p.logprobs = sy::k_max_top_logprobs + 1; }},
      {"logprobs", [](sampling_params& p) { p.logprobs = -1; }},
      {"thinking_budget", [](sampling_params& p) { p.thinking_budget = -1; }},
      {"thinking_end", [](sampling_params& p) { p.thinking_end = "\n "; }},
      {"thinking_end", [](sampling_params& p) { p.thinking_end = std::string(sy::k_max_stop_bytes + 1, 'e'); }},
  };
  for (const bad_case& c : cases) {
    sampling_params p = typical();
    c.mutate(p);
    const auto e = sy::validate(p);
    INFO("case " << c.field);
    REQUIRE(e.has_value());
    CHECK(e->field == c.field);
    // The decoder refuses the same submit, naming the same field.
    sy::proto::submit m;
    m.request_id = "r";
    m.prompt = {1};
    m.sampling = p;
    const sy::proto::decode_result r = sy::proto::decode("submit", sy::proto::encode(m));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.failure().message, Catch::Contains(std::string("sampling.") + c.field));
  }

  // The edges that are in range.
  sampling_params edge = typical();
  edge.top_p = 1.f;
  edge.min_p = 1.f;
  edge.temperature = 0.f;
  edge.max_tokens = 1;
  edge.logprobs = sy::k_max_top_logprobs;
  edge.stop.assign(sy::k_max_stop_strings, std::string(sy::k_max_stop_bytes, 's'));
  CHECK_FALSE(sy::validate(edge).has_value());
  edge.top_p = std::numeric_limits<float>::denorm_min();
  CHECK_FALSE(sy::validate(edge).has_value());
}

TEST_CASE("draw_of carries the backend sampler's fields", "[sampling_params]") {
  const sampling_params p = typical();
  const sy::sampling_draw d = sy::draw_of(p, 99, 5);
  CHECK(d.temperature == p.temperature);
  CHECK(d.top_k == p.top_k);
  CHECK(d.top_p == p.top_p);
  CHECK(d.min_p == p.min_p);
  CHECK(d.seed == 99);
  CHECK(d.step == 5);
}

TEST_CASE("each choice of a seeded request has its own seed, unrelated to neighbouring seeds") {
  CHECK(sy::choice_seed(7, 0) == 7);  // n = 1 and the first of n agree
  std::set<uint64_t> seen;
  for (uint64_t s = 0; s < 200; ++s)
    for (uint32_t c = 0; c < 4; ++c) seen.insert(sy::choice_seed(s, c));
  CHECK(seen.size() == 200 * 4);  // seed s + 1's first choice is not seed s's second, and so on
  CHECK(sy::choice_seed(7, 1) == sy::choice_seed(7, 1));
  CHECK(sy::choice_seed(7, 1) != sy::choice_seed(8, 1));
}
