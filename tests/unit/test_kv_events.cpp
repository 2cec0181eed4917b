// KV block events end to end without sockets: the worker's pool and publisher
// (worker/service/kv_publisher) on one side, the wire (encode, decode) in between, a router's view
// (router/fleet/kv_view) on the other. The view equals the pool's registered set after every step,
// also when messages are lost (a gap asks for a snapshot) and when the publisher's log overflows.
#include <catch2/catch.hpp>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/kv_hash.hpp"
#include "router/fleet/kv_view.hpp"
#include "worker/engine/kv_block_pool.hpp"
#include "worker/service/kv_publisher.hpp"

using namespace sy;

namespace {

constexpr int32_t k_bs = 4;

// What a router receives: the message encoded and decoded, as on the link.
proto::kv_events over_the_wire(const proto::kv_events& m) {
  const auto r = proto::decode("kv_events", proto::encode(m));
  REQUIRE(r.ok());
  return *r.get_if<proto::kv_events>();
}

std::set<uint64_t> registered(const kv_block_pool& pool) {
  const auto v = pool.registered_hashes();
  return {v.begin(), v.end()};
}

bool view_equals(const router::kv_view& view, const std::set<uint64_t>& want) {
  if (view.size() != want.size()) return false;
  for (const uint64_t h : want)
    if (!view.holds(h)) return false;
  return true;
}

// A sequence of `tokens` in the pool, every full block registered.
std::vector<block_id> fill(kv_block_pool& pool, const std::vector<int32_t>& tokens) {
  auto blocks = pool.acquire_prefix(tokens);
  const size_t need = (tokens.size() + k_bs - 1) / k_bs;
  auto more = pool.allocate(static_cast<int32_t>(need - blocks.size()));
  if (!more) {
    pool.release(blocks);
    return {};
  }
  blocks.insert(blocks.end(), more->begin(), more->end());
  uint64_t parent = 0;
  for (size_t i = 0; i < tokens.size() / k_bs; ++i)
    parent = pool.register_full(blocks[i], parent, std::span(tokens).subspan(i * k_bs, k_bs));
  return blocks;
}

}  // namespace

TEST_CASE("kv events: netting keeps each hash once, with its last state") {
  std::vector<uint64_t> stored, evicted;
  net_kv_events(std::vector<kv_block_event>{{1, true}, {2, true}, {1, false}, {3, false}, {3, true}, {2, false}},
                stored, evicted);
  CHECK(stored == std::vector<uint64_t>{3});
  CHECK(evicted == std::vector<uint64_t>{1, 2});
}

TEST_CASE("kv events: the router's hash of a prompt is the worker's hash of its blocks") {
  kv_block_pool pool(8, k_bs, kv_model_salt("SmolLM2/model.gguf"));
  pool.record_events(true, 100);
  const std::vector<int32_t> prompt = {5, 9, 1, 7, 3, 3, 3, 8, 2, 0};  // 2 full blocks + 2 tokens
  const auto blocks = fill(pool, prompt);
  REQUIRE(blocks.size() == 3);
  const auto want = kv_block_hashes(prompt, k_bs, kv_model_salt("SmolLM2/model.gguf"));
  REQUIRE(want.size() == 2);
  CHECK(registered(pool) == std::set<uint64_t>(want.begin(), want.end()));
  // Another salt (another model) shares nothing.
  const auto other = kv_block_hashes(prompt, k_bs, kv_model_salt("Qwen2/model.gguf"));
  CHECK(other[0] != want[0]);
  CHECK(kv_block_hashes(prompt, 0, 1).empty());
}

TEST_CASE("kv events: a subscriber's view is exact after every step, through losses and overflows") {
  kv_block_pool pool(24, k_bs, 0x5a17);
  kv_publisher pub(pool, "m");
  router::kv_view view;
  view.set_capacity(24);
  router::kv_view_counters c;
  std::vector<kv_publisher::addressed> out;
  std::mt19937 rng(4242);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  // Delivers what the publisher produced, dropping each message with probability `loss`; a
  // view gone stale asks for a snapshot (as the router does on a gap).
  auto deliver = [&](double loss) {
    for (const auto& [peer, m] : out) {
      REQUIRE(peer == "router-1");
      REQUIRE(m.model_id == "m");
      REQUIRE(m.stored.size() <= proto::k_max_kv_hashes);
      if (std::uniform_real_distribution<double>(0, 1)(rng) < loss) continue;
      view.apply(over_the_wire(m), c);
    }
    out.clear();
    if (view.wants_snapshot()) {
      pub.resync("router-1", out);
      for (const auto& [peer, m] : out) view.apply(over_the_wire(m), c);
      out.clear();
    }
  };

  // A router that never subscribed gets nothing, and its resync is ignored.
  pub.resync("stranger", out);
  CHECK(out.empty());
  pub.subscribe("router-1", out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].second.reset);
  CHECK(out[0].second.seq == 1);
  deliver(0);
  CHECK(view.exact());

  std::vector<std::vector<block_id>> live;
  int n_exact_checks = 0;
  for (int step = 0; step < 3000; ++step) {
    // A few changes per "engine step".
    for (int k = uniform(1, 3); k > 0; --k) {
      if (uniform(0, 2) < 2 && live.size() < 5) {
        std::vector<int32_t> tokens(static_cast<size_t>(uniform(4, 20)));
        for (auto& t : tokens) t = uniform(0, 5);
        auto b = fill(pool, tokens);
        if (!b.empty()) live.push_back(std::move(b));
      } else if (!live.empty()) {
        const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(live.size()) - 1));
        pool.release(live[i]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    pub.publish(out);
    deliver(step % 500 < 100 ? 0.2 : 0.0);  // stretches with 20 % loss
    // A heartbeat names the last seq sent: a lost last message shows there (then a snapshot).
    view.check_last_seq(pub.last_seq("router-1"), c);
    deliver(0);
    if (view.exact()) {
      REQUIRE(view_equals(view, registered(pool)));
      ++n_exact_checks;
    }
  }
  INFO("gaps " << c.gaps << ", snapshots " << c.snapshots << ", exact checks " << n_exact_checks);
  CHECK(c.gaps > 10);
  CHECK(c.snapshots > 10);
  CHECK(n_exact_checks > 2000);
  CHECK(pub.counters().resyncs == c.snapshots - 1);

  // The pool's log overflows (steps not published): the next publish is a snapshot instead.
  for (int i = 0; i < 3000; ++i) {
    std::vector<int32_t> tokens = {i, i + 1, i + 2, i + 3, i + 4, i + 5, i + 6, i + 7};
    auto b = fill(pool, tokens);
    if (!b.empty()) pool.release(b);
  }
  pub.publish(out);
  REQUIRE_FALSE(out.empty());
  CHECK(out[0].second.reset);
  CHECK(pub.counters().overflows == 1);
  deliver(0);
  CHECK(view.exact());
  CHECK(view_equals(view, registered(pool)));
  // Gone: nothing more for it.
  pub.unsubscribe("router-1");
  fill(pool, {90, 91, 92, 93});
  pub.publish(out);
  CHECK(out.empty());
}

TEST_CASE("kv events: a snapshot larger than one message is split, the first part resets") {
  const int32_t n = static_cast<int32_t>(proto::k_max_kv_hashes) + 100;
  kv_block_pool pool(n, 1, 0);
  kv_publisher pub(pool, "m");
  const auto blocks = pool.allocate(n);
  REQUIRE(blocks);
  for (int32_t i = 0; i < n; ++i) pool.register_full((*blocks)[static_cast<size_t>(i)], 0, std::vector<int32_t>{i});
  std::vector<kv_publisher::addressed> out;
  pub.publish(out);  // no subscriber yet: the events are dropped
  CHECK(out.empty());
  pub.subscribe("r", out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].second.reset);
  CHECK_FALSE(out[1].second.reset);
  CHECK(out[1].second.seq == out[0].second.seq + 1);
  CHECK(out[0].second.stored.size() + out[1].second.stored.size() == static_cast<size_t>(n));
  router::kv_view view;
  view.set_capacity(static_cast<size_t>(n));
  router::kv_view_counters c;
  for (const auto& [peer, m] : out) view.apply(over_the_wire(m), c);
  CHECK(view.exact());
  CHECK(view.size() == static_cast<size_t>(n));
  // A step that evicts more than one message holds is split too, with contiguous seqs.
  out.clear();
  pool.release(*blocks);
  const auto again = pool.allocate(n);  // evicts every cached block
  REQUIRE(again);
  pub.publish(out);
  REQUIRE(out.size() == 2);
  for (const auto& [peer, m] : out) view.apply(over_the_wire(m), c);
  CHECK(view.exact());
  CHECK(view.size() == 0);
}
