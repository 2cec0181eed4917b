#include "cache/response_cache.hpp"

#include "cache/entry_mac.hpp"
#include "cache/percent_escape.hpp"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>

namespace sy::cache {
namespace {

constexpr std::string_view k_stats_prefix = "sy:v1:stats:";
constexpr std::string_view k_top_prefix = "sy:v1:top:";
constexpr std::string_view k_preview_key = "sy:v1:preview";
constexpr size_t k_query_batch = 512;  // HGETALLs per pipeline round trip in query()

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

int64_t system_unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

// Longest prefix of at most max_bytes that does not split a UTF-8 sequence.
std::string_view utf8_prefix(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut);
}

bool parse_u64(std::string_view s, uint64_t* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

// Adds one "<field> -> <value>" pair of a minute hash to the minute's counts and the totals.
void accumulate(cache_stats& s, minute_stats& m, std::string_view field, std::string_view value) {
  uint64_t v = 0;
  if (!parse_u64(value, &v)) return;
  size_t bar1 = field.find('|');
  if (bar1 == std::string_view::npos) return;
  std::string_view what = field.substr(0, bar1), rest = field.substr(bar1 + 1);
  if (what == "hit_age") {
    for (size_t b = 0; b < k_n_age_buckets; ++b)
      if (rest == k_age_bucket_names[b]) s.hit_age[b] += v;
    return;
  }
  size_t bar2 = rest.find('|');
  if (bar2 == std::string_view::npos) return;
  event_counts delta;
  if (what == "hit")
    delta.hit = v;
  else if (what == "miss")
    delta.miss = v;
  else if (what == "coalesced")
    delta.coalesced = v;
  else if (what == "bypass")
    delta.bypass = v;
  else if (what == "tokens_saved")
    delta.tokens_saved = v;
  else if (what == "device_ms_saved")
    delta.device_ms_saved = v;
  else
    return;  // a field from a newer version: ignore
  m.counts.add(delta);
  s.total.add(delta);
  s.by_tenant[percent_unescape(rest.substr(0, bar2))].add(delta);
  s.by_model[percent_unescape(rest.substr(bar2 + 1))].add(delta);
}

std::string random_instance_id() {
  std::random_device rd;
  uint64_t v = (uint64_t(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

bool cacheable(float temperature, bool has_seed, bool no_store_requested, const cache_policy& policy) {
  if (!policy.enabled || no_store_requested) return false;
  return temperature == 0.0f || (has_seed && policy.cache_seeded_sampling);
}

std::string_view name(lookup_status s) {
  switch (s) {
    case lookup_status::hit:
      return "hit";
    case lookup_status::miss:
      return "miss";
    case lookup_status::error:
      return "error";
    case lookup_status::bypassed:
      return "bypassed";
    case lookup_status::short_circuited:
      return "short_circuited";
    case lookup_status::corrupt:
      return "corrupt";
    case lookup_status::expired:
      return "expired";
  }
  return "unknown";
}

response_cache::response_cache(redis_config redis, cache_policy policy, analytics_config analytics,
                               unix_clock_fn unix_now, redis_client::clock_fn steady)
    : client_(std::move(redis), std::move(steady)),
      policy_(policy),
      analytics_(std::move(analytics)),
      unix_now_(unix_now ? std::move(unix_now) : unix_clock_fn(system_unix_now)) {
  assert(policy_.ttl.count() >= 1);
}

std::optional<stored_response> response_cache::lookup(const std::string& key, lookup_status* st) {
  auto done = [&](lookup_status s, uint64_t& counter) {
    ++counter;
    if (st) *st = s;
  };
  ++counters_.lookups;
  if (!policy_.enabled) {
    done(lookup_status::bypassed, counters_.bypassed);
    return std::nullopt;
  }
  result<redis_reply> r = client_.command({"GET", key});
  if (!r) {
    if (r.error().code == redis_errc::short_circuited)
      done(lookup_status::short_circuited, counters_.short_circuited);
    else
      done(lookup_status::error, counters_.lookup_errors);
    return std::nullopt;
  }
  if (r->is_nil()) {
    done(lookup_status::miss, counters_.misses);
    return std::nullopt;
  }
  // WRONGTYPE: the key holds something that is not ours — as corrupt as undecodable bytes. Any
  // other error reply (NOAUTH, LOADING, MISCONF...) is Redis refusing service.
  if (r->is_error() && !r->str.starts_with("WRONGTYPE")) {
    done(lookup_status::error, counters_.lookup_errors);
    return std::nullopt;
  }
  std::optional<stored_response> out;
  if (r->type == redis_reply::kind::string) {
    if (policy_.mac_key.empty()) {
      out = decode(r->str);
    } else if (auto body = unseal(policy_.mac_key, key, r->str)) {  // forged or moved: a miss
      out = decode(*body);
    }
  }
  if (!out) {
    done(lookup_status::corrupt, counters_.corrupt);
    return std::nullopt;
  }
  done(lookup_status::hit, counters_.hits);
  return out;
}

bool response_cache::store(const std::string& key, const stored_response& response) {
  if (!policy_.enabled) return false;
  bool finished = !response.choices.empty() &&
                  std::none_of(response.choices.begin(), response.choices.end(),
                               [](const stored_response::choice& c) { return c.finish_reason == finish_reason::none; });
  if (!finished) {
    ++counters_.store_refused_incomplete;
    return false;
  }
  std::string value;
  if (response.created_unix_s == 0) {
    stored_response stamped = response;
    stamped.created_unix_s = now_unix_s();
    value = encode(stamped);
  } else {
    value = encode(response);
  }
  if (value.size() > policy_.max_entry_bytes) {
    ++counters_.store_refused_too_large;
    return false;
  }
  if (!policy_.mac_key.empty()) value = seal(policy_.mac_key, key, std::move(value));
  std::string ttl = std::to_string(policy_.ttl.count());
  result<redis_reply> r = client_.command({"SET", key, value, "EX", ttl});
  if (!r || r->type != redis_reply::kind::status || r->str != "OK") {
    ++counters_.store_errors;
    return false;
  }
  ++counters_.stores;
  return true;
}

void response_cache::record(event_kind kind, std::string_view tenant, std::string_view model, uint32_t tokens_saved,
                            double device_s_saved, double entry_age_s, const std::string& prompt_hash,
                            const std::string* preview) {
  if (!analytics_.enabled) return;
  int64_t now = now_unix_s();
  std::string stats_key = std::string(k_stats_prefix) + std::to_string(floor_div(now, 60));
  // Tenant and model names go into '|'-separated hash fields.
  std::string suffix = "|" + percent_escape(tenant, '|') + "|" + percent_escape(model, '|');
  std::string ttl = std::to_string(analytics_.stats_ttl.count());

  std::vector<std::vector<std::string>> cmds;
  cmds.reserve(9);
  cmds.push_back({"HINCRBY", stats_key, std::string(name(kind)) + suffix, "1"});
  if (tokens_saved > 0) cmds.push_back({"HINCRBY", stats_key, "tokens_saved" + suffix, std::to_string(tokens_saved)});
  long long device_ms = std::isfinite(device_s_saved) ? std::llround(device_s_saved * 1000.0) : 0;
  if (device_ms > 0) cmds.push_back({"HINCRBY", stats_key, "device_ms_saved" + suffix, std::to_string(device_ms)});
  if (kind == event_kind::hit)
    cmds.push_back({"HINCRBY", stats_key, "hit_age|" + std::string(k_age_bucket_names[age_bucket(entry_age_s)]), "1"});
  cmds.push_back({"EXPIRE", stats_key, ttl});
  if (kind != event_kind::bypass && !prompt_hash.empty()) {
    std::string top_key = std::string(k_top_prefix) + std::to_string(floor_div(now, 3600));
    cmds.push_back({"ZINCRBY", top_key, "1", prompt_hash});
    cmds.push_back({"EXPIRE", top_key, ttl});
    if (preview && !preview->empty() && analytics_.preview_tenants.contains(tenant)) {
      cmds.push_back({"HSET", std::string(k_preview_key), prompt_hash,
                      std::string(utf8_prefix(*preview, analytics_.preview_max_bytes))});
      cmds.push_back({"EXPIRE", std::string(k_preview_key), ttl});
    }
  }
  result<std::vector<redis_reply>> r = client_.pipeline(cmds);
  bool ok = r && std::none_of(r->begin(), r->end(), [](const redis_reply& x) { return x.is_error(); });
  ++(ok ? counters_.records : counters_.records_dropped);
}

cache_stats response_cache::query(int64_t from_unix_s, int64_t to_unix_s, size_t top_k) {
  ++counters_.queries;
  cache_stats s;
  from_unix_s = std::max(from_unix_s, to_unix_s - static_cast<int64_t>(analytics_.stats_ttl.count()));
  s.from_unix_s = from_unix_s;
  s.to_unix_s = to_unix_s;
  if (to_unix_s < from_unix_s) return s;
  auto fail = [&](const redis_error& e) {
    ++counters_.queries_failed;
    s.complete = false;
    s.error = std::string(name(e.code)) + ": " + e.message;
    return s;
  };

  // Per-minute hashes, in batches of pipelined HGETALLs.
  int64_t m0 = floor_div(from_unix_s, 60), m1 = floor_div(to_unix_s, 60);
  s.series.resize(static_cast<size_t>(m1 - m0 + 1));
  for (int64_t m = m0; m <= m1; ++m) s.series[static_cast<size_t>(m - m0)].unix_minute = m;
  for (int64_t batch = m0; batch <= m1; batch += k_query_batch) {
    int64_t end = std::min<int64_t>(m1, batch + k_query_batch - 1);
    std::vector<std::vector<std::string>> cmds;
    for (int64_t m = batch; m <= end; ++m) cmds.push_back({"HGETALL", std::string(k_stats_prefix) + std::to_string(m)});
    auto r = client_.pipeline(cmds);
    if (!r) return fail(r.error());
    for (size_t i = 0; i < r->size(); ++i) {
      const redis_reply& h = (*r)[i];
      minute_stats& m = s.series[static_cast<size_t>(batch - m0) + i];
      for (size_t f = 0; f + 1 < h.elements.size(); f += 2) accumulate(s, m, h.elements[f].str, h.elements[f + 1].str);
    }
  }
  if (top_k == 0) return s;

  // Top prompts: sum the hourly sorted sets server-side into a temporary key.
  int64_t h0 = floor_div(from_unix_s, 3600), h1 = floor_div(to_unix_s, 3600);
  static const std::string instance_id = random_instance_id();
  std::string tmp = "sy:v1:tmp:top:" + instance_id + ":" + std::to_string(++query_seq_);
  std::vector<std::string> zunion = {"ZUNIONSTORE", tmp, std::to_string(h1 - h0 + 1)};
  for (int64_t h = h0; h <= h1; ++h) zunion.push_back(std::string(k_top_prefix) + std::to_string(h));
  std::vector<std::vector<std::string>> cmds = {std::move(zunion),
                                                {"EXPIRE", tmp, "60"},  // in case the DEL never arrives
                                                {"ZREVRANGE", tmp, "0", std::to_string(top_k - 1), "WITHSCORES"},
                                                {"DEL", tmp}};
  auto r = client_.pipeline(cmds);
  if (!r) return fail(r.error());
  const redis_reply& range = (*r)[2];
  for (size_t i = 0; i + 1 < range.elements.size(); i += 2) {
    double score = 0;
    const std::string& sc = range.elements[i + 1].str;
    auto [p, ec] = std::from_chars(sc.data(), sc.data() + sc.size(), score);
    (void)p;
    s.top.push_back({range.elements[i].str, ec == std::errc() ? static_cast<uint64_t>(std::llround(score)) : 0, {}});
  }
  if (s.top.empty()) return s;

  std::vector<std::string> hmget = {"HMGET", std::string(k_preview_key)};
  for (const auto& t : s.top) hmget.push_back(t.prompt_hash);
  auto previews = client_.command(hmget);
  if (!previews) return fail(previews.error());
  for (size_t i = 0; i < previews->elements.size() && i < s.top.size(); ++i)
    if (previews->elements[i].type == redis_reply::kind::string) s.top[i].preview = previews->elements[i].str;
  return s;
}

}  // namespace sy::cache
