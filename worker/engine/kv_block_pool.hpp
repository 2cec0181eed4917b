// KV block pool: bookkeeping for the paged KV cache — block ids, reference counts, the
// prefix-cache hash map and the eviction order. No tensors: the floats live in kv_arena (or in
// device memory), indexed by the same block ids.
//
// Every block is in exactly one of three states:
//   free     ref 0, holds no reusable content (never filled, or evicted);
//   cached   ref 0, holds a full block registered under its hash; reusable until evicted;
//            kept on an LRU list, least recently released first to go;
//   in use   ref > 0 (shared by every sequence whose prefix it is).
// Invariant: free + cached + in_use == total.
//
// A full block's hash chains its parent's hash, its token ids and the model salt, so equal
// hashes mean equal whole prefixes; the tokens are stored too and compared on lookup, so a
// 64-bit collision can never hand a sequence someone else's KV.
//
// Owned by one thread (the engine's step loop); not thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/tokenizer/tokenizer.hpp"

namespace sy {

using block_id = int32_t;

// One change to the set of registered blocks, in the order the pool made it: a hash registered
// (`stored`) or a cached block evicted for new content (its old hash). Routers mirror this set
// (worker/service/kv_publisher.hpp).
struct kv_block_event {
  uint64_t hash = 0;
  bool stored = false;  // else evicted

  bool operator==(const kv_block_event&) const = default;
};

struct kv_pool_stats {
  int32_t total = 0;
  int32_t free = 0;
  int32_t cached = 0;
  int32_t in_use = 0;
  uint64_t prefix_query_tokens = 0;  // tokens looked up by acquire_prefix
  uint64_t prefix_hit_tokens = 0;    // of those, found in the pool
  uint64_t evictions = 0;            // cached blocks reused for new content
};

class kv_block_pool {
 public:
  kv_block_pool(int32_t n_blocks, int32_t block_size, uint64_t model_salt = 0);

  int32_t n_blocks() const;
  int32_t block_size() const;
  // Blocks an allocate() could hand out right now (free + cached).
  int32_t n_available() const;

  // The longest run of leading *full* blocks of `tokens` already in the pool, in order, each
  // with one more reference (cached blocks move to in use). Counts tokens.size() query tokens
  // and block_size * result.size() hit tokens. `root`: the prompt's prefix-cache namespace, the
  // parent hash of its first block (kv_cache_root; 0: the shared one).
  std::vector<block_id> acquire_prefix(std::span<const token_id> tokens, uint64_t root = 0);

  // The registered block holding `tokens` (block_size ids) after the prefix whose last block
  // hash is `parent_hash`, if the pool still holds it (content compared, as acquire_prefix does).
  // holds() only looks; acquire_block() also takes one reference (a cached block moves to in
  // use). Counts no prefix statistics: the window pool's lookups (worker/model/kv_window.hpp).
  bool holds(uint64_t parent_hash, std::span<const token_id> tokens) const;
  std::optional<block_id> acquire_block(uint64_t parent_hash, std::span<const token_id> tokens);

  // `n` blocks with one reference each, taking free blocks first, then evicting cached blocks
  // in LRU order; std::nullopt (and no change) when fewer than n are available.
  std::optional<std::vector<block_id>> allocate(int32_t n);

  // Registers in-use block `b`, now full with `tokens` (block_size ids) after the prefix whose
  // last block hash is `parent_hash` (the namespace's root for the first block: 0 or
  // kv_cache_root), so later sequences can reuse it.
  // Returns the block's hash. If an identical block is already registered, `b` stays
  // unregistered (it is freed normally on release) and the existing hash is returned;
  // registering `b` again with the same content is a no-op returning its hash.
  uint64_t register_full(block_id b, uint64_t parent_hash, std::span<const token_id> tokens);

  // Drops one reference from each block. A block reaching zero becomes cached (if registered)
  // or free. Pass a sequence's blocks in order: they are released tail first, so a shared
  // prefix outlives its suffixes in the LRU order.
  void release(std::span<const block_id> blocks);

  // With prefix caching off, acquire_prefix() finds nothing (queries are still counted); for
  // comparisons and for operators who want it off.
  void set_prefix_caching(bool on) { prefix_caching_ = on; }

  // Event recording, off by default (nothing would take the events). While on, every new
  // registration and every eviction is appended to a log of at most `max_events`; one more
  // drops the log and marks it lost, so an untaken log never grows past the bound.
  void record_events(bool on, size_t max_events);
  // Moves the log's events into `out` (appended, oldest first) and empties it; false when
  // events were lost since the last call (`out` then gets none: only a snapshot is exact).
  bool take_events(std::vector<kv_block_event>& out);
  // Every registered hash, in no particular order: the snapshot the events continue.
  std::vector<uint64_t> registered_hashes() const;
  uint64_t salt() const { return salt_; }

  int32_t ref_count(block_id b) const;
  bool is_cached(block_id b) const;  // registered under a hash (whatever its ref count)
  kv_pool_stats stats() const;
  // Checks every invariant (counts, ref counts, LRU list membership, hash map consistency);
  // on failure returns false and says why.
  bool check_invariants(std::string* why = nullptr) const;

  // The hash of a full block's content, as register_full computes it.
  static uint64_t chain_hash(uint64_t parent_hash, std::span<const token_id> tokens, uint64_t salt);

 private:
  friend struct kv_block_pool_test_access;  // tests only: forges a 64-bit hash collision

  struct block_meta {
    int32_t ref = 0;
    bool registered = false;
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<token_id> tokens;           // content when registered
    std::list<block_id>::iterator lru_pos;  // valid when cached with ref 0
    bool in_lru = false;
  };

  int32_t block_size_;
  uint64_t salt_;
  std::vector<block_meta> meta_;
  std::vector<block_id> free_;  // stack of free block ids
  std::list<block_id> lru_;     // cached, ref 0; front = evict first
  std::unordered_map<uint64_t, block_id> by_hash_;
  kv_pool_stats stats_;
  bool prefix_caching_ = true;
  bool recording_ = false;
  bool events_lost_ = false;
  size_t max_events_ = 0;
  std::vector<kv_block_event> events_;  // while recording_, since the last take_events
  void record(uint64_t hash, bool stored);
  // The registered block with exactly this parent and content, or -1.
  block_id find(uint64_t parent_hash, std::span<const token_id> tokens) const;
  // One more reference to registered block `b` (off the LRU list when it was cached).
  void add_ref(block_id b);
};

}  // namespace sy
