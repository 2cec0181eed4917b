#include "router/worker_pool.hpp"

#include <algorithm>
#include <limits>

namespace sy::router {

std::string_view name(worker_state s) {
  switch (s) {
    case worker_state::connecting:
      return "connecting";
    case worker_state::ready:
      return "ready";
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

size_t worker_pool::add(const std::string& endpoint) {
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (workers_[w].endpoint == endpoint) {
      workers_[w].retired = false;
      return w;
    }
  }
  worker_view v;
  v.endpoint = endpoint;
  workers_.push_back(std::move(v));
  prefixes_.emplace_back();
  return workers_.size() - 1;
}

bool worker_pool::on_welcome(size_t w, proto::welcome info, double now_s) {
  worker_view& v = workers_[w];
  const bool became_ready = v.state != worker_state::ready;
  if (became_ready || v.info.worker_id != info.worker_id) {
    // A (re)started worker has an empty prefix cache.
    prefixes_[w] = prefix_index{};
    v.in_flight = 0;
  }
  info.tokenizer = {};
  v.info = std::move(info);
  prefixes_[w].capacity =
      v.info.kv_block_size ? std::max<size_t>(64, 2 * v.info.kv_capacity_tokens / v.info.kv_block_size) : 0;
  v.state = worker_state::ready;
  v.last_seen_s = now_s;
  return became_ready;
}

void worker_pool::on_heartbeat(size_t w, const proto::heartbeat& hb, double now_s) {
  worker_view& v = workers_[w];
  v.load = hb;
  if (v.state == worker_state::ready) v.last_seen_s = now_s;
}

std::vector<size_t> worker_pool::check_liveness(double now_s) {
  std::vector<size_t> died;
  for (size_t w = 0; w < workers_.size(); ++w) {
    worker_view& v = workers_[w];
    if (v.state == worker_state::ready && now_s - v.last_seen_s > cfg_.heartbeat_timeout_s) {
      v.state = worker_state::dead;
      v.in_flight = 0;
      died.push_back(w);
    }
  }
  return died;
}

bool worker_pool::has_slot(const worker_view& v) const {
  return v.state == worker_state::ready && !v.retired && !v.load.draining &&
         v.in_flight < static_cast<int32_t>(v.info.max_running) + cfg_.local_queue;
}

size_t worker_pool::cached_blocks(size_t w, std::span<const uint64_t> block_hashes) const {
  const prefix_index& p = prefixes_[w];
  size_t n = 0;
  while (n < block_hashes.size() && p.where.count(block_hashes[n])) ++n;
  return n;
}

std::optional<size_t> worker_pool::choose(const std::string& model, std::span<const uint64_t> block_hashes) const {
  int32_t min_load = std::numeric_limits<int32_t>::max(), max_load = -1;
  std::optional<size_t> least;
  for (size_t w = 0; w < workers_.size(); ++w) {
    const worker_view& v = workers_[w];
    if (!has_slot(v) || v.info.model_id != model) continue;
    if (v.in_flight < min_load) {
      min_load = v.in_flight;
      least = w;
    }
    max_load = std::max(max_load, v.in_flight);
  }
  if (!least || max_load - min_load > cfg_.balance_threshold) return least;
  std::optional<size_t> best;
  size_t best_blocks = 0;
  for (size_t w = 0; w < workers_.size(); ++w) {
    const worker_view& v = workers_[w];
    if (!has_slot(v) || v.info.model_id != model) continue;
    const size_t blocks = cached_blocks(w, block_hashes);
    if (!best || blocks > best_blocks || (blocks == best_blocks && v.in_flight < workers_[*best].in_flight)) {
      best = w;
      best_blocks = blocks;
    }
  }
  return best;
}

void worker_pool::on_dispatched(size_t w, std::span<const uint64_t> block_hashes) {
  worker_view& v = workers_[w];
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

void worker_pool::on_finished(size_t w) {
  if (workers_[w].in_flight > 0) workers_[w].in_flight--;
}

size_t worker_pool::n_ready() const {
  return static_cast<size_t>(std::count_if(workers_.begin(), workers_.end(), [](const worker_view& v) {
    return v.state == worker_state::ready && !v.retired;
  }));
}

}  // namespace sy::router
