#include "router/fleet/worker_pool.hpp"

#include <algorithm>
#include <cassert>
#include <limits>

#include "common/metrics.hpp"

namespace sy::router {

std::string_view name(worker_state s) {
  switch (s) {
    case worker_state::connecting:
      return "connecting";
    case worker_state::ready:
      return "ready";
    case worker_state::draining:
      return "draining";
    case worker_state::retired:
      return "retired";
    case worker_state::dead:
      return "dead";
    case worker_state::ejected:
      return "ejected";
  }
  return "unknown";
}

worker_view& worker_pool::get(worker_ref w) {
  auto it = workers_.find(w);
  assert(it != workers_.end() && "unknown worker ref");
  return it->second;
}

const worker_view* worker_pool::find(worker_ref w) const {
  auto it = workers_.find(w);
  return it == workers_.end() ? nullptr : &it->second;
}

const worker_view& worker_pool::at(worker_ref w) const {
  const worker_view* v = find(w);
  assert(v && "unknown worker ref");
  return *v;
}

void worker_pool::update_state(worker_view& v) {
  worker_state s = worker_state::ready;
  if (v.liveness == worker_liveness::dead)
    s = worker_state::dead;
  else if (!v.listed)
    s = worker_state::retired;
  else if (v.liveness == worker_liveness::connecting)
    s = worker_state::connecting;
  else if (v.ejected_until_s > 0)
    s = worker_state::ejected;
  else if (v.load.draining)
    s = worker_state::draining;
  if (s == v.state) return;
  changes_.push_back({v.ref, v.endpoint, v.state, s});
  v.state = s;
}

worker_pool::added worker_pool::add(const std::string& endpoint) {
  for (auto& [ref, v] : workers_) {
    if (v.endpoint == endpoint) {
      v.listed = true;
      update_state(v);
      return {ref, false};
    }
  }
  const worker_ref ref = next_ref_++;
  worker_view& v = workers_[ref];
  v.ref = ref;
  v.endpoint = endpoint;
  views_[ref];
  changes_.push_back({ref, endpoint, std::nullopt, v.state});
  return {ref, true};
}

bool worker_pool::retire(const std::string& endpoint) {
  for (auto& [ref, v] : workers_) {
    if (v.endpoint == endpoint) {
      v.listed = false;
      update_state(v);
      return true;
    }
  }
  return false;
}

bool worker_pool::on_welcome(worker_ref w, proto::welcome info, double now_s) {
  worker_view& v = get(w);
  const bool became_up = v.liveness != worker_liveness::up;
  if (became_up || v.info.worker_id != info.worker_id) {
    // A (re)started worker has an empty prefix cache, runs nothing of ours and is not draining.
    views_[w].view.clear();
    v.in_flight = 0;
    v.load = {};
  }
  if (v.info.worker_id != info.worker_id) {  // a new process: its predecessor's failures are not its own
    v.consecutive_failures = 0;
    v.ejections_in_a_row = 0;
    v.ejected_until_s = 0;
    v.last_failure = 0;
  }
  info.tokenizer = {};
  v.info = std::move(info);
  views_[w].view.set_capacity(v.info.kv_block_size ? v.info.kv_capacity_tokens / v.info.kv_block_size : 0);
  v.liveness = worker_liveness::up;
  v.last_seen_s = now_s;
  update_state(v);
  return became_up;
}

void worker_pool::on_heartbeat(worker_ref w, const proto::heartbeat& hb, double now_s) {
  worker_view& v = get(w);
  v.load = hb;
  if (v.liveness == worker_liveness::up) v.last_seen_s = now_s;
  if (v.liveness == worker_liveness::up && v.info.kv_events) views_[w].view.check_last_seq(hb.kv_seq, kv_counters_);
  update_state(v);
}

void worker_pool::mark_draining(worker_ref w) {
  worker_view& v = get(w);
  v.load.draining = true;
  update_state(v);
}

bool worker_pool::on_request_failed(worker_ref w, double now_s) {
  worker_view& v = get(w);
  v.consecutive_failures++;
  if (cfg_.eject_after_failures <= 0 || v.consecutive_failures < cfg_.eject_after_failures) return false;
  if (v.state != worker_state::ready && v.state != worker_state::draining) return false;  // out already
  size_t live = 0, ejected = 0;
  for (const auto& [ref, o] : workers_) {
    if (o.info.model_id != v.info.model_id || o.liveness != worker_liveness::up || !o.listed) continue;
    live++;
    ejected += o.state == worker_state::ejected;
  }
  if ((ejected + 1) * 100 > live * static_cast<size_t>(std::max(0, cfg_.max_ejected_percent))) return false;
  v.ejections_in_a_row++;
  v.ejections++;
  ejections_total_++;
  v.ejected_until_s = now_s + std::min(cfg_.eject_max_s, cfg_.eject_base_s * v.ejections_in_a_row);
  v.consecutive_failures = 0;
  update_state(v);
  return true;
}

bool worker_pool::new_failure(worker_ref w, uint64_t failure) {
  if (failure == 0) return true;
  worker_view& v = get(w);
  if (v.last_failure == failure) return false;
  v.last_failure = failure;
  return true;
}

void worker_pool::on_request_succeeded(worker_ref w) {
  auto it = workers_.find(w);
  if (it == workers_.end()) return;
  it->second.consecutive_failures = 0;
  if (it->second.ejected_until_s == 0) it->second.ejections_in_a_row = 0;  // healthy again: next ejection is short
}

std::vector<worker_ref> worker_pool::readmit(double now_s) {
  std::vector<worker_ref> back;
  for (auto& [ref, v] : workers_) {
    if (v.ejected_until_s > 0 && now_s >= v.ejected_until_s) {
      v.ejected_until_s = 0;
      update_state(v);
      back.push_back(ref);
    }
  }
  return back;
}

std::vector<worker_ref> worker_pool::check_liveness(double now_s) {
  std::vector<worker_ref> died;
  for (auto& [ref, v] : workers_) {
    if (v.liveness == worker_liveness::up && silent(v, now_s)) {
      v.liveness = worker_liveness::dead;
      v.dead_since_s = now_s;
      v.in_flight = 0;
      update_state(v);
      died.push_back(ref);
    }
  }
  return died;
}

void worker_pool::forgive_silence(double stalled_s, double now_s) {
  for (auto& [ref, v] : workers_)
    if (v.liveness == worker_liveness::up) v.last_seen_s = std::min(now_s, v.last_seen_s + stalled_s);
}

bool worker_pool::serves(const std::string& model) const {
  return std::any_of(workers_.begin(), workers_.end(), [&](const auto& kv) {
    const worker_view& v = kv.second;
    return v.info.model_id == model && (v.state == worker_state::ready || v.state == worker_state::ejected);
  });
}

bool worker_pool::any_ready(double now_s) const {
  return std::any_of(workers_.begin(), workers_.end(), [&](const auto& kv) {
    return kv.second.state == worker_state::ready && !silent(kv.second, now_s);
  });
}

std::vector<worker_ref> worker_pool::removable(double now_s) const {
  std::vector<worker_ref> out;
  for (const auto& [ref, v] : workers_) {
    const bool drained = !v.listed && v.in_flight == 0;
    const bool long_dead = v.liveness == worker_liveness::dead && now_s - v.dead_since_s >= cfg_.dead_grace_s;
    if (drained || long_dead) out.push_back(ref);
  }
  return out;
}

void worker_pool::remove(worker_ref w) {
  auto it = workers_.find(w);
  if (it == workers_.end()) return;
  changes_.push_back({w, it->second.endpoint, it->second.state, std::nullopt});
  workers_.erase(it);
  views_.erase(w);
}

std::vector<worker_change> worker_pool::take_changes() {
  std::vector<worker_change> out;
  out.swap(changes_);
  return out;
}

size_t worker_pool::count(worker_state s) const {
  size_t n = 0;
  for (const auto& [ref, v] : workers_) n += v.state == s;
  return n;
}

bool worker_pool::has_slot(const worker_view& v) const {
  return v.state == worker_state::ready && v.in_flight < static_cast<int32_t>(v.info.max_running) + cfg_.local_queue;
}

size_t worker_pool::cached_blocks(worker_ref w, std::span<const uint64_t> block_hashes) const {
  auto it = views_.find(w);
  return it == views_.end() ? 0 : it->second.view.leading(block_hashes);
}

const kv_view* worker_pool::kv_view_of(worker_ref w) const {
  auto it = views_.find(w);
  return it == views_.end() ? nullptr : &it->second.view;
}

void worker_pool::on_kv_events(worker_ref w, const proto::kv_events& m) {
  const worker_view* v = find(w);
  if (!v || v->liveness != worker_liveness::up || (!m.model_id.empty() && m.model_id != v->info.model_id)) {
    kv_counters_.ignored++;
    return;
  }
  views_[w].view.apply(m, kv_counters_);
}

std::vector<worker_ref> worker_pool::kv_resyncs_due(double now_s) {
  std::vector<worker_ref> due;
  for (auto& [ref, k] : views_) {
    const worker_view* v = find(ref);
    if (!v || v->liveness != worker_liveness::up || !k.view.wants_snapshot()) continue;
    if (now_s - k.resync_asked_s < cfg_.kv_resync_interval_s) continue;
    k.resync_asked_s = now_s;
    kv_resyncs_++;
    due.push_back(ref);
  }
  return due;
}

void worker_pool::expire_kv_hints(double now_s) {
  for (auto& [ref, k] : views_) {
    const worker_view* v = find(ref);
    if (v && v->info.kv_events) k.view.expire_hints(now_s, cfg_.kv_hint_ttl_s);
  }
}

bool worker_pool::turn_before(worker_ref a, worker_ref b) const {
  // Cyclic order starting just after the last worker dispatched to: refs above it first.
  const bool a_next = a > last_dispatched_, b_next = b > last_dispatched_;
  return a_next != b_next ? a_next : a < b;
}

namespace {

// Whether the worker's last heartbeat gives fewer free blocks in its binding pool (main or window,
// proto::free_kv_blocks_binding) than a new sequence needs. A worker that has not sent one yet
// (no totals) is not short.
bool kv_short(const worker_view& v, size_t blocks_needed) {
  return v.load.total_kv_blocks > 0 && proto::free_kv_blocks_binding(v.load) < blocks_needed;
}

}  // namespace

std::optional<worker_ref> worker_pool::choose(const std::string& model, std::span<const uint64_t> block_hashes,
                                              std::optional<worker_ref> avoid) const {
  const worker_ref avoided = avoid.value_or(0);
  const bool skip =
      avoid.has_value() && std::any_of(workers_.begin(), workers_.end(), [&](const auto& kv) {
        return kv.first != avoided && kv.second.state == worker_state::ready && kv.second.info.model_id == model;
      });
  // The prompt's full blocks and the one its last tokens and first output go in. Workers short of
  // them in their binding pool are passed over while another candidate has them.
  const size_t blocks_needed = block_hashes.size() + 1;
  auto eligible = [&](worker_ref ref, const worker_view& v) {
    return has_slot(v) && v.info.model_id == model && !(skip && ref == avoided);
  };
  const bool some_roomy = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
    return eligible(w.first, w.second) && !kv_short(w.second, blocks_needed);
  });
  auto candidate = [&](worker_ref ref, const worker_view& v) {
    return eligible(ref, v) && !(some_roomy && kv_short(v, blocks_needed));
  };
  int32_t min_load = std::numeric_limits<int32_t>::max(), max_load = -1;
  std::optional<worker_ref> least;
  for (const auto& [ref, v] : workers_) {
    if (!candidate(ref, v)) continue;
    if (v.in_flight < min_load || (v.in_flight == min_load && turn_before(ref, *least))) {
      min_load = v.in_flight;
      least = ref;
    }
    max_load = std::max(max_load, v.in_flight);
  }
  if (!least || max_load - min_load > cfg_.balance_threshold) return least;
  std::optional<worker_ref> best;
  size_t best_blocks = 0;
  int32_t best_load = 0;
  for (const auto& [ref, v] : workers_) {
    if (!candidate(ref, v)) continue;
    const size_t blocks = cached_blocks(ref, block_hashes);
    if (!best || blocks > best_blocks ||
        (blocks == best_blocks && (v.in_flight < best_load || (v.in_flight == best_load && turn_before(ref, *best))))) {
      best = ref;
      best_blocks = blocks;
      best_load = v.in_flight;
    }
  }
  return best;
}

void worker_pool::on_dispatched(worker_ref w, std::span<const uint64_t> block_hashes, double now_s) {
  worker_view& v = get(w);
  v.in_flight++;
  v.dispatched++;
  last_dispatched_ = w;
  v.prefix_hit_blocks += cached_blocks(w, block_hashes);
  views_[w].view.hint(block_hashes, now_s);
}

void worker_pool::on_finished(worker_ref w) {
  auto it = workers_.find(w);
  if (it != workers_.end() && it->second.in_flight > 0) it->second.in_flight--;
}

void render_kv_metrics(const worker_pool& pool, std::string& out) {
  const kv_view_counters& c = pool.kv_counters();
  metric_family events(out, "switchyard_router_kv_events_total", "counter",
                       "Workers' KV block events applied to this router's prefix views, by kind (stored/evicted: "
                       "block hashes; snapshot: full snapshots).");
  events.sample({{"kind", "stored"}}, c.stored);
  events.sample({{"kind", "evicted"}}, c.evicted);
  events.sample({{"kind", "snapshot"}}, c.snapshots);
  metric(out, "switchyard_router_kv_event_gaps_total", "counter",
         "KV event messages that followed a lost one (sequence gap) or came before any snapshot.",
         static_cast<double>(c.gaps));
  metric(out, "switchyard_router_kv_event_overflows_total", "counter",
         "KV block hashes refused because the view already held the worker's block count.",
         static_cast<double>(c.overflows));
  metric(out, "switchyard_router_kv_events_ignored_total", "counter",
         "KV event messages from workers that are not up, or about another model.", static_cast<double>(c.ignored));
  metric(out, "switchyard_router_kv_resyncs_total", "counter",
         "Snapshots asked of workers (kv_resync) because a prefix view went stale.",
         static_cast<double>(pool.kv_resyncs()));
  metric_family blocks(out, "switchyard_router_kv_view_blocks", "gauge",
                       "KV blocks each worker holds, as this router's view has them.");
  for (const auto& [w, v] : pool.all())
    if (const kv_view* k = pool.kv_view_of(w)) blocks.sample({{"worker", v.endpoint}}, k->size());
  metric_family exact(out, "switchyard_router_kv_view_exact", "gauge",
                      "1 when this router's view of the worker's prefix cache is exact (a snapshot and every event "
                      "since).");
  for (const auto& [w, v] : pool.all())
    if (const kv_view* k = pool.kv_view_of(w)) exact.sample({{"worker", v.endpoint}}, k->exact() ? 1 : 0);
}

void render_worker_kv_metrics(const worker_pool& pool, std::string& out) {
  metric_family binding(out, "switchyard_router_worker_kv_free_blocks", "gauge",
                        "KV blocks each worker can still give a new sequence: the free blocks of its binding pool (the "
                        "smaller of the main and the sliding-window pool's), from its last heartbeat.");
  for (const auto& [w, v] : pool.all()) binding.sample({{"worker", v.endpoint}}, proto::free_kv_blocks_binding(v.load));
  struct pool_field {
    std::string_view pool;
    uint32_t proto::heartbeat::*free, proto::heartbeat::*total;
  };
  constexpr pool_field k_pools[] = {
      {"main", &proto::heartbeat::free_kv_blocks, &proto::heartbeat::total_kv_blocks},
      {"window", &proto::heartbeat::free_window_kv_blocks, &proto::heartbeat::total_window_kv_blocks},
  };
  for (const bool total : {false, true}) {
    metric_family f(
        out, total ? "switchyard_router_worker_kv_pool_total_blocks" : "switchyard_router_worker_kv_pool_free_blocks",
        "gauge",
        total ? "KV blocks of each worker's pools (main; window: its sliding-window layers' own), from "
                "its last heartbeat."
              : "Free or evictable KV blocks of each worker's pools (main; window: its sliding-window "
                "layers' own), from its last heartbeat.");
    for (const auto& [w, v] : pool.all())
      for (const pool_field& p : k_pools) {
        if (p.pool == "window" && v.load.total_window_kv_blocks == 0) continue;  // none
        f.sample({{"worker", v.endpoint}, {"pool", p.pool}}, v.load.*(total ? p.total : p.free));
      }
  }
}

}  // namespace sy::router
