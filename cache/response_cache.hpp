// The response cache's policy and storage over one redis_client (docs/cache.md):
// which requests may be cached, GET/SET of encoded responses, and the shared analytics.
//
// Redis layout (all keys prefixed sy:v1:):
//   r:<namespace>:<sha256>   string  encoded stored_response (stored_response.hpp), EX policy.ttl
//   stats:<unix_minute>      hash    "<event>|<tenant>|<model>" -> count,
//                                    "tokens_saved|<tenant>|<model>", "device_ms_saved|<tenant>|<model>",
//                                    "hit_age|<bucket>" -> count; EX analytics.stats_ttl
//   top:<unix_hour>          zset    prompt_hash -> cacheable requests that hour; EX stats_ttl
//   preview                  hash    prompt_hash -> first preview_max_bytes of the prompt text,
//                                    only for tenants in analytics.preview_tenants; the key's
//                                    EXPIRE is refreshed on each write, so it grows with the number
//                                    of distinct previewed prompts while previews keep coming
// '|' and '%' in tenant and model names are percent-escaped in hash fields.
//
// Threads: like its redis_client, a response_cache belongs to one thread and blocks for up to the
// client's command timeout per call. Every call degrades instead of failing: with Redis slow,
// down or the breaker open, lookup reports error / short_circuited, store returns false and record
// drops the event — each counted.
#pragma once

#include "cache/cache_stats.hpp"
#include "cache/redis_client.hpp"
#include "cache/stored_response.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace sy::cache {

struct cache_policy {
  bool enabled = true;
  std::chrono::seconds ttl{3600};
  size_t max_entry_bytes = 1 << 20;   // encoded size; larger entries are not stored
  bool cache_seeded_sampling = true;  // cache temperature > 0 requests that carry an explicit seed
  // HMAC-SHA256 key sealing every entry (cache/entry_mac.hpp); empty: entries carry only their
  // checksum, and anyone who can write Redis can answer for any tenant.
  std::string mac_key;
};

// temperature == 0, or an explicit seed when policy.cache_seeded_sampling; never when the
// request opted out (Cache-Control: no-store / no-cache or the body field) or caching is off.
bool cacheable(float temperature, bool has_seed, bool no_store_requested, const cache_policy& policy);

struct analytics_config {
  bool enabled = true;
  std::chrono::seconds stats_ttl{8 * 24 * 3600};
  std::set<std::string, std::less<>> preview_tenants;  // tenants whose prompt previews may be kept
  size_t preview_max_bytes = 200;                      // cut at a UTF-8 character boundary
};

enum class lookup_status : uint8_t {
  hit,
  miss,
  error,            // Redis error or timeout (the request goes to a worker)
  bypassed,         // caching disabled by policy; Redis not asked
  short_circuited,  // breaker open; Redis not asked
  corrupt,          // an entry exists but does not decode (treated as a miss; a store replaces it)
  expired,          // waited in the router's queue past its budget; Redis not asked (served live)
};
inline constexpr size_t k_n_lookup_statuses = 7;
std::string_view name(lookup_status s);

// Counts since construction.
struct response_cache_counters {
  uint64_t lookups = 0, hits = 0, misses = 0, lookup_errors = 0, short_circuited = 0, bypassed = 0, corrupt = 0;
  uint64_t stores = 0, store_errors = 0, store_refused_too_large = 0, store_refused_incomplete = 0;
  uint64_t records = 0, records_dropped = 0;  // analytics events written / lost to Redis errors
  uint64_t queries = 0, queries_failed = 0;
};

class response_cache {
 public:
  using unix_clock_fn = std::function<int64_t()>;  // wall clock, unix seconds

  // Does not connect. `unix_now` dates entries and analytics (tests inject a fixed time);
  // `steady` drives the client's breaker.
  response_cache(redis_config redis, cache_policy policy, analytics_config analytics = {}, unix_clock_fn unix_now = {},
                 redis_client::clock_fn steady = {});

  // GET key. The status (when st is non-null) says why nothing came back. A hit's age is
  // now_unix_s() - created_unix_s.
  std::optional<stored_response> lookup(const std::string& key, lookup_status* st);

  // SET key value EX ttl. False, without touching Redis, when caching is disabled, the response
  // has no choices or an unfinished one (empty finish_reason), or it encodes to more than
  // max_entry_bytes; false on a Redis error. created_unix_s == 0 is stamped with now_unix_s().
  bool store(const std::string& key, const stored_response& response);

  // One analytics event in one pipeline (see the layout above). prompt_hash may be empty (then
  // no top-K entry); preview is kept only for tenants in analytics.preview_tenants.
  // tokens_saved / device_s_saved are added as given (the router passes 0 for misses and bypasses);
  // entry_age_s is used for hits only.
  void record(event_kind kind, std::string_view tenant, std::string_view model, uint32_t tokens_saved,
              double device_s_saved, double entry_age_s, const std::string& prompt_hash, const std::string* preview);

  // Analytics for [from_unix_s, to_unix_s] (inclusive, clamped to the last stats_ttl) with the
  // top_k most repeated prompts. Meant for an admin endpoint: it reads one hash per minute, so give
  // it a client with a roomier command_timeout than the lookup path's.
  cache_stats query(int64_t from_unix_s, int64_t to_unix_s, size_t top_k);

  int64_t now_unix_s() const { return unix_now_(); }
  const cache_policy& policy() const { return policy_; }
  const analytics_config& analytics() const { return analytics_; }
  const response_cache_counters& counters() const { return counters_; }
  redis_client& client() { return client_; }
  const redis_client& client() const { return client_; }

 private:
  redis_client client_;
  cache_policy policy_;
  analytics_config analytics_;
  unix_clock_fn unix_now_;
  response_cache_counters counters_;
  uint64_t query_seq_ = 0;  // makes temporary key names unique per query
};

}  // namespace sy::cache
