#include "router/worker_pool.hpp"

#include <algorithm>
#include <cassert>
#include <limits>

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
  }
  return "unknown";
}

std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> prompt, uint32_t block_size) {
  std::vector<uint64_t> out;
  if (block_size == 0) return out;
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t b = 0; (b + 1) * block_size <= prompt.size(); ++b) {
    for (size_t i = b * block_size; i < (b + 1) * block_size; ++i) {
      // splitmix-style mixing of each token into the running hash (chained from the parent)
      uint64_t x = h ^ (static_cast<uint64_t>(static_cast<uint32_t>(prompt[i])) + 0x632be59bd9b4e019ull);
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
      h = x ^ (x >> 31);
    }
    out.push_back(h);
  }
  return out;
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
  prefixes_[ref];
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
    prefixes_[w] = prefix_index{};
    v.in_flight = 0;
    v.load = {};
  }
  info.tokenizer = {};
  v.info = std::move(info);
  prefixes_[w].capacity =
      v.info.kv_block_size ? std::max<size_t>(64, 2 * v.info.kv_capacity_tokens / v.info.kv_block_size) : 0;
  v.liveness = worker_liveness::up;
  v.last_seen_s = now_s;
  update_state(v);
  return became_up;
}

void worker_pool::on_heartbeat(worker_ref w, const proto::heartbeat& hb, double now_s) {
  worker_view& v = get(w);
  v.load = hb;
  if (v.liveness == worker_liveness::up) v.last_seen_s = now_s;
  update_state(v);
}

void worker_pool::mark_draining(worker_ref w) {
  worker_view& v = get(w);
  v.load.draining = true;
  update_state(v);
}

std::vector<worker_ref> worker_pool::check_liveness(double now_s) {
  std::vector<worker_ref> died;
  for (auto& [ref, v] : workers_) {
    if (v.liveness == worker_liveness::up && now_s - v.last_seen_s > cfg_.heartbeat_timeout_s) {
      v.liveness = worker_liveness::dead;
      v.dead_since_s = now_s;
      v.in_flight = 0;
      update_state(v);
      died.push_back(ref);
    }
  }
  return died;
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
  prefixes_.erase(w);
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
  auto it = prefixes_.find(w);
  if (it == prefixes_.end()) return 0;
  const prefix_index& p = it->second;
  size_t n = 0;
  while (n < block_hashes.size() && p.where.count(block_hashes[n])) ++n;
  return n;
}

std::optional<worker_ref> worker_pool::choose(const std::string& model, std::span<const uint64_t> block_hashes) const {
  int32_t min_load = std::numeric_limits<int32_t>::max(), max_load = -1;
  std::optional<worker_ref> least;
  for (const auto& [ref, v] : workers_) {
    if (!has_slot(v) || v.info.model_id != model) continue;
    if (v.in_flight < min_load) {
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
    if (!has_slot(v) || v.info.model_id != model) continue;
    const size_t blocks = cached_blocks(ref, block_hashes);
    if (!best || blocks > best_blocks || (blocks == best_blocks && v.in_flight < best_load)) {
      best = ref;
      best_blocks = blocks;
      best_load = v.in_flight;
    }
  }
  return best;
}

void worker_pool::on_dispatched(worker_ref w, std::span<const uint64_t> block_hashes) {
  worker_view& v = get(w);
  v.in_flight++;
  v.dispatched++;
  v.prefix_hit_blocks += cached_blocks(w, block_hashes);
  prefix_index& p = prefixes_[w];
  for (const uint64_t h : block_hashes) {
    if (auto it = p.where.find(h); it != p.where.end()) {
      p.lru.splice(p.lru.begin(), p.lru, it->second);
    } else {
      p.lru.push_front(h);
      p.where.emplace(h, p.lru.begin());
    }
  }
  while (p.lru.size() > p.capacity && !p.lru.empty()) {
    p.where.erase(p.lru.back());
    p.lru.pop_back();
  }
}

void worker_pool::on_finished(worker_ref w) {
  auto it = workers_.find(w);
  if (it != workers_.end() && it->second.in_flight > 0) it->second.in_flight--;
}

}  // namespace sy::router
