// Tenants: who may call the router, and with what limits (docs/router.md). The registry maps
// an API key to a tenant; the limits themselves are enforced by router/dispatch/admission.hpp and the
// priority range by the same.
//
// Config file (JSON, read once at startup; --tenants PATH):
//
//   { "tenants": [ { "name": "acme", "keys": ["sk-acme-1", "sk-acme-2"], "admin": false,
//       "requests_per_s": 5, "burst": 10, "tokens_per_min": 100000, "max_concurrent": 8,
//       "priority": {"default": 0, "min": -1, "max": 5, "strict": false}, "queue_timeout_s": 30 } ] }
//
// Only "name" and "keys" are required; every other field defaults to the tenant_limits default
// (0 = unlimited, any priority allowed, default priority 0). A request's priority outside
// [min, max] is clamped into it (docs/router.md, "Priorities"); "strict": true refuses it (403)
// instead. Validation: at least one tenant;
// names non-empty and unique; keys non-empty strings, at least one per tenant, unique across all
// tenants; numeric limits >= 0; priority.min <= priority.default <= priority.max. Unknown fields
// at any level are errors naming the field (they are usually typos). Every error message names
// the tenant (or its position) and the field.
//
// Without a config the router runs open: any key, or none, is the tenant "default", unlimited and
// admin.
//
// Immutable after construction: safe to read from any thread.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sy::router {

// Request priority classes; a lower number is more urgent (like vLLM's `priority`).
enum class priority_class : uint8_t { interactive = 0, standard = 1, batch = 2 };
inline constexpr size_t k_n_priority_classes = 3;

std::string_view name(priority_class c);  // "interactive", "standard", "batch"
// < 0: interactive, == 0: standard, > 0: batch.
priority_class class_of(int32_t priority);

struct tenant_limits {
  double requests_per_s = 0;     // token bucket refill rate; 0: unlimited
  double burst = 0;              // bucket capacity in requests; 0: max(1, requests_per_s)
  int64_t tokens_per_min = 0;    // prompt + max_tokens, charged at admission; 0: unlimited
  int32_t max_concurrent = 0;    // requests in flight (queued or running); 0: unlimited
  int32_t default_priority = 0;  // used when a request gives none
  int32_t min_priority = INT32_MIN, max_priority = INT32_MAX;  // allowed range for a request's priority
  bool priority_strict = false;  // a priority outside the range is refused (403), not clamped
  // Seconds a request may wait in the router's queue before it ends with 408 queue_timeout
  // (docs/router.md, "Queue timeout"); 0: never; < 0: the router's --queue-timeout-s.
  double queue_timeout_s = -1;

  bool priority_allowed(int32_t p) const { return p >= min_priority && p <= max_priority; }
  // The priority a request asking `p` runs at: `p` clamped into [min, max], or `p` itself for a
  // strict tenant (admission then refuses it when it is outside).
  int32_t effective_priority(int32_t p) const {
    if (priority_strict) return p;
    return p < min_priority ? min_priority : p > max_priority ? max_priority : p;
  }
  // The queue timeout of a request of this tenant that asked `asked_s` ("queue_timeout"; 0: not
  // given) under the router's `router_s` (--queue-timeout-s): the tenant's own, else the
  // router's, and the request's when it is shorter — a client may shorten its wait, never
  // lengthen it. 0: none.
  double effective_queue_timeout(double router_s, double asked_s) const {
    const double bound = queue_timeout_s >= 0 ? queue_timeout_s : router_s;
    if (asked_s > 0 && (bound <= 0 || asked_s < bound)) return asked_s;
    return bound;
  }
};

struct tenant {
  std::string name;
  tenant_limits limits;
  bool admin = false;  // may call admin endpoints (cache stats, dashboard)
  // Response-cache namespace: "t:<name>", or "g:<cache_group>" for tenants an operator opted
  // into sharing entries ("cache_group" in the config). Tenants never see other namespaces.
  std::string cache_namespace;
  bool cache_previews = false;  // "cache_previews": prompt previews may be kept for the dashboard
  size_t index = 0;             // position in tenant_registry::tenants(); stable for the registry's life
};

class tenant_registry {
 public:
  // No keys configured: any key (or none) is tenant "default", unlimited, admin.
  static tenant_registry open_access();
  // Throws std::runtime_error naming the tenant and the bad field.
  static tenant_registry parse(std::string_view json);
  // Throws std::runtime_error naming the path (and, for a bad config, the field).
  static tenant_registry load_file(const std::string& path);

  bool is_open() const { return open_; }
  // nullptr: unknown key. When open: the default tenant for any key, even an empty one.
  // The pointer stays valid for the registry's life (tenants are never added or removed).
  const tenant* authenticate(std::string_view api_key) const;
  // nullptr: no tenant of that name.
  const tenant* find(std::string_view tenant_name) const;
  const std::vector<tenant>& tenants() const { return tenants_; }
  // Every API key with its tenant (start-up checks: docs/operations.md, published keys).
  template <class F>
  void for_each_key(F&& f) const {
    for (const auto& [key, i] : index_by_key_) f(std::string_view(key), tenants_[i]);
  }

  // Limits are enforced by each router process on its own (no shared state between replicas),
  // so with N replicas behind one Service a tenant would get N times its limits. Divides every
  // tenant's requests_per_s, burst, tokens_per_min and max_concurrent by `replicas` (rounded up,
  // never to 0 where a limit was set): a tenant's limits then hold across the fleet when the
  // Service spreads its requests evenly (and are stricter where it does not). 1: unchanged.
  void share_limits_among(int replicas);

 private:
  tenant_registry() = default;

  bool open_ = false;
  std::vector<tenant> tenants_;
  std::unordered_map<std::string, size_t> index_by_key_;  // API key -> index into tenants_
};

}  // namespace sy::router
