#include "cache/cache_stats.hpp"

#include <nlohmann/json.hpp>

namespace sy::cache {

std::string_view name(event_kind k) {
  switch (k) {
    case event_kind::hit:
      return "hit";
    case event_kind::miss:
      return "miss";
    case event_kind::coalesced:
      return "coalesced";
    case event_kind::bypass:
      return "bypass";
  }
  return "unknown";
}

size_t age_bucket(double entry_age_s) {
  if (entry_age_s < 60) return 0;
  if (entry_age_s < 600) return 1;
  if (entry_age_s < 3600) return 2;
  if (entry_age_s < 86400) return 3;
  return 4;
}

double event_counts::hit_rate() const {
  uint64_t n = requests();
  return n ? static_cast<double>(hit) / static_cast<double>(n) : 0.0;
}

double event_counts::served_from_cache_rate() const {
  uint64_t n = requests();
  return n ? static_cast<double>(hit + coalesced) / static_cast<double>(n) : 0.0;
}

void event_counts::add(const event_counts& o) {
  hit += o.hit;
  miss += o.miss;
  coalesced += o.coalesced;
  bypass += o.bypass;
  tokens_saved += o.tokens_saved;
  device_ms_saved += o.device_ms_saved;
}

namespace {

nlohmann::json counts_json(const event_counts& c) {
  return {{"hit", c.hit},
          {"miss", c.miss},
          {"coalesced", c.coalesced},
          {"bypass", c.bypass},
          {"requests", c.requests()},
          {"tokens_saved", c.tokens_saved},
          {"device_s_saved", static_cast<double>(c.device_ms_saved) / 1000.0},
          {"hit_rate", c.hit_rate()},
          {"served_from_cache_rate", c.served_from_cache_rate()}};
}

}  // namespace

std::string to_json(const cache_stats& s) {
  nlohmann::json j;
  j["from"] = s.from_unix_s;
  j["to"] = s.to_unix_s;
  j["complete"] = s.complete;
  if (!s.complete) j["error"] = s.error;
  j["totals"] = counts_json(s.total);
  nlohmann::json series = nlohmann::json::array();
  for (const auto& m : s.series) {
    nlohmann::json p = counts_json(m.counts);
    p["t"] = m.unix_minute * 60;
    series.push_back(std::move(p));
  }
  j["series"] = std::move(series);
  nlohmann::json by_tenant = nlohmann::json::object(), by_model = nlohmann::json::object();
  for (const auto& [k, c] : s.by_tenant) by_tenant[k] = counts_json(c);
  for (const auto& [k, c] : s.by_model) by_model[k] = counts_json(c);
  j["by_tenant"] = std::move(by_tenant);
  j["by_model"] = std::move(by_model);
  nlohmann::json age = nlohmann::json::object();
  for (size_t b = 0; b < k_n_age_buckets; ++b) age[std::string(k_age_bucket_names[b])] = s.hit_age[b];
  j["hit_age"] = std::move(age);
  nlohmann::json top = nlohmann::json::array();
  for (const auto& t : s.top) {
    nlohmann::json e = {{"hash", t.prompt_hash}, {"count", t.count}};
    if (t.preview) e["preview"] = *t.preview;
    top.push_back(std::move(e));
  }
  j["top_prompts"] = std::move(top);
  // Previews are user text: replace invalid UTF-8 rather than throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sy::cache
