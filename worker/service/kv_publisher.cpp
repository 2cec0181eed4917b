#include "worker/service/kv_publisher.hpp"

#include <algorithm>
#include <unordered_map>

namespace sy {

void net_kv_events(std::span<const kv_block_event> log, std::vector<uint64_t>& stored, std::vector<uint64_t>& evicted) {
  stored.clear();
  evicted.clear();
  std::unordered_map<uint64_t, bool> last;  // hash -> stored by its last event
  std::vector<uint64_t> order;
  last.reserve(log.size());
  for (const kv_block_event& e : log) {
    const auto [it, fresh] = last.try_emplace(e.hash, e.stored);
    if (fresh)
      order.push_back(e.hash);
    else
      it->second = e.stored;
  }
  for (const uint64_t h : order) (last[h] ? stored : evicted).push_back(h);
}

kv_publisher::kv_publisher(kv_block_pool& pool, std::string model_id) : pool_(pool), model_id_(std::move(model_id)) {
  // A step registers or evicts at most a few blocks per scheduled sequence; this bound is only
  // reached when steps stop being published, and then a snapshot replaces the lost events.
  pool_.record_events(true, std::max<size_t>(4096, 4 * static_cast<size_t>(pool_.n_blocks())));
}

void kv_publisher::snapshot(const std::string& peer, uint64_t& next_seq, std::vector<addressed>& out) {
  const std::vector<uint64_t> all = pool_.registered_hashes();
  size_t i = 0;
  do {  // at least one message: the reset
    proto::kv_events m;
    m.seq = next_seq++;
    m.reset = i == 0;
    m.model_id = model_id_;
    const size_t n = std::min(proto::k_max_kv_hashes, all.size() - i);
    m.stored.assign(all.begin() + static_cast<std::ptrdiff_t>(i), all.begin() + static_cast<std::ptrdiff_t>(i + n));
    i += n;
    out.emplace_back(peer, std::move(m));
  } while (i < all.size());
  counters_.snapshots++;
}

void kv_publisher::subscribe(const std::string& peer, std::vector<addressed>& out) {
  uint64_t& next_seq = subs_.try_emplace(peer, 1).first->second;  // a repeated hello keeps counting
  snapshot(peer, next_seq, out);
}

void kv_publisher::resync(const std::string& peer, std::vector<addressed>& out) {
  auto it = subs_.find(peer);
  if (it == subs_.end()) return;
  counters_.resyncs++;
  snapshot(peer, it->second, out);
}

void kv_publisher::publish(std::vector<addressed>& out) {
  log_.clear();
  if (!pool_.take_events(log_)) {
    counters_.overflows++;
    for (auto& [peer, next_seq] : subs_) snapshot(peer, next_seq, out);
    return;
  }
  if (log_.empty() || subs_.empty()) return;
  net_kv_events(log_, stored_, evicted_);
  const size_t k = proto::k_max_kv_hashes;
  const size_t n_msgs = (std::max(stored_.size(), evicted_.size()) + k - 1) / k;
  for (auto& [peer, next_seq] : subs_) {
    for (size_t i = 0; i < n_msgs; ++i) {
      proto::kv_events m;
      m.seq = next_seq++;
      m.model_id = model_id_;
      auto part = [&](const std::vector<uint64_t>& all, std::vector<uint64_t>& to) {
        const size_t b = std::min(all.size(), i * k), e = std::min(all.size(), (i + 1) * k);
        to.assign(all.begin() + static_cast<std::ptrdiff_t>(b), all.begin() + static_cast<std::ptrdiff_t>(e));
      };
      part(stored_, m.stored);
      part(evicted_, m.evicted);
      out.emplace_back(peer, std::move(m));
    }
  }
  counters_.stored += stored_.size();
  counters_.evicted += evicted_.size();
}

}  // namespace sy
