#include "router/dispatch/tenants.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

namespace sy::router {

std::string_view name(priority_class c) {
  switch (c) {
    case priority_class::interactive:
      return "interactive";
    case priority_class::standard:
      return "standard";
    case priority_class::batch:
      return "batch";
  }
  return "unknown";
}

priority_class class_of(int32_t priority) {
  if (priority < 0) return priority_class::interactive;
  if (priority == 0) return priority_class::standard;
  return priority_class::batch;
}

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error("tenant config: " + where + ": " + what);
}

// Every key of `obj` must be one of `allowed`.
void check_fields(const json& obj, std::initializer_list<std::string_view> allowed, const std::string& where) {
  for (const auto& [key, value] : obj.items()) {
    bool known = false;
    for (std::string_view a : allowed) known = known || key == a;
    if (!known) fail(where, "unknown field '" + key + "'");
  }
}

double get_non_negative_number(const json& obj, const char* field, const std::string& where) {
  const json& v = obj.at(field);
  if (!v.is_number()) fail(where, std::string("'") + field + "' must be a number");
  double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) fail(where, std::string("'") + field + "' must be >= 0");
  return d;
}

// An integer in [lo, hi]; a number with a fractional part is an error.
int64_t get_integer(const json& obj, const char* field, int64_t lo, int64_t hi, const std::string& where) {
  const json& v = obj.at(field);
  if (!v.is_number_integer()) fail(where, std::string("'") + field + "' must be an integer");
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) fail(where, std::string("'") + field + "' is out of range");
    return static_cast<int64_t>(u);
  }
  int64_t i = v.get<int64_t>();
  if (i < lo || i > hi) {
    fail(where, std::string("'") + field + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return i;
}

tenant parse_tenant(const json& j, size_t index, std::vector<std::string>& keys_out) {
  std::string where = "tenants[" + std::to_string(index) + "]";
  if (!j.is_object()) fail(where, "must be an object");
  tenant t;
  t.index = index;
  if (!j.contains("name") || !j["name"].is_string()) fail(where, "'name' must be a string");
  t.name = j["name"].get<std::string>();
  if (t.name.empty()) fail(where, "'name' must not be empty");
  where = "tenant '" + t.name + "'";
  check_fields(j,
               {"name", "keys", "admin", "requests_per_s", "burst", "tokens_per_min", "max_concurrent", "priority",
                "cache_group", "cache_previews", "queue_timeout_s"},
               where);

  if (!j.contains("keys") || !j["keys"].is_array() || j["keys"].empty()) {
    fail(where, "'keys' must be a non-empty array of strings");
  }
  for (const json& k : j["keys"]) {
    if (!k.is_string() || k.get_ref<const std::string&>().empty()) fail(where, "'keys' must hold non-empty strings");
    keys_out.push_back(k.get<std::string>());
  }

  if (j.contains("cache_group")) {
    if (!j["cache_group"].is_string() || j["cache_group"].get<std::string>().empty())
      fail(where, "'cache_group' must be a non-empty string");
    t.cache_namespace = "g:" + j["cache_group"].get<std::string>();
  }
  if (j.contains("cache_previews")) {
    if (!j["cache_previews"].is_boolean()) fail(where, "'cache_previews' must be true or false");
    t.cache_previews = j["cache_previews"].get<bool>();
  }
  if (j.contains("admin")) {
    if (!j["admin"].is_boolean()) fail(where, "'admin' must be true or false");
    t.admin = j["admin"].get<bool>();
  }
  tenant_limits& l = t.limits;
  if (j.contains("requests_per_s")) l.requests_per_s = get_non_negative_number(j, "requests_per_s", where);
  if (j.contains("burst")) l.burst = get_non_negative_number(j, "burst", where);
  if (j.contains("tokens_per_min")) {
    l.tokens_per_min = get_integer(j, "tokens_per_min", 0, std::numeric_limits<int64_t>::max(), where);
  }
  if (j.contains("max_concurrent")) {
    l.max_concurrent =
        static_cast<int32_t>(get_integer(j, "max_concurrent", 0, std::numeric_limits<int32_t>::max(), where));
  }
  if (j.contains("queue_timeout_s")) l.queue_timeout_s = get_non_negative_number(j, "queue_timeout_s", where);
  if (j.contains("priority")) {
    const json& p = j["priority"];
    std::string pwhere = where + " 'priority'";
    if (!p.is_object()) fail(where, "'priority' must be an object");
    check_fields(p, {"default", "min", "max", "strict"}, pwhere);
    constexpr int64_t lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
    if (p.contains("default")) l.default_priority = static_cast<int32_t>(get_integer(p, "default", lo, hi, pwhere));
    if (p.contains("min")) l.min_priority = static_cast<int32_t>(get_integer(p, "min", lo, hi, pwhere));
    if (p.contains("max")) l.max_priority = static_cast<int32_t>(get_integer(p, "max", lo, hi, pwhere));
    if (l.min_priority > l.max_priority) fail(pwhere, "'min' must be <= 'max'");
    if (p.contains("strict")) {
      if (!p["strict"].is_boolean()) fail(pwhere, "'strict' must be true or false");
      l.priority_strict = p["strict"].get<bool>();
    }
  }
  if (!l.priority_allowed(l.default_priority)) {
    fail(where, "default priority " + std::to_string(l.default_priority) + " is outside [" +
                    std::to_string(l.min_priority) + ", " + std::to_string(l.max_priority) + "]");
  }
  return t;
}

}  // namespace

void tenant_registry::share_limits_among(int replicas) {
  if (replicas <= 1) return;
  const double n = replicas;
  for (tenant& t : tenants_) {
    tenant_limits& l = t.limits;
    if (l.requests_per_s > 0) l.requests_per_s /= n;
    // An explicit burst is divided too, but never below one request; an unset one follows the
    // divided rate (admission: max(1, requests_per_s)).
    if (l.burst > 0) l.burst = std::max(1.0, std::ceil(l.burst / n));
    if (l.tokens_per_min > 0) l.tokens_per_min = (l.tokens_per_min + replicas - 1) / replicas;
    if (l.max_concurrent > 0) l.max_concurrent = (l.max_concurrent + replicas - 1) / replicas;
  }
}

tenant_registry tenant_registry::open_access() {
  tenant_registry r;
  r.open_ = true;
  tenant t;
  t.name = "default";
  t.cache_namespace = "t:default";
  t.admin = true;
  t.index = 0;
  r.tenants_.push_back(std::move(t));
  return r;
}

tenant_registry tenant_registry::parse(std::string_view text) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    fail("JSON", e.what());
  }
  if (!doc.is_object()) fail("top level", "must be an object with a 'tenants' array");
  check_fields(doc, {"tenants"}, "top level");
  if (!doc.contains("tenants") || !doc["tenants"].is_array()) fail("top level", "'tenants' must be an array");
  const json& list = doc["tenants"];
  if (list.empty()) fail("'tenants'", "at least one tenant is required");

  tenant_registry r;
  std::unordered_set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    std::vector<std::string> keys;
    tenant t = parse_tenant(list[i], i, keys);
    if (!names.insert(t.name).second) fail("tenant '" + t.name + "'", "duplicate tenant name");
    if (t.cache_namespace.empty()) t.cache_namespace = "t:" + t.name;
    for (std::string& k : keys) {
      auto [it, inserted] = r.index_by_key_.emplace(std::move(k), i);
      if (!inserted) {
        // Never echo the key itself into logs; name the tenants that share it.
        fail("tenant '" + t.name + "'", "an API key is duplicated (also used by tenant '" +
                                            (it->second == i ? t.name : r.tenants_[it->second].name) + "')");
      }
    }
    r.tenants_.push_back(std::move(t));
  }
  return r;
}

tenant_registry tenant_registry::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("tenant config '" + path + "': cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("tenant config '" + path + "': read error");
  try {
    return parse(text.str());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("'" + path + "': " + e.what());
  }
}

const tenant* tenant_registry::authenticate(std::string_view api_key) const {
  if (open_) return &tenants_.front();
  // The hash lookup may exit early on a mismatch; key strings are high-entropy, so the timing
  // reveals nothing useful about a valid key.
  auto it = index_by_key_.find(std::string(api_key));
  return it == index_by_key_.end() ? nullptr : &tenants_[it->second];
}

const tenant* tenant_registry::find(std::string_view tenant_name) const {
  for (const tenant& t : tenants_) {
    if (t.name == tenant_name) return &t;
  }
  return nullptr;
}

}  // namespace sy::router
