// KV block pool bookkeeping: exact block ids, ref counts, prefix hits and eviction order on a
// pool of 12 blocks of 4 tokens, then a randomized soak checking every invariant after each op.
//
// Id order the tests rely on: a fresh pool hands out 0, 1, 2, ...; free blocks are reused last
// freed first, and a sequence's blocks are freed tail first, so they come back in their order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/kv_hash.hpp"
#include "worker/engine/kv_block_pool.hpp"

using namespace sy;

#define REQUIRE_INVARIANTS(pool)                     \
  do {                                               \
    std::string why_;                                \
    const bool ok_ = (pool).check_invariants(&why_); \
    INFO("invariant broken: " << why_);              \
    REQUIRE(ok_);                                    \
  } while (0)

namespace {

constexpr int32_t k_blocks = 12;
constexpr int32_t k_bs = 4;

std::vector<token_id> iota_tokens(int n, token_id first) {
  std::vector<token_id> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Registers every full block of `tokens` (held in `blocks`, in order), chaining hashes from the
// start; returns the hash of each full block.
std::vector<uint64_t> register_all(kv_block_pool& pool, const std::vector<block_id>& blocks,
                                   const std::vector<token_id>& tokens, uint64_t root = 0) {
  std::vector<uint64_t> hashes;
  uint64_t parent = root;
  const size_t n_full = tokens.size() / k_bs;
  for (size_t i = 0; i < n_full && i < blocks.size(); ++i) {
    const std::span<const token_id> content(tokens.data() + i * k_bs, k_bs);
    parent = pool.register_full(blocks[i], parent, content);
    hashes.push_back(parent);
  }
  return hashes;
}

// A sequence holding `tokens` in freshly allocated, registered blocks.
std::vector<block_id> fill(kv_block_pool& pool, const std::vector<token_id>& tokens, uint64_t root = 0) {
  const int32_t n = static_cast<int32_t>((tokens.size() + k_bs - 1) / k_bs);
  auto blocks = pool.allocate(n);
  REQUIRE(blocks);
  register_all(pool, *blocks, tokens, root);
  return *blocks;
}

using ids = std::vector<block_id>;

}  // namespace

namespace sy {
// Re-keys registered block `b` under `h` as if its content hashed there: a forged collision.
struct kv_block_pool_test_access {
  static void rekey(kv_block_pool& pool, block_id b, uint64_t h) {
    auto& m = pool.meta_[static_cast<size_t>(b)];
    pool.by_hash_.erase(m.hash);
    m.hash = h;
    pool.by_hash_.emplace(h, b);
  }
};
}  // namespace sy

TEST_CASE("fresh pool hands out ids in order, all or nothing") {
  kv_block_pool pool(k_blocks, k_bs);
  REQUIRE_INVARIANTS(pool);
  CHECK(pool.n_blocks() == k_blocks);
  CHECK(pool.block_size() == k_bs);
  CHECK(pool.n_available() == k_blocks);

  auto a = pool.allocate(3);
  REQUIRE(a);
  CHECK(*a == ids{0, 1, 2});
  CHECK(pool.n_available() == 9);
  auto b = pool.allocate(2);
  REQUIRE(b);
  CHECK(*b == ids{3, 4});
  CHECK(pool.n_available() == 7);
  for (block_id x : {0, 1, 2, 3, 4}) CHECK(pool.ref_count(x) == 1);
  for (block_id x : {0, 1, 2, 3, 4}) CHECK_FALSE(pool.is_cached(x));
  CHECK(pool.ref_count(5) == 0);
  REQUIRE_INVARIANTS(pool);

  const auto before = pool.stats();
  CHECK_FALSE(pool.allocate(8));
  const auto after = pool.stats();
  CHECK(after.free == before.free);
  CHECK(after.in_use == before.in_use);
  CHECK(after.cached == before.cached);
  CHECK(pool.n_available() == 7);
  REQUIRE_INVARIANTS(pool);

  auto empty = pool.allocate(0);
  REQUIRE(empty);
  CHECK(empty->empty());

  // Unregistered blocks go straight to free and come back in the sequence's order.
  pool.release(*a);
  CHECK(pool.stats().free == 10);
  CHECK(pool.stats().cached == 0);
  REQUIRE_INVARIANTS(pool);
  auto c = pool.allocate(4);
  REQUIRE(c);
  CHECK(*c == ids{0, 1, 2, 5});
  pool.release(*b);
  pool.release(*c);
  CHECK(pool.stats().in_use == 0);
  CHECK(pool.stats().free == k_blocks);
  REQUIRE_INVARIANTS(pool);
}

TEST_CASE("released registered blocks are cached and hit by the same prefix") {
  kv_block_pool pool(k_blocks, k_bs);
  const auto tokens = iota_tokens(12, 100);  // three full blocks
  const auto seq = fill(pool, tokens);
  CHECK(seq == ids{0, 1, 2});
  for (block_id b : seq) CHECK(pool.is_cached(b));
  REQUIRE_INVARIANTS(pool);

  pool.release(seq);
  CHECK(pool.stats().cached == 3);
  CHECK(pool.stats().in_use == 0);
  CHECK(pool.stats().free == 9);
  CHECK(pool.n_available() == k_blocks);
  for (block_id b : seq) CHECK(pool.ref_count(b) == 0);
  REQUIRE_INVARIANTS(pool);

  const auto hit = pool.acquire_prefix(tokens);
  CHECK(hit == ids{0, 1, 2});
  for (block_id b : hit) CHECK(pool.ref_count(b) == 1);
  CHECK(pool.stats().cached == 0);
  CHECK(pool.stats().in_use == 3);
  CHECK(pool.stats().prefix_query_tokens == 12);
  CHECK(pool.stats().prefix_hit_tokens == 12);
  REQUIRE_INVARIANTS(pool);
  pool.release(hit);
  REQUIRE_INVARIANTS(pool);

  // Differs in the 2nd block: only the 1st hits.
  auto other = tokens;
  other[5] = 9999;
  const auto partial = pool.acquire_prefix(other);
  CHECK(partial == ids{0});
  CHECK(pool.ref_count(0) == 1);
  CHECK(pool.ref_count(1) == 0);
  CHECK(pool.stats().prefix_query_tokens == 24);
  CHECK(pool.stats().prefix_hit_tokens == 16);
  REQUIRE_INVARIANTS(pool);

  // Differs in the 1st block: nothing, even though blocks 2 and 3 hold the same tokens.
  auto head_differs = tokens;
  head_differs[0] = 7;
  CHECK(pool.acquire_prefix(head_differs).empty());
  CHECK(pool.stats().prefix_query_tokens == 36);
  CHECK(pool.stats().prefix_hit_tokens == 16);
  pool.release(partial);
  REQUIRE_INVARIANTS(pool);
}

TEST_CASE("a prefix cached in one namespace is never found from another, and hashes like the router's") {
  kv_block_pool pool(k_blocks, k_bs, sy::kv_model_salt("model"));
  const uint64_t webapp = sy::kv_cache_root("t:webapp"), batch = sy::kv_cache_root("t:batch-jobs");
  CHECK(webapp != batch);
  CHECK(webapp != 0);
  CHECK(sy::kv_cache_root("") == 0);
  const auto tokens = iota_tokens(12, 100);
  const auto seq = fill(pool, tokens, webapp);
  pool.release(seq);
  CHECK(pool.acquire_prefix(tokens, batch).empty());  // same text, another tenant: nothing
  CHECK(pool.acquire_prefix(tokens).empty());         // nor from the shared namespace
  const auto hit = pool.acquire_prefix(tokens, webapp);
  CHECK(hit == seq);
  // The router's view of the worker's cache hashes a prompt the same way (common/kv_hash.hpp).
  const auto hashes = register_all(pool, hit, tokens, webapp);
  CHECK(hashes == sy::kv_block_hashes(tokens, k_bs, pool.salt(), webapp));
  CHECK(hashes != sy::kv_block_hashes(tokens, k_bs, pool.salt(), batch));
  pool.release(hit);
  REQUIRE_INVARIANTS(pool);
}

TEST_CASE("only full blocks are matched") {
  kv_block_pool pool(k_blocks, k_bs);
  const auto tokens = iota_tokens(8, 1);
  pool.release(fill(pool, tokens));

  // 7 tokens: the first block is full, the second (3 of 4 matching tokens) is not looked up.
  const std::vector<token_id> seven(tokens.begin(), tokens.begin() + 7);
  const auto hit = pool.acquire_prefix(seven);
  CHECK(hit == ids{0});
  CHECK(pool.stats().prefix_query_tokens == 7);
  CHECK(pool.stats().prefix_hit_tokens == 4);
  pool.release(hit);

  const std::vector<token_id> three(tokens.begin(), tokens.begin() + 3);
  CHECK(pool.acquire_prefix(three).empty());
  CHECK(pool.acquire_prefix({}).empty());
  CHECK(pool.stats().prefix_query_tokens == 10);
  CHECK(pool.stats().prefix_hit_tokens == 4);

  // A sequence whose last block is partial: that block is never registered, so it is freed.
  const auto ten = iota_tokens(10, 500);
  const auto seq = fill(pool, ten);
  CHECK(seq.size() == 3);
  CHECK(pool.is_cached(seq[0]));
  CHECK(pool.is_cached(seq[1]));
  CHECK_FALSE(pool.is_cached(seq[2]));
  const auto free_before = pool.stats().free;
  pool.release(seq);
  CHECK(pool.stats().free == free_before + 1);
  CHECK(pool.acquire_prefix(ten).size() == 2);
  REQUIRE_INVARIANTS(pool);
}

TEST_CASE("eviction takes the least recently released first, a sequence's tail before its head") {
  kv_block_pool pool(k_blocks, k_bs);
  const auto ta = iota_tokens(12, 100);
  const auto tb = iota_tokens(12, 200);
  const auto a = fill(pool, ta);
  const auto b = fill(pool, tb);
  CHECK(a == ids{0, 1, 2});
  CHECK(b == ids{3, 4, 5});
  pool.release(a);  // LRU: 2 1 0
  pool.release(b);  // LRU: 2 1 0 5 4 3
  CHECK(pool.stats().cached == 6);
  CHECK(pool.stats().free == 6);
  REQUIRE_INVARIANTS(pool);

  // 6 free blocks first (6..11), then evictions: A's tail 2, then 1.
  auto c = pool.allocate(8);
  REQUIRE(c);
  CHECK(*c == ids{6, 7, 8, 9, 10, 11, 2, 1});
  CHECK(pool.stats().evictions == 2);
  CHECK_FALSE(pool.is_cached(2));
  CHECK_FALSE(pool.is_cached(1));
  CHECK(pool.is_cached(0));
  CHECK(pool.ref_count(2) == 1);
  REQUIRE_INVARIANTS(pool);

  // A now hits only its head; B entirely.
  const auto ha = pool.acquire_prefix(ta);
  CHECK(ha == ids{0});
  const auto hb = pool.acquire_prefix(tb);
  CHECK(hb == ids{3, 4, 5});
  REQUIRE_INVARIANTS(pool);
  pool.release(ha);  // LRU: 0
  pool.release(hb);  // LRU: 0 5 4 3
  REQUIRE_INVARIANTS(pool);

  auto d = pool.allocate(3);
  REQUIRE(d);
  CHECK(*d == ids{0, 5, 4});
  CHECK(pool.stats().evictions == 5);
  CHECK(pool.acquire_prefix(ta).empty());
  const auto hb_head = pool.acquire_prefix(tb);  // B's head outlived its tail
  CHECK(hb_head == ids{3});
  pool.release(hb_head);
  REQUIRE_INVARIANTS(pool);

  CHECK(pool.n_available() == 1);
  CHECK_FALSE(pool.allocate(2));
  pool.release(*c);
  pool.release(*d);
  CHECK(pool.stats().in_use == 0);
  CHECK(pool.stats().free + pool.stats().cached == k_blocks);
  REQUIRE_INVARIANTS(pool);
}

TEST_CASE("a prefix shared by two live sequences stays in use until both release") {
  kv_block_pool pool(k_blocks, k_bs);
  const auto tx = iota_tokens(12, 1);
  const auto x = fill(pool, tx);
  CHECK(x == ids{0, 1, 2});

  // Y shares X's first two blocks, then diverges.
  auto ty = tx;
  ty[8] = 77;
  auto y = pool.acquire_prefix(ty);
  CHECK(y == ids{0, 1});
  CHECK(pool.ref_count(0) == 2);
  CHECK(pool.ref_count(1) == 2);
  CHECK(pool.ref_count(2) == 1);
  auto tail = pool.allocate(1);
  REQUIRE(tail);
  CHECK(*tail == ids{3});
  y.push_back(tail->front());
  const uint64_t parent = kv_block_pool::chain_hash(kv_block_pool::chain_hash(0, std::span(ty).first(4), 0),
                                                    std::span(ty).subspan(4, 4), 0);
  pool.register_full(3, parent, std::span(ty).subspan(8, 4));
  CHECK(pool.stats().in_use == 4);
  REQUIRE_INVARIANTS(pool);

  pool.release(x);
  CHECK(pool.ref_count(0) == 1);
  CHECK(pool.ref_count(1) == 1);
  CHECK(pool.ref_count(2) == 0);
  CHECK(pool.stats().in_use == 3);
  CHECK(pool.stats().cached == 1);  // X's own tail
  REQUIRE_INVARIANTS(pool);

  pool.release(y);
  CHECK(pool.stats().in_use == 0);
  CHECK(pool.stats().cached == 4);
  REQUIRE_INVARIANTS(pool);

  // Both full sequences hit again.
  const auto hx = pool.acquire_prefix(tx);
  const auto hy = pool.acquire_prefix(ty);
  CHECK(hx == ids{0, 1, 2});
  CHECK(hy == ids{0, 1, 3});
  CHECK(pool.ref_count(0) == 2);
  pool.release(hx);
  pool.release(hy);
  REQUIRE_INVARIANTS(pool);
}

TEST_CASE("registering a duplicate block keeps the first and frees the copy on release") {
  kv_block_pool pool(k_blocks, k_bs);
  const auto t = iota_tokens(8, 40);
  auto x = pool.allocate(2);
  REQUIRE(x);
  const auto hx = register_all(pool, *x, t);
  // Y computed the same content into its own blocks (it looked up before X registered).
  auto y = pool.allocate(2);
  REQUIRE(y);
  CHECK(*y == ids{2, 3});
  const auto hy = register_all(pool, *y, t);
  CHECK(hy == hx);
  CHECK(pool.is_cached(0));
  CHECK(pool.is_cached(1));
  CHECK_FALSE(pool.is_cached(2));
  CHECK_FALSE(pool.is_cached(3));
  REQUIRE_INVARIANTS(pool);

  pool.release(*y);
  CHECK(pool.stats().free == 10);
  CHECK(pool.stats().cached == 0);
  REQUIRE_INVARIANTS(pool);
  pool.release(*x);
  CHECK(pool.stats().cached == 2);
  CHECK(pool.acquire_prefix(t) == ids{0, 1});
  REQUIRE_INVARIANTS(pool);

  // Re-registering a block acquired from the cache is a no-op returning its hash.
  CHECK(pool.register_full(0, 0, std::span(t).first(4)) == hx[0]);
  CHECK(pool.register_full(1, hx[0], std::span(t).subspan(4, 4)) == hx[1]);
  CHECK(pool.is_cached(0));
  REQUIRE_INVARIANTS(pool);
}

TEST_CASE("chain hashes depend on the parent, the tokens, their order and the salt") {
  const auto b1 = iota_tokens(4, 1);
  const auto b1_other = iota_tokens(4, 2);
  const auto b2 = iota_tokens(4, 50);
  const uint64_t h1 = kv_block_pool::chain_hash(0, b1, 0);
  const uint64_t h1_other = kv_block_pool::chain_hash(0, b1_other, 0);
  CHECK(h1 != h1_other);
  // Same 2nd-block tokens after a different 1st block: different hash.
  CHECK(kv_block_pool::chain_hash(h1, b2, 0) != kv_block_pool::chain_hash(h1_other, b2, 0));
  CHECK(kv_block_pool::chain_hash(h1, b2, 0) == kv_block_pool::chain_hash(h1, b2, 0));
  CHECK(kv_block_pool::chain_hash(0, b1, 0) != kv_block_pool::chain_hash(0, b1, 1));
  const std::vector<token_id> swapped = {2, 1, 3, 4};
  CHECK(kv_block_pool::chain_hash(0, swapped, 0) != h1);

  // Never 0 (0 means "no parent"), and no collisions over a small exhaustive-ish sweep.
  std::vector<uint64_t> seen;
  for (uint64_t salt : std::initializer_list<uint64_t>{0, 1, ~0ULL})
    for (uint64_t parent : std::initializer_list<uint64_t>{0, 1, h1})
      for (token_id a = -2; a < 30; ++a)
        for (token_id b = 0; b < 30; ++b) {
          const std::vector<token_id> t = {a, b, 0, 0};
          const uint64_t h = kv_block_pool::chain_hash(parent, t, salt);
          REQUIRE(h != 0);
          seen.push_back(h);
        }
  std::sort(seen.begin(), seen.end());
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());

  // The salt separates models: a pool with another salt does not hit the first pool's hashes.
  kv_block_pool p0(k_blocks, k_bs, 0), p1(k_blocks, k_bs, 1);
  const auto s0 = fill(p0, b1);
  const auto s1 = fill(p1, b1);
  CHECK(p0.register_full(s0[0], 0, b1) != p1.register_full(s1[0], 0, b1));
}

TEST_CASE("a hash collision never hands out another prefix's blocks") {
  kv_block_pool pool(k_blocks, k_bs);
  const auto tx = iota_tokens(8, 1);    // X: blocks 0, 1
  const auto ty = iota_tokens(8, 100);  // Y: different first block, same hash (forged)
  const auto x = fill(pool, tx);
  CHECK(x == ids{0, 1});
  const uint64_t hy0 = kv_block_pool::chain_hash(0, std::span(ty).first(4), 0);
  kv_block_pool_test_access::rekey(pool, 0, hy0);  // X's head now sits where Y's head hashes
  std::string why;
  CHECK_FALSE(pool.check_invariants(&why));  // the forgery itself is caught
  CHECK(why == "block 0 hash does not match its content");

  // Lookup finds X's head under Y's hash, but the tokens differ: no hit.
  CHECK(pool.acquire_prefix(ty).empty());
  CHECK(pool.ref_count(0) == 1);

  // Y registers its own blocks. Its head cannot take the hash (X holds it) and stays
  // unregistered; the hash handed back is another one, so Y's second block chains from it and
  // can never be reached by a walk that matched X's head under the shared hash.
  auto y = pool.allocate(2);
  REQUIRE(y);
  CHECK(*y == ids{2, 3});
  const uint64_t h0 = pool.register_full(2, 0, std::span(ty).first(4));
  CHECK(h0 != hy0);
  CHECK(h0 != 0);
  CHECK_FALSE(pool.is_cached(2));
  const uint64_t h1 = pool.register_full(3, h0, std::span(ty).subspan(4, 4));
  CHECK(pool.is_cached(3));
  CHECK(h1 == kv_block_pool::chain_hash(h0, std::span(ty).subspan(4, 4), 0));
  CHECK(h1 != kv_block_pool::chain_hash(hy0, std::span(ty).subspan(4, 4), 0));

  kv_block_pool_test_access::rekey(pool, 0, kv_block_pool::chain_hash(0, std::span(tx).first(4), 0));
  REQUIRE_INVARIANTS(pool);
  pool.release(*y);
  pool.release(x);
  CHECK(pool.stats().free == 9);  // Y's head
  CHECK(pool.stats().cached == 3);
  REQUIRE_INVARIANTS(pool);
}

// The sliding-window release looks blocks up one at a time (worker/model/kv_window.hpp): a block
// anywhere in a chain, by its parent hash and content, without walking from the start.
TEST_CASE("holds and acquire_block find one registered block by parent and content, not its prefix") {
  kv_block_pool pool(k_blocks, k_bs);
  const auto t = iota_tokens(12, 1);
  const auto seq = fill(pool, t);  // blocks 0, 1, 2
  const uint64_t h0 = kv_block_pool::chain_hash(0, std::span(t).first(4), 0);
  const uint64_t h1 = kv_block_pool::chain_hash(h0, std::span(t).subspan(4, 4), 0);
  pool.release(seq);
  REQUIRE(pool.stats().cached == 3);
  // The third block alone, though the first is not asked for.
  CHECK(pool.holds(h1, std::span(t).subspan(8, 4)));
  CHECK_FALSE(pool.holds(h0, std::span(t).subspan(8, 4)));  // another parent
  CHECK_FALSE(pool.holds(h1, std::span(t).subspan(4, 4)));  // other content
  const auto stats_before = pool.stats();
  const auto b = pool.acquire_block(h1, std::span(t).subspan(8, 4));
  REQUIRE(b);
  CHECK(*b == 2);
  CHECK(pool.ref_count(2) == 1);
  CHECK(pool.stats().cached == 2);
  CHECK(pool.stats().in_use == 1);
  CHECK(pool.stats().prefix_query_tokens == stats_before.prefix_query_tokens);  // no prefix statistics
  CHECK_FALSE(pool.acquire_block(h0, std::span(t).subspan(8, 4)));
  REQUIRE_INVARIANTS(pool);
  // Evicted, it is gone; with prefix caching off nothing is found.
  pool.release(ids{2});
  auto all = pool.allocate(k_blocks);
  REQUIRE(all);
  pool.release(*all);
  CHECK_FALSE(pool.holds(h1, std::span(t).subspan(8, 4)));
  const auto again = fill(pool, t);
  pool.set_prefix_caching(false);
  CHECK_FALSE(pool.holds(h1, std::span(t).subspan(8, 4)));
  pool.release(again);
  REQUIRE_INVARIANTS(pool);
}

TEST_CASE("soak: random sequences keep every invariant and return to baseline") {
  constexpr int32_t n_blocks = 32;
  kv_block_pool pool(n_blocks, k_bs, 0x5eed);
  std::mt19937 rng(12345);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  // A few shared prompt prefixes (system prompts), and a small vocabulary so suffixes collide.
  std::vector<std::vector<token_id>> prefixes;
  for (int p = 0; p < 4; ++p) {
    std::vector<token_id> v(static_cast<size_t>(uniform(2, 14)));
    for (auto& t : v) t = uniform(0, 20);
    prefixes.push_back(v);
  }

  struct sequence {
    std::vector<token_id> tokens;
    std::vector<block_id> blocks;
    size_t n_registered = 0;  // leading full blocks registered (or acquired)
    uint64_t last_hash = 0;   // hash of block n_registered - 1
  };
  std::vector<sequence> live;
  // What each block holds, as the test knows it: the whole prefix up to the block's end, set
  // when its owner fills it. A prefix hit must hand back exactly this content.
  std::vector<std::vector<token_id>> written(n_blocks);

  auto register_new_full = [&](sequence& s) {
    while (s.n_registered < s.tokens.size() / k_bs) {
      const size_t i = s.n_registered;
      const block_id b = s.blocks[i];
      written[static_cast<size_t>(b)].assign(s.tokens.begin(), s.tokens.begin() + (i + 1) * k_bs);
      s.last_hash = pool.register_full(b, s.last_hash, std::span(s.tokens).subspan(i * k_bs, k_bs));
      ++s.n_registered;
    }
  };
  auto grow_blocks = [&](sequence& s) -> bool {
    const size_t need = (s.tokens.size() + k_bs - 1) / k_bs;
    if (need <= s.blocks.size()) return true;
    auto more = pool.allocate(static_cast<int32_t>(need - s.blocks.size()));
    if (!more) return false;
    for (block_id b : *more) written[static_cast<size_t>(b)].clear();
    s.blocks.insert(s.blocks.end(), more->begin(), more->end());
    return true;
  };
  auto finish = [&](size_t i) {
    pool.release(live[i].blocks);
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
  };

  int n_started = 0, n_no_room = 0, n_preempted = 0, n_at_limit = 0;
  for (int op = 0; op < 20000; ++op) {
    const int kind = uniform(0, 9);
    if (kind < 3 && live.size() < 8) {
      sequence s;
      s.tokens = prefixes[static_cast<size_t>(uniform(0, 3))];
      const int n_suffix = uniform(0, 10);
      for (int k = 0; k < n_suffix; ++k) s.tokens.push_back(uniform(0, 20));
      s.blocks = pool.acquire_prefix(s.tokens);
      for (size_t i = 0; i < s.blocks.size(); ++i) {
        const auto& w = written[static_cast<size_t>(s.blocks[i])];
        REQUIRE(w == std::vector<token_id>(s.tokens.begin(), s.tokens.begin() + (i + 1) * k_bs));
        s.last_hash = kv_block_pool::chain_hash(s.last_hash, std::span(s.tokens).subspan(i * k_bs, k_bs), 0x5eed);
      }
      s.n_registered = s.blocks.size();
      if (!grow_blocks(s)) {
        pool.release(s.blocks);
        ++n_no_room;
      } else {
        register_new_full(s);
        live.push_back(std::move(s));
        ++n_started;
      }
    } else if (kind < 7 && !live.empty()) {
      const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(live.size()) - 1));
      sequence& s = live[i];
      const int n_new = uniform(1, 5);
      for (int k = 0; k < n_new; ++k) s.tokens.push_back(uniform(0, 20));
      if (s.tokens.size() > 40) {
        finish(i);
        ++n_at_limit;
      } else if (!grow_blocks(s)) {
        finish(i);  // preempted: no block for its next tokens
        ++n_preempted;
      } else {
        register_new_full(s);
      }
    } else if (!live.empty()) {
      finish(static_cast<size_t>(uniform(0, static_cast<int>(live.size()) - 1)));
    }

    REQUIRE_INVARIANTS(pool);
    // Every block's ref count equals the number of live sequences holding it.
    std::vector<int32_t> holders(n_blocks, 0);
    for (const auto& s : live)
      for (block_id b : s.blocks) ++holders[static_cast<size_t>(b)];
    for (block_id b = 0; b < n_blocks; ++b) REQUIRE(pool.ref_count(b) == holders[static_cast<size_t>(b)]);
  }

  while (!live.empty()) finish(live.size() - 1);
  REQUIRE_INVARIANTS(pool);
  const auto st = pool.stats();
  INFO("started " << n_started << ", no room at start " << n_no_room << ", preempted " << n_preempted
                  << ", at length limit " << n_at_limit << ", hit tokens " << st.prefix_hit_tokens << " of "
                  << st.prefix_query_tokens << ", evictions " << st.evictions);
  CHECK(st.in_use == 0);
  CHECK(st.free + st.cached == n_blocks);
  CHECK(pool.n_available() == n_blocks);
  // The soak exercised what it claims to: prefix hits, evictions and running out of room.
  CHECK(st.prefix_hit_tokens > 0);
  CHECK(st.evictions > 0);
  CHECK(n_started > 1000);
  CHECK(n_no_room > 0);
  CHECK(n_preempted > 0);
  CHECK(n_at_limit > 0);
}

TEST_CASE("the event log records each new registration and each eviction, in order") {
  kv_block_pool pool(4, k_bs, 0);
  std::vector<kv_block_event> ev;
  CHECK(pool.take_events(ev));  // off: nothing recorded
  CHECK(ev.empty());
  pool.record_events(true, 100);
  const auto a = pool.allocate(2);
  REQUIRE(a);
  const auto ha = register_all(pool, *a, iota_tokens(8, 0));
  REQUIRE(pool.take_events(ev));
  CHECK(ev == std::vector<kv_block_event>{{ha[0], true}, {ha[1], true}});
  ev.clear();
  // A duplicate of a registered block is no new registration; re-registering is a no-op.
  const auto dup = pool.allocate(1);
  REQUIRE(dup);
  CHECK(pool.register_full((*dup)[0], 0, iota_tokens(4, 0)) == ha[0]);
  CHECK(pool.register_full((*a)[0], 0, iota_tokens(4, 0)) == ha[0]);
  REQUIRE(pool.take_events(ev));
  CHECK(ev.empty());
  pool.release(*dup);
  pool.release(*a);  // cached, not evicted: no event
  REQUIRE(pool.take_events(ev));
  CHECK(ev.empty());
  // Three new blocks: one free block, then the two cached ones evicted (tail first).
  const auto b = pool.allocate(4);
  REQUIRE(b);
  const auto hb = register_all(pool, *b, iota_tokens(4, 100));
  REQUIRE(pool.take_events(ev));
  CHECK(ev == std::vector<kv_block_event>{{ha[1], false}, {ha[0], false}, {hb[0], true}});
  CHECK(pool.registered_hashes() == std::vector<uint64_t>{hb[0]});
}

TEST_CASE("an untaken event log stays bounded and reports the loss once") {
  kv_block_pool pool(8, k_bs, 0);
  pool.record_events(true, 3);
  const auto a = pool.allocate(4);
  REQUIRE(a);
  register_all(pool, *a, iota_tokens(16, 0));  // 4 events into a log of 3
  std::vector<kv_block_event> ev;
  CHECK_FALSE(pool.take_events(ev));
  CHECK(ev.empty());
  CHECK(pool.take_events(ev));  // recording goes on, from empty
  CHECK(pool.registered_hashes().size() == 4);
}

TEST_CASE("soak: replaying the event log reproduces the registered set after every operation") {
  constexpr int32_t n_blocks = 16;
  kv_block_pool pool(n_blocks, k_bs, 0x5eed);
  pool.record_events(true, 1000);
  std::mt19937 rng(777);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<block_id>> live;
  std::set<uint64_t> mirror;  // what a router applying the events in order holds
  std::vector<kv_block_event> ev;
  size_t n_events = 0;
  for (int op = 0; op < 5000; ++op) {
    if (uniform(0, 2) < 2 && live.size() < 4) {
      std::vector<token_id> tokens(static_cast<size_t>(uniform(4, 16)));
      for (auto& t : tokens) t = uniform(0, 6);  // small vocabulary: shared prefixes happen
      auto blocks = pool.acquire_prefix(tokens);
      const size_t need = (tokens.size() + k_bs - 1) / k_bs;
      auto more = pool.allocate(static_cast<int32_t>(need - blocks.size()));
      if (!more) {
        pool.release(blocks);
      } else {
        blocks.insert(blocks.end(), more->begin(), more->end());
        register_all(pool, blocks, tokens);
        live.push_back(std::move(blocks));
      }
    } else if (!live.empty()) {
      const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(live.size()) - 1));
      pool.release(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ev.clear();
    REQUIRE(pool.take_events(ev));
    n_events += ev.size();
    for (const auto& e : ev) {
      if (e.stored) {
        REQUIRE(mirror.insert(e.hash).second);  // never stored twice without an eviction between
      } else {
        REQUIRE(mirror.erase(e.hash) == 1);  // only what was stored is evicted
      }
    }
    const auto now = pool.registered_hashes();
    REQUIRE(mirror == std::set<uint64_t>(now.begin(), now.end()));
  }
  INFO("events " << n_events << ", evictions " << pool.stats().evictions);
  CHECK(pool.stats().evictions > 100);
}
