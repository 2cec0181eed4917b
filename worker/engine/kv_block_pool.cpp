#include "worker/engine/kv_block_pool.hpp"

#include <algorithm>
#include <cassert>

#include "common/kv_hash.hpp"

namespace sy {

namespace {

// The hash handed back by register_full when `h` is already taken by a block with *different*
// content (a true 64-bit collision). The new block stays unregistered, and its descendants chain
// from this value instead of `h`, so they can never be reached through the other block's prefix.
uint64_t collision_hash(uint64_t h) {
  uint64_t p = kv_mix64(h ^ 0xc2b2ae3d27d4eb4fULL);
  if (p == 0 || p == h) p = h + 1 == 0 ? 1 : h + 1;
  return p;
}

}  // namespace

uint64_t kv_block_pool::chain_hash(uint64_t parent_hash, std::span<const token_id> tokens, uint64_t salt) {
  return kv_chain_hash(parent_hash, tokens, salt);
}

kv_block_pool::kv_block_pool(int32_t n_blocks, int32_t block_size, uint64_t model_salt)
    : block_size_(block_size), salt_(model_salt), meta_(static_cast<size_t>(n_blocks)) {
  assert(n_blocks >= 0 && block_size > 0);
  // free_ is a stack popped from the back: a fresh pool hands out 0, 1, 2, ...
  free_.reserve(static_cast<size_t>(n_blocks));
  for (block_id b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
  by_hash_.reserve(static_cast<size_t>(n_blocks));
  stats_.total = n_blocks;
  stats_.free = n_blocks;
}

int32_t kv_block_pool::n_blocks() const { return static_cast<int32_t>(meta_.size()); }

int32_t kv_block_pool::block_size() const { return block_size_; }

int32_t kv_block_pool::n_available() const { return stats_.free + stats_.cached; }

std::vector<block_id> kv_block_pool::acquire_prefix(std::span<const token_id> tokens, uint64_t root) {
  std::vector<block_id> hits;
  const size_t n_full = prefix_caching_ ? tokens.size() / static_cast<size_t>(block_size_) : 0;
  const size_t bs = static_cast<size_t>(block_size_);
  uint64_t parent = root;
  for (size_t i = 0; i < n_full; ++i) {
    const auto content = tokens.subspan(i * bs, bs);
    const uint64_t h = chain_hash(parent, content, salt_);
    const auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    block_meta& m = meta_[static_cast<size_t>(it->second)];
    // Same hash is not proof: the parent link and the tokens must match too, so a collision
    // ends the walk instead of handing out another prefix's KV.
    if (m.parent_hash != parent || !std::equal(content.begin(), content.end(), m.tokens.begin(), m.tokens.end())) break;
    add_ref(it->second);
    hits.push_back(it->second);
    parent = h;
  }
  stats_.prefix_query_tokens += tokens.size();
  stats_.prefix_hit_tokens += hits.size() * bs;
  return hits;
}

void kv_block_pool::add_ref(block_id b) {
  block_meta& m = meta_[static_cast<size_t>(b)];
  if (m.ref == 0) {
    assert(m.in_lru);
    lru_.erase(m.lru_pos);
    m.in_lru = false;
    --stats_.cached;
    ++stats_.in_use;
  }
  ++m.ref;
}

block_id kv_block_pool::find(uint64_t parent_hash, std::span<const token_id> tokens) const {
  if (!prefix_caching_ || tokens.size() != static_cast<size_t>(block_size_)) return -1;
  const auto it = by_hash_.find(chain_hash(parent_hash, tokens, salt_));
  if (it == by_hash_.end()) return -1;
  const block_meta& m = meta_[static_cast<size_t>(it->second)];
  if (m.parent_hash != parent_hash || !std::equal(tokens.begin(), tokens.end(), m.tokens.begin(), m.tokens.end()))
    return -1;
  return it->second;
}

bool kv_block_pool::holds(uint64_t parent_hash, std::span<const token_id> tokens) const {
  return find(parent_hash, tokens) >= 0;
}

std::optional<block_id> kv_block_pool::acquire_block(uint64_t parent_hash, std::span<const token_id> tokens) {
  const block_id b = find(parent_hash, tokens);
  if (b < 0) return std::nullopt;
  add_ref(b);
  return b;
}

std::optional<std::vector<block_id>> kv_block_pool::allocate(int32_t n) {
  assert(n >= 0);
  if (n > n_available()) return std::nullopt;
  std::vector<block_id> out;
  out.reserve(static_cast<size_t>(n));
  while (static_cast<int32_t>(out.size()) < n && !free_.empty()) {
    const block_id b = free_.back();
    free_.pop_back();
    meta_[static_cast<size_t>(b)].ref = 1;
    --stats_.free;
    ++stats_.in_use;
    out.push_back(b);
  }
  while (static_cast<int32_t>(out.size()) < n) {
    const block_id b = lru_.front();
    lru_.pop_front();
    block_meta& m = meta_[static_cast<size_t>(b)];
    assert(m.registered && m.ref == 0);
    by_hash_.erase(m.hash);
    record(m.hash, false);
    m.registered = false;
    m.in_lru = false;
    m.hash = 0;
    m.parent_hash = 0;
    m.tokens.clear();  // keeps capacity: the block will be refilled with block_size ids
    m.ref = 1;
    --stats_.cached;
    ++stats_.in_use;
    ++stats_.evictions;
    out.push_back(b);
  }
  return out;
}

uint64_t kv_block_pool::register_full(block_id b, uint64_t parent_hash, std::span<const token_id> tokens) {
  assert(b >= 0 && b < n_blocks());
  assert(tokens.size() == static_cast<size_t>(block_size_));
  block_meta& m = meta_[static_cast<size_t>(b)];
  assert(m.ref > 0);
  const uint64_t h = chain_hash(parent_hash, tokens, salt_);
  auto same_content = [&](const block_meta& o) {
    return o.parent_hash == parent_hash && std::equal(tokens.begin(), tokens.end(), o.tokens.begin(), o.tokens.end());
  };
  if (m.registered) {
    // Re-registering a block (e.g. one that came from acquire_prefix) is a no-op; giving a
    // registered block new content is a bug.
    assert(m.hash == h && same_content(m));
    return m.hash;
  }
  const auto it = by_hash_.find(h);
  if (it != by_hash_.end()) {
    // `b` stays unregistered and goes to free on release; the registered twin keeps serving.
    if (same_content(meta_[static_cast<size_t>(it->second)])) return h;
    return collision_hash(h);
  }
  m.registered = true;
  m.hash = h;
  m.parent_hash = parent_hash;
  m.tokens.assign(tokens.begin(), tokens.end());
  by_hash_.emplace(h, b);
  record(h, true);
  return h;
}

void kv_block_pool::release(std::span<const block_id> blocks) {
  // Tail first: the prefix block is pushed to the LRU back last, so it is evicted after its
  // suffixes (a suffix is useless without its prefix).
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const block_id b = *it;
    assert(b >= 0 && b < n_blocks());
    block_meta& m = meta_[static_cast<size_t>(b)];
    assert(m.ref > 0);  // releasing a block nobody holds: double release
    if (--m.ref > 0) continue;
    --stats_.in_use;
    if (m.registered) {
      m.lru_pos = lru_.insert(lru_.end(), b);
      m.in_lru = true;
      ++stats_.cached;
    } else {
      free_.push_back(b);
      ++stats_.free;
    }
  }
}

void kv_block_pool::record_events(bool on, size_t max_events) {
  recording_ = on;
  max_events_ = max_events;
  events_.clear();
  events_lost_ = false;
}

void kv_block_pool::record(uint64_t hash, bool stored) {
  if (!recording_ || events_lost_) return;
  if (events_.size() >= max_events_) {
    events_lost_ = true;
    events_.clear();
    events_.shrink_to_fit();
    return;
  }
  events_.push_back({hash, stored});
}

bool kv_block_pool::take_events(std::vector<kv_block_event>& out) {
  const bool complete = !events_lost_;
  if (complete) out.insert(out.end(), events_.begin(), events_.end());
  events_.clear();
  events_lost_ = false;
  return complete;
}

std::vector<uint64_t> kv_block_pool::registered_hashes() const {
  std::vector<uint64_t> out;
  out.reserve(by_hash_.size());
  for (const auto& [h, b] : by_hash_) out.push_back(h);
  return out;
}

int32_t kv_block_pool::ref_count(block_id b) const {
  assert(b >= 0 && b < n_blocks());
  return meta_[static_cast<size_t>(b)].ref;
}

bool kv_block_pool::is_cached(block_id b) const {
  assert(b >= 0 && b < n_blocks());
  return meta_[static_cast<size_t>(b)].registered;
}

kv_pool_stats kv_block_pool::stats() const { return stats_; }

bool kv_block_pool::check_invariants(std::string* why) const {
  auto fail = [&](std::string msg) {
    if (why) *why = std::move(msg);
    return false;
  };
  const int32_t total = n_blocks();
  const auto bs = static_cast<size_t>(block_size_);
  if (stats_.total != total) return fail("stats.total != n_blocks");

  // Where each block was seen: 0 nowhere, 1 free list, 2 LRU list.
  std::vector<uint8_t> seen(static_cast<size_t>(total), 0);
  for (block_id b : free_) {
    if (b < 0 || b >= total) return fail("free list holds out-of-range id " + std::to_string(b));
    if (seen[static_cast<size_t>(b)]) return fail("block " + std::to_string(b) + " twice on free list");
    seen[static_cast<size_t>(b)] = 1;
  }
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const block_id b = *it;
    if (b < 0 || b >= total) return fail("LRU holds out-of-range id " + std::to_string(b));
    if (seen[static_cast<size_t>(b)] == 1) return fail("block " + std::to_string(b) + " both free and on the LRU");
    if (seen[static_cast<size_t>(b)] == 2) return fail("block " + std::to_string(b) + " twice on LRU");
    seen[static_cast<size_t>(b)] = 2;
    const block_meta& m = meta_[static_cast<size_t>(b)];
    if (!m.in_lru || m.lru_pos != it) return fail("block " + std::to_string(b) + " LRU position out of date");
  }

  int32_t n_in_use = 0, n_registered = 0;
  for (block_id b = 0; b < total; ++b) {
    const block_meta& m = meta_[static_cast<size_t>(b)];
    const std::string id = "block " + std::to_string(b);
    const uint8_t where = seen[static_cast<size_t>(b)];
    if (m.ref < 0) return fail(id + " has negative ref count");
    if (m.ref > 0 && where != 0) return fail(id + " in use but on free list or LRU");
    if (m.ref == 0 && where == 0) return fail(id + " has ref 0 but is neither free nor cached");
    if (m.in_lru != (where == 2)) return fail(id + " in_lru flag disagrees with the LRU list");
    if (where == 1 && m.registered) return fail(id + " free but registered");
    if (where == 2 && !m.registered) return fail(id + " on LRU but not registered");
    if (m.ref > 0) ++n_in_use;
    if (m.registered) {
      ++n_registered;
      if (m.tokens.size() != bs) return fail(id + " registered without block_size tokens");
      if (m.hash == 0 || m.hash != chain_hash(m.parent_hash, m.tokens, salt_))
        return fail(id + " hash does not match its content");
      const auto it = by_hash_.find(m.hash);
      if (it == by_hash_.end() || it->second != b) return fail(id + " registered but not in hash map");
    } else if (!m.tokens.empty() || m.hash != 0) {
      return fail(id + " unregistered but keeps content");
    }
  }
  for (const auto& [h, b] : by_hash_) {
    if (b < 0 || b >= total) return fail("hash map points to out-of-range id " + std::to_string(b));
    const block_meta& m = meta_[static_cast<size_t>(b)];
    if (!m.registered || m.hash != h) return fail("hash map entry for block " + std::to_string(b) + " is stale");
  }
  if (static_cast<int32_t>(by_hash_.size()) != n_registered) return fail("hash map size != registered blocks");

  if (stats_.free != static_cast<int32_t>(free_.size())) return fail("stats.free != free list size");
  if (stats_.cached != static_cast<int32_t>(lru_.size())) return fail("stats.cached != LRU size");
  if (stats_.in_use != n_in_use) return fail("stats.in_use != blocks with ref > 0");
  if (stats_.free + stats_.cached + stats_.in_use != total) return fail("free + cached + in_use != total");
  if (stats_.prefix_hit_tokens > stats_.prefix_query_tokens) return fail("more prefix hit tokens than query tokens");
  return true;
}

}  // namespace sy
