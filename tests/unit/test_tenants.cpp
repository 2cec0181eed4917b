// tenant_registry: config parsing and validation, open access, key lookup.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "router/dispatch/tenants.hpp"

using namespace sy::router;

namespace {

const char* const k_good = R"({ "tenants": [
  { "name": "acme", "keys": ["sk-acme-1", "sk-acme-2"], "admin": false,
    "requests_per_s": 5, "burst": 10, "tokens_per_min": 100000, "max_concurrent": 8,
    "priority": {"default": 0, "min": -1, "max": 5} },
  { "name": "ops", "keys": ["sk-ops"], "admin": true } ] })";

// The message of the std::runtime_error parse() throws; fails the test if it does not throw.
std::string parse_error(const std::string& json) {
  try {
    tenant_registry::parse(json);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  FAIL("parse() accepted: " << json);
  return "";
}

// A config holding one tenant whose fields are `fields` (a JSON object body, without braces).
std::string one_tenant(const std::string& fields) { return R"({"tenants": [{)" + fields + "}]}"; }

}  // namespace

TEST_CASE("priority classes: class_of and names", "[tenants]") {
  CHECK(class_of(-5) == priority_class::interactive);
  CHECK(class_of(-1) == priority_class::interactive);
  CHECK(class_of(0) == priority_class::standard);
  CHECK(class_of(1) == priority_class::batch);
  CHECK(class_of(INT32_MAX) == priority_class::batch);
  CHECK(name(priority_class::interactive) == "interactive");
  CHECK(name(priority_class::standard) == "standard");
  CHECK(name(priority_class::batch) == "batch");
}

TEST_CASE("parse: a good config gives tenants with their limits", "[tenants]") {
  tenant_registry r = tenant_registry::parse(k_good);
  CHECK_FALSE(r.is_open());
  REQUIRE(r.tenants().size() == 2);

  const tenant& acme = r.tenants()[0];
  CHECK(acme.name == "acme");
  CHECK(acme.index == 0);
  CHECK_FALSE(acme.admin);
  CHECK(acme.limits.requests_per_s == 5);
  CHECK(acme.limits.burst == 10);
  CHECK(acme.limits.tokens_per_min == 100000);
  CHECK(acme.limits.max_concurrent == 8);
  CHECK(acme.limits.default_priority == 0);
  CHECK(acme.limits.min_priority == -1);
  CHECK(acme.limits.max_priority == 5);

  const tenant& ops = r.tenants()[1];
  CHECK(ops.name == "ops");
  CHECK(ops.index == 1);
  CHECK(ops.admin);
  CHECK(ops.limits.requests_per_s == 0);
  CHECK(ops.limits.tokens_per_min == 0);
  CHECK(ops.limits.max_concurrent == 0);
  CHECK(ops.limits.min_priority == INT32_MIN);
  CHECK(ops.limits.max_priority == INT32_MAX);

  CHECK(r.find("ops") == &ops);
  CHECK(r.find("nobody") == nullptr);
}

TEST_CASE("authenticate: each key maps to its tenant, unknown keys to nullptr", "[tenants]") {
  tenant_registry r = tenant_registry::parse(k_good);
  REQUIRE(r.authenticate("sk-acme-1") != nullptr);
  CHECK(r.authenticate("sk-acme-1")->name == "acme");
  CHECK(r.authenticate("sk-acme-2") == &r.tenants()[0]);
  CHECK(r.authenticate("sk-ops") == &r.tenants()[1]);
  CHECK(r.authenticate("sk-acme-3") == nullptr);
  CHECK(r.authenticate("sk-acme-") == nullptr);
  CHECK(r.authenticate("") == nullptr);
  CHECK(r.authenticate("acme") == nullptr);
}

TEST_CASE("open_access: any key, even none, is the unlimited admin tenant 'default'", "[tenants]") {
  tenant_registry r = tenant_registry::open_access();
  CHECK(r.is_open());
  REQUIRE(r.tenants().size() == 1);
  const tenant* t = r.authenticate("");
  REQUIRE(t != nullptr);
  CHECK(t->name == "default");
  CHECK(t->admin);
  CHECK(t->index == 0);
  CHECK(t->limits.requests_per_s == 0);
  CHECK(t->limits.tokens_per_min == 0);
  CHECK(t->limits.max_concurrent == 0);
  CHECK(r.authenticate("sk-anything") == t);
}

TEST_CASE("parse: structural errors", "[tenants]") {
  CHECK_THAT(parse_error("{not json"), Catch::Contains("JSON"));
  CHECK_THAT(parse_error("[]"), Catch::Contains("tenants"));
  CHECK_THAT(parse_error(R"({"tenants": {}})"), Catch::Contains("'tenants' must be an array"));
  CHECK_THAT(parse_error(R"({"tenants": []})"), Catch::Contains("at least one tenant"));
  CHECK_THAT(parse_error(R"({"tenants": [], "tenant": []})"), Catch::Contains("unknown field 'tenant'"));
  CHECK_THAT(parse_error(R"({"tenants": [42]})"), Catch::Contains("tenants[0]"));
}

TEST_CASE("parse: names must be present, non-empty and unique", "[tenants]") {
  CHECK_THAT(parse_error(one_tenant(R"("keys": ["k"])")), Catch::Contains("'name'"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "", "keys": ["k"])")), Catch::Contains("'name' must not be empty"));
  CHECK_THAT(parse_error(one_tenant(R"("name": 7, "keys": ["k"])")), Catch::Contains("'name' must be a string"));
  std::string dup = R"({"tenants": [{"name": "a", "keys": ["k1"]}, {"name": "a", "keys": ["k2"]}]})";
  CHECK_THAT(parse_error(dup), Catch::Contains("duplicate tenant name") && Catch::Contains("'a'"));
}

TEST_CASE("parse: keys must be non-empty strings, unique across tenants", "[tenants]") {
  CHECK_THAT(parse_error(one_tenant(R"("name": "a")")), Catch::Contains("'keys'"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": [])")), Catch::Contains("non-empty array"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": [""])")), Catch::Contains("non-empty strings"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": [5])")), Catch::Contains("non-empty strings"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": "k")")), Catch::Contains("'keys'"));

  std::string across = R"({"tenants": [{"name": "a", "keys": ["k1"]}, {"name": "b", "keys": ["k2", "k1"]}]})";
  std::string msg = parse_error(across);
  CHECK_THAT(msg, Catch::Contains("duplicated") && Catch::Contains("'a'") && Catch::Contains("'b'"));
  CHECK_THAT(msg, !Catch::Contains("k1"));  // the key itself is never echoed

  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k", "k"])")), Catch::Contains("duplicated"));
}

TEST_CASE("parse: limits must be non-negative numbers of the right type", "[tenants]") {
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "requests_per_s": -1)")),
             Catch::Contains("tenant 'a'") && Catch::Contains("'requests_per_s' must be >= 0"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "burst": -0.5)")),
             Catch::Contains("'burst' must be >= 0"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "burst": "10")")),
             Catch::Contains("'burst' must be a number"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "tokens_per_min": -5)")),
             Catch::Contains("'tokens_per_min'"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "tokens_per_min": 1.5)")),
             Catch::Contains("'tokens_per_min' must be an integer"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "max_concurrent": -1)")),
             Catch::Contains("'max_concurrent'"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "max_concurrent": 3000000000)")),
             Catch::Contains("'max_concurrent'"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "admin": "yes")")), Catch::Contains("'admin'"));
}

TEST_CASE("parse: the default priority must lie within [min, max]", "[tenants]") {
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "priority": {"default": 6, "min": -1, "max": 5})")),
             Catch::Contains("tenant 'a'") && Catch::Contains("default priority 6"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "priority": {"min": 1})")),
             Catch::Contains("default priority 0"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "priority": {"min": 3, "max": 2, "default": 2})")),
             Catch::Contains("'min' must be <= 'max'"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "priority": 1)")),
             Catch::Contains("'priority' must be an object"));

  tenant_registry r =
      tenant_registry::parse(one_tenant(R"("name": "a", "keys": ["k"], "priority": {"default": 2, "min": 1})"));
  CHECK(r.tenants()[0].limits.default_priority == 2);
  CHECK(r.tenants()[0].limits.min_priority == 1);
  CHECK(r.tenants()[0].limits.max_priority == INT32_MAX);
  CHECK(r.tenants()[0].limits.priority_allowed(1));
  CHECK_FALSE(r.tenants()[0].limits.priority_allowed(0));
}

TEST_CASE("priority: a request's priority outside the range is clamped, or kept for a strict tenant to refuse",
          "[tenants]") {
  tenant_registry r = tenant_registry::parse(R"({"tenants": [
      {"name": "a", "keys": ["ka"], "priority": {"default": 2, "min": 0, "max": 5}},
      {"name": "s", "keys": ["ks"], "priority": {"default": 2, "min": 0, "max": 5, "strict": true}}]})");
  const tenant_limits& a = r.tenants()[0].limits;
  const tenant_limits& s = r.tenants()[1].limits;
  CHECK_FALSE(a.priority_strict);
  CHECK(s.priority_strict);
  CHECK(a.effective_priority(-3) == 0);  // more urgent than allowed: the most urgent allowed
  CHECK(a.effective_priority(9) == 5);
  CHECK(a.effective_priority(INT32_MIN) == 0);
  CHECK(a.effective_priority(3) == 3);
  CHECK(s.effective_priority(-3) == -3);  // admission refuses it (403)
  CHECK_FALSE(s.priority_allowed(s.effective_priority(-3)));
  CHECK(tenant_registry::open_access().tenants()[0].limits.effective_priority(-100) == -100);
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "priority": {"strict": 1})")),
             Catch::Contains("tenant 'a' 'priority'") && Catch::Contains("'strict' must be true or false"));
}

TEST_CASE("parse: queue_timeout_s is a tenant's own queue timeout, unset the router's", "[tenants]") {
  tenant_registry r = tenant_registry::parse(R"({"tenants": [
      {"name": "a", "keys": ["ka"], "queue_timeout_s": 2.5}, {"name": "b", "keys": ["kb"], "queue_timeout_s": 0},
      {"name": "c", "keys": ["kc"]}]})");
  CHECK(r.tenants()[0].limits.queue_timeout_s == 2.5);
  CHECK(r.tenants()[1].limits.queue_timeout_s == 0);  // never
  CHECK(r.tenants()[2].limits.queue_timeout_s < 0);   // the router's --queue-timeout-s
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "queue_timeout_s": -1)")),
             Catch::Contains("tenant 'a'") && Catch::Contains("'queue_timeout_s' must be >= 0"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "queue_timeout_s": "5")")),
             Catch::Contains("'queue_timeout_s' must be a number"));
}

TEST_CASE("effective_queue_timeout: a request's own queue timeout only shortens the bound", "[tenants]") {
  tenant_registry r = tenant_registry::parse(R"({"tenants": [
      {"name": "a", "keys": ["ka"], "queue_timeout_s": 2.5}, {"name": "b", "keys": ["kb"], "queue_timeout_s": 0},
      {"name": "c", "keys": ["kc"]}]})");
  const tenant_limits &own = r.tenants()[0].limits, &never = r.tenants()[1].limits, &router = r.tenants()[2].limits;
  CHECK(own.effective_queue_timeout(10, 0) == 2.5);   // nothing asked: the tenant's
  CHECK(own.effective_queue_timeout(10, 1) == 1);     // shorter: the request's
  CHECK(own.effective_queue_timeout(10, 60) == 2.5);  // longer: capped at the tenant's
  CHECK(router.effective_queue_timeout(10, 0) == 10);
  CHECK(router.effective_queue_timeout(10, 3) == 3);
  CHECK(router.effective_queue_timeout(10, 30) == 10);
  CHECK(router.effective_queue_timeout(0, 0) == 0);  // off everywhere
  CHECK(router.effective_queue_timeout(0, 4) == 4);  // no bound: the client may still set one
  CHECK(never.effective_queue_timeout(10, 0) == 0);
  CHECK(never.effective_queue_timeout(10, 4) == 4);
}

TEST_CASE("parse: unknown fields are errors naming the field", "[tenants]") {
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "request_per_s": 5)")),
             Catch::Contains("tenant 'a'") && Catch::Contains("unknown field 'request_per_s'"));
  CHECK_THAT(parse_error(one_tenant(R"("name": "a", "keys": ["k"], "priority": {"defualt": 1})")),
             Catch::Contains("unknown field 'defualt'"));
}

TEST_CASE("load_file: reads a config and names the path on errors", "[tenants]") {
  const std::string missing = "/nonexistent/switchyard-tenants.json";
  try {
    tenant_registry::load_file(missing);
    FAIL("load_file accepted a missing file");
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Catch::Contains(missing));
  }

  char tmpl[] = "/tmp/sy_tenants_XXXXXX";
  int fd = mkstemp(tmpl);
  REQUIRE(fd >= 0);
  close(fd);
  const std::string path = tmpl;
  { std::ofstream(path) << k_good; }
  tenant_registry r = tenant_registry::load_file(path);
  CHECK(r.tenants().size() == 2);
  CHECK(r.authenticate("sk-ops") == &r.tenants()[1]);

  { std::ofstream(path) << one_tenant(R"("name": "a", "keys": ["k"], "burst": -1)"); }
  try {
    tenant_registry::load_file(path);
    FAIL("load_file accepted a bad config");
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("'burst'"));
  }
  std::remove(path.c_str());
}

TEST_CASE("tenants: cache namespaces are per tenant unless a cache_group opts tenants into sharing") {
  const auto r = sy::router::tenant_registry::parse(R"({"tenants": [
    {"name": "a", "keys": ["ka"], "cache_group": "shared", "cache_previews": true},
    {"name": "b", "keys": ["kb"], "cache_group": "shared"},
    {"name": "c", "keys": ["kc"]}]})");
  CHECK(r.tenants()[0].cache_namespace == "g:shared");
  CHECK(r.tenants()[1].cache_namespace == "g:shared");
  CHECK(r.tenants()[2].cache_namespace == "t:c");
  CHECK(r.tenants()[0].cache_previews);
  CHECK_FALSE(r.tenants()[2].cache_previews);
  CHECK_THROWS_WITH(
      sy::router::tenant_registry::parse(R"({"tenants": [{"name": "a", "keys": ["k"], "cache_group": 3}]})"),
      Catch::Contains("cache_group"));
  CHECK(sy::router::tenant_registry::open_access().tenants()[0].cache_namespace == "t:default");
}

TEST_CASE("share_limits_among: N router replicas each enforce 1/N of a tenant's limits, never 0", "[tenants]") {
  tenant_registry r = tenant_registry::parse(R"({"tenants": [
      {"name": "a", "keys": ["ka"], "requests_per_s": 5, "burst": 10, "tokens_per_min": 100001, "max_concurrent": 3},
      {"name": "b", "keys": ["kb"], "requests_per_s": 1, "burst": 1, "max_concurrent": 1},
      {"name": "c", "keys": ["kc"]}]})");
  r.share_limits_among(2);
  const tenant_limits& a = r.find("a")->limits;
  CHECK(a.requests_per_s == Approx(2.5));
  CHECK(a.burst == 5);
  CHECK(a.tokens_per_min == 50001);
  CHECK(a.max_concurrent == 2);
  const tenant_limits& b = r.find("b")->limits;
  CHECK(b.requests_per_s == Approx(0.5));
  CHECK(b.burst == 1);  // never below one request
  CHECK(b.max_concurrent == 1);
  const tenant_limits& c = r.find("c")->limits;  // unlimited stays unlimited
  CHECK(c.requests_per_s == 0);
  CHECK(c.tokens_per_min == 0);
  CHECK(c.max_concurrent == 0);
  tenant_registry same = tenant_registry::parse(R"({"tenants": [{"name": "a", "keys": ["ka"], "requests_per_s": 5}]})");
  same.share_limits_among(1);
  CHECK(same.find("a")->limits.requests_per_s == 5);
}
