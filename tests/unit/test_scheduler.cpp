// The continuous-batching scheduler, driven by a fake forward (no model) over the real
// kv_block_pool. The fake keeps the token each KV slot holds, so every step also checks that a
// sequence reads exactly its own tokens through its block table and only writes into blocks it
// owns alone (ref 1, unregistered).
#define CATCH_CONFIG_ENABLE_PAIR_STRINGMAKER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "worker/engine/kv_block_pool.hpp"
#include "worker/engine/scheduler.hpp"
#include "worker/model/kv_window.hpp"

using namespace sy;

namespace {

constexpr token_id k_eos = 2;
using ran_step = std::vector<std::pair<request_id, int32_t>>;  // (id, tokens fed), plan order

// Tokens [base, base + n).
std::vector<token_id> prompt_of(int32_t n, token_id base) {
  std::vector<token_id> p(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = base + i;
  return p;
}

std::vector<token_id> concat(std::vector<token_id> a, const std::vector<token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The token the fake model samples as output number `n_out` of request `id`.
token_id token_for(request_id id, size_t n_out) { return static_cast<token_id>(id * 1000 + n_out + 10); }

struct fake_engine {
  kv_block_pool pool;
  // The sliding-window release (worker/model/kv_window.hpp): the windowed layers' pool, its window
  // (0: none) and its simulated KV.
  kv_block_pool window_pool;
  int64_t window;
  scheduler sched;
  scheduler_config cfg;
  int32_t bs;
  std::vector<std::vector<token_id>> kv;            // [block][slot]: token held, -1 none
  std::vector<std::vector<token_id>> window_cells;  // the same for the window pool's blocks
  std::map<request_id, std::vector<token_id>> seq;  // expected prompt + outputs
  std::map<request_id, int32_t> n_prompt, max_tokens, stop_at;
  std::map<request_id, finished_request> finished;
  std::vector<ran_step> ran;
  std::vector<std::vector<bool>> decode;           // per step, per seq: feeds a sampled token
  std::vector<std::vector<request_id>> preempted;  // per step
  int64_t now = 0;

  // `n_window_blocks` > 0: a window pool of that many blocks for layers of window `w`.
  fake_engine(int32_t n_blocks, int32_t block_size, scheduler_config c = {}, int32_t n_window_blocks = 0, int64_t w = 0)
      : pool(n_blocks, block_size),
        window_pool(n_window_blocks, block_size),
        window(w),
        sched(pool, c, n_window_blocks > 0 ? window_kv{&window_pool, w} : window_kv{}),
        cfg(c),
        bs(block_size),
        kv(static_cast<size_t>(n_blocks), std::vector<token_id>(static_cast<size_t>(block_size), -1)),
        window_cells(static_cast<size_t>(n_window_blocks), std::vector<token_id>(static_cast<size_t>(block_size), -1)) {
  }

  // The simulated KV slot of position `p` in a sequence with block table `table`.
  token_id& slot(const std::vector<block_id>& table, size_t p) {
    const auto b = static_cast<size_t>(bs);
    return kv[static_cast<size_t>(table[p / b])][p % b];
  }
  token_id& window_slot(const std::vector<block_id>& table, size_t p) {
    const auto b = static_cast<size_t>(bs);
    return window_cells[static_cast<size_t>(table[p / b])][p % b];
  }

  // `stop_after`: the engine reports stop (EOS) with output number stop_after (1-based).
  add_status add(request_id id, std::vector<token_id> prompt, int32_t max_tok, int32_t priority = 0,
                 std::optional<int64_t> deadline = {}, int32_t stop_after = 0) {
    seq[id] = prompt;
    n_prompt[id] = static_cast<int32_t>(prompt.size());
    max_tokens[id] = max_tok;
    if (stop_after > 0) stop_at[id] = stop_after;
    return sched.add(request_spec{id, std::move(prompt), max_tok, priority, deadline});
  }

  void record_finished(const std::vector<finished_request>& done) {
    for (const auto& f : done) {
      INFO("request " << f.id << " reason " << name(f.reason));
      REQUIRE(finished.count(f.id) == 0);  // reported exactly once
      REQUIRE_FALSE(sched.state(f.id).has_value());
      CHECK(f.usage.n_prompt == n_prompt[f.id]);
      CHECK(f.usage.n_completion == static_cast<int32_t>(seq[f.id].size()) - n_prompt[f.id]);
      if (f.reason == finish_reason::length) CHECK(f.usage.n_completion == max_tokens[f.id]);
      if (f.reason == finish_reason::stop) CHECK(seq[f.id].back() == k_eos);
      finished[f.id] = f;
    }
  }

  step_plan schedule() {
    step_plan plan = sched.schedule(now);
    record_finished(plan.finished);
    preempted.push_back(plan.preempted);
    ran_step r;
    std::vector<bool> d;
    int32_t n_total = 0;
    std::set<request_id> ids;
    for (const auto& q : plan.seqs) {
      r.push_back({q.id, static_cast<int32_t>(q.tokens.size())});
      d.push_back(q.pos0 >= n_prompt[q.id]);
      n_total += static_cast<int32_t>(q.tokens.size());
      REQUIRE(ids.insert(q.id).second);
    }
    ran.push_back(r);
    decode.push_back(d);
    REQUIRE(plan.n_tokens == n_total);
    REQUIRE(n_total <= cfg.max_tokens_per_step);
    REQUIRE(sched.n_running() <= cfg.max_running);
    return plan;
  }

  // The fake forward: checks reads and writes against the simulated KV, then samples.
  std::vector<sampled_token> forward(const step_plan& plan) {
    for (const auto& q : plan.seqs) {  // all reads before any write, as one batched forward
      INFO("step " << plan.step << " request " << q.id << " pos0 " << q.pos0);
      const auto& want = seq.at(q.id);
      const size_t end = static_cast<size_t>(q.pos0) + q.tokens.size();
      REQUIRE(!q.tokens.empty());
      REQUIRE(end <= want.size());
      REQUIRE(q.sample == (end == want.size()));
      REQUIRE(std::equal(q.tokens.begin(), q.tokens.end(), want.begin() + q.pos0));
      const auto b_size = static_cast<size_t>(bs);
      REQUIRE(q.block_table.size() == (end + b_size - 1) / b_size);
      for (size_t p = 0; p < static_cast<size_t>(q.pos0); ++p)
        REQUIRE(slot(q.block_table, p) == want[p]);  // reads its own tokens, nothing stale
      for (size_t p = static_cast<size_t>(q.pos0); p < end; ++p) {
        const block_id b = q.block_table[p / b_size];
        REQUIRE(pool.ref_count(b) == 1);
        REQUIRE_FALSE(pool.is_cached(b));
      }
      if (window == 0) {
        REQUIRE(q.window_table.empty());
        continue;
      }
      // The windowed layers: the window of the chunk's first token is all there, its own tokens.
      REQUIRE(q.window_table.size() == q.block_table.size());
      const auto first = static_cast<size_t>(std::max<int64_t>(0, q.pos0 - window + 1));
      for (size_t j = 0; j < first / b_size; ++j) CHECK(q.window_table[j] == k_released_block);
      for (size_t p = first; p < static_cast<size_t>(q.pos0); ++p) REQUIRE(window_slot(q.window_table, p) == want[p]);
      for (size_t p = static_cast<size_t>(q.pos0); p < end; ++p) {
        const block_id b = q.window_table[p / b_size];
        REQUIRE(b != k_released_block);
        REQUIRE(window_pool.ref_count(b) == 1);
        REQUIRE_FALSE(window_pool.is_cached(b));
      }
    }
    std::vector<sampled_token> out;
    for (const auto& q : plan.seqs) {
      for (size_t i = 0; i < q.tokens.size(); ++i) {
        slot(q.block_table, static_cast<size_t>(q.pos0) + i) = q.tokens[i];
        if (window > 0) window_slot(q.window_table, static_cast<size_t>(q.pos0) + i) = q.tokens[i];
      }
      if (!q.sample) continue;
      const size_t n_out = seq[q.id].size() - static_cast<size_t>(n_prompt[q.id]);
      const bool stop = stop_at.count(q.id) && static_cast<int32_t>(n_out) + 1 == stop_at[q.id];
      out.push_back({q.id, stop ? k_eos : token_for(q.id, n_out), stop});
    }
    return out;
  }

  void update(const step_plan& plan, const std::vector<sampled_token>& sampled) {
    for (const auto& t : sampled)
      if (sched.state(t.id) == request_state::running) seq[t.id].push_back(t.token);
    record_finished(sched.update(plan, sampled));
    std::string why;
    if (!sched.check_invariants(&why)) FAIL("step " << plan.step << ": " << why);
  }

  step_plan step() {
    step_plan plan = schedule();
    update(plan, forward(plan));
    ++now;
    return plan;
  }

  bool idle() const { return sched.n_running() == 0 && sched.n_waiting() == 0; }

  int run_until_idle(int max_steps) {
    int n = 0;
    while (!idle() && n < max_steps) {
      step();
      ++n;
    }
    REQUIRE(idle());
    return n;
  }

  // First step (0-based) in which `id` ran, and its place in that step's plan.
  std::pair<size_t, size_t> first_run(request_id id) const {
    for (size_t s = 0; s < ran.size(); ++s)
      for (size_t i = 0; i < ran[s].size(); ++i)
        if (ran[s][i].first == id) return {s, i};
    return {ran.size(), 0};
  }

  int32_t tokens_fed(request_id id) const {
    int32_t n = 0;
    for (const auto& s : ran)
      for (const auto& [rid, k] : s)
        if (rid == id) n += k;
    return n;
  }

  void require_baseline() {
    std::string why;
    if (!pool.check_invariants(&why)) FAIL(why);
    REQUIRE(pool.stats().in_use == 0);
    REQUIRE(pool.stats().free + pool.stats().cached == pool.n_blocks());
    if (!window_pool.check_invariants(&why)) FAIL(why);
    REQUIRE(window_pool.stats().in_use == 0);
    REQUIRE(window_pool.stats().free + window_pool.stats().cached == window_pool.n_blocks());
  }
};

ran_step rs(std::initializer_list<std::pair<request_id, int32_t>> l) { return ran_step(l); }

}  // namespace

TEST_CASE("admission follows priority, then arrival, within max_running") {
  scheduler_config cfg;
  cfg.max_running = 2;
  fake_engine e(64, 4, cfg);
  e.add(1, prompt_of(4, 100), 3, 5);
  e.add(2, prompt_of(4, 200), 3, 1);
  e.add(3, prompt_of(4, 300), 3, 1);
  e.add(4, prompt_of(4, 400), 3, 0);
  CHECK(e.sched.n_waiting() == 4);
  e.run_until_idle(20);
  const std::vector<ran_step> want = {
      rs({{4, 4}, {2, 4}}), rs({{4, 1}, {2, 1}}), rs({{4, 1}, {2, 1}}),
      rs({{3, 4}, {1, 4}}), rs({{3, 1}, {1, 1}}), rs({{3, 1}, {1, 1}}),
  };
  CHECK(e.ran == want);
  for (request_id id : {1, 2, 3, 4}) {
    CHECK(e.finished[id].reason == finish_reason::length);
    CHECK(e.seq[id].back() == token_for(id, 2));
  }
  e.require_baseline();
}

TEST_CASE("add refuses a request the whole pool cannot hold") {
  kv_block_pool pool(4, 4);
  scheduler s(pool);
  CHECK(s.add({1, prompt_of(10, 100), 7, 0, {}}) == add_status::ok);  // 16 positions: 4 blocks
  CHECK(s.add({2, prompt_of(10, 100), 8, 0, {}}) == add_status::exceeds_kv_capacity);
  CHECK(s.n_waiting() == 1);
}

TEST_CASE("a head that does not fit blocks the requests behind it") {
  fake_engine e(8, 4);
  e.add(1, prompt_of(20, 100), 8);  // 5 blocks, growing to 7
  e.step();                         // only 1 is admitted before 2 and 3 arrive
  e.add(2, prompt_of(16, 200), 2);  // needs 4 blocks at once
  e.add(3, prompt_of(2, 300), 2);   // would fit in one, but must not pass 2
  e.run_until_idle(40);
  for (size_t s = 0; s <= 7; ++s)  // 1 alone until it finishes (8 outputs, one per step)
    for (const auto& [id, n] : e.ran[s]) CHECK(id == 1);
  CHECK(e.finished[1].reason == finish_reason::length);
  CHECK(e.first_run(2) == std::pair<size_t, size_t>{8, 0});
  CHECK(e.first_run(3) == std::pair<size_t, size_t>{8, 1});
  e.require_baseline();
}

TEST_CASE("chunked prefill: a long prompt goes in budget-sized chunks and samples after the last") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 32;

  SECTION("alone: 32/32/32/4") {
    fake_engine e(64, 4, cfg);
    e.add(1, prompt_of(100, 1000), 2);
    std::vector<int64_t> pos0;
    std::vector<bool> sampled;
    for (int i = 0; i < 4; ++i) {
      const step_plan p = e.step();
      REQUIRE(p.seqs.size() == 1);
      pos0.push_back(p.seqs[0].pos0);
      sampled.push_back(p.seqs[0].sample);
    }
    CHECK(e.ran == std::vector<ran_step>{rs({{1, 32}}), rs({{1, 32}}), rs({{1, 32}}), rs({{1, 4}})});
    CHECK(pos0 == std::vector<int64_t>{0, 32, 64, 96});
    CHECK(sampled == std::vector<bool>{false, false, false, true});
    e.run_until_idle(4);
    CHECK(e.ran.back() == rs({{1, 1}}));
    e.require_baseline();
  }

  SECTION("sharing the budget with a decode, which goes first") {
    fake_engine e(64, 4, cfg);
    e.add(1, prompt_of(4, 100), 10);
    e.add(2, prompt_of(100, 1000), 2);
    for (int i = 0; i < 4; ++i) e.step();
    CHECK(e.ran == std::vector<ran_step>{rs({{1, 4}, {2, 28}}), rs({{1, 1}, {2, 31}}), rs({{1, 1}, {2, 31}}),
                                         rs({{1, 1}, {2, 10}})});
    CHECK(e.seq[2].size() == 101);  // sampled once, after its last chunk
    e.run_until_idle(20);
    e.require_baseline();
  }
}

TEST_CASE("decodes of running sequences are scheduled before prefill chunks") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 8;
  fake_engine e(64, 4, cfg);
  for (request_id id = 1; id <= 4; ++id) e.add(id, prompt_of(1, static_cast<token_id>(100 * id)), 30);
  e.add(9, prompt_of(40, 5000), 2, /*priority*/ 1);
  for (int i = 0; i < 3; ++i) e.step();
  const ran_step decodes_then_chunk = rs({{1, 1}, {2, 1}, {3, 1}, {4, 1}, {9, 4}});
  CHECK(e.ran == std::vector<ran_step>(3, decodes_then_chunk));
  // A more urgent prompt arriving now waits for budget, but once admitted its chunks still go
  // after every decode.
  e.add(10, prompt_of(40, 6000), 2, /*priority*/ -1);
  e.run_until_idle(100);
  int n_mixed = 0;
  for (size_t s = 0; s < e.ran.size(); ++s) {
    INFO("step " << s);
    bool seen_chunk = false, seen_decode = false;
    for (size_t i = 0; i < e.ran[s].size(); ++i) {
      if (e.decode[s][i]) {
        CHECK_FALSE(seen_chunk);
        seen_decode = true;
      } else {
        seen_chunk = true;
      }
    }
    n_mixed += seen_decode && seen_chunk;
  }
  CHECK(n_mixed >= 15);
  // Running prefills keep the budget (as vLLM): 10 starts once 9's 40 tokens are in (4 a step).
  CHECK(e.first_run(10).first == 10);
  e.require_baseline();
}

TEST_CASE("prefix caching: a shared 3-block prefix is reused, a whole-prompt hit still computes") {
  fake_engine e(64, 4);
  const auto prefix = prompt_of(12, 7000);  // 3 blocks of 4
  e.add(1, concat(prefix, prompt_of(5, 100)), 3);
  e.run_until_idle(10);
  CHECK(e.finished[1].usage.n_cached_prompt == 0);

  e.add(2, concat(prefix, prompt_of(6, 200)), 3);
  const step_plan p2 = e.step();
  REQUIRE(p2.seqs.size() == 1);
  CHECK(p2.seqs[0].pos0 == 12);
  CHECK(p2.seqs[0].tokens.size() == 6);
  CHECK(e.sched.usage(2)->n_cached_prompt == 12);
  e.run_until_idle(10);
  CHECK(e.finished[2].usage.n_cached_prompt == 12);
  CHECK(e.tokens_fed(2) == 6 + 2);  // prefill 6, then 2 decodes

  SECTION("whole prompt cached: the last block is recomputed in a fresh block") {
    e.add(3, prefix, 2);
    const step_plan p3 = e.step();
    REQUIRE(p3.seqs.size() == 1);
    CHECK(p3.seqs[0].pos0 == 8);
    CHECK(p3.seqs[0].tokens.size() == 4);
    CHECK(p3.seqs[0].sample);
    e.run_until_idle(10);
    CHECK(e.finished[3].usage.n_cached_prompt == 8);
  }

  SECTION("two running requests share the prefix blocks") {
    e.add(4, concat(prefix, prompt_of(3, 300)), 4);
    e.add(5, concat(prefix, prompt_of(7, 400)), 4);
    const step_plan p = e.step();
    REQUIRE(p.seqs.size() == 2);
    for (int i = 0; i < 3; ++i) {
      CHECK(p.seqs[0].block_table[static_cast<size_t>(i)] == p.seqs[1].block_table[static_cast<size_t>(i)]);
      CHECK(e.pool.ref_count(p.seqs[0].block_table[static_cast<size_t>(i)]) == 2);
    }
    e.run_until_idle(10);
    CHECK(e.finished[4].usage.n_cached_prompt == 12);
    CHECK(e.finished[5].usage.n_cached_prompt == 12);
  }
  e.require_baseline();
  CHECK(e.pool.stats().cached > 0);
}

TEST_CASE("out of blocks: the most recent sequence is preempted, requeued in place, and finishes") {
  fake_engine e(8, 4);  // 32 token slots; each request grows to 23 positions (6 blocks)
  for (request_id id = 1; id <= 3; ++id) e.add(id, prompt_of(4, static_cast<token_id>(100 * id)), 20);
  size_t first_preemption = 0;
  while (e.sched.n_preemptions() == 0) {
    e.step();
    REQUIRE(e.ran.size() < 20);
  }
  first_preemption = e.ran.size() - 1;
  CHECK(e.preempted[first_preemption] == std::vector<request_id>{3});
  CHECK(e.sched.state(3) == request_state::preempted);
  // A later arrival of the same priority does not pass the preempted request.
  e.add(4, prompt_of(4, 400), 3);
  e.run_until_idle(200);
  for (request_id id = 1; id <= 4; ++id) {
    INFO("request " << id);
    CHECK(e.finished[id].reason == finish_reason::length);
    CHECK(e.finished[id].usage.n_completion == e.max_tokens[id]);
    for (size_t i = 0; i < static_cast<size_t>(e.max_tokens[id]); ++i) CHECK(e.seq[id][4 + i] == token_for(id, i));
  }
  CHECK(e.finished[3].usage.n_preemptions >= 1);
  // 3 resumes (recompute) before 4 first runs.
  size_t resumed = 0;
  for (size_t s = first_preemption + 1; s < e.ran.size() && resumed == 0; ++s)
    for (const auto& [id, n] : e.ran[s])
      if (id == 3) resumed = s;
  CHECK(resumed > 0);
  const auto [s4, i4] = e.first_run(4);
  CHECK((resumed < s4 || (resumed == s4 && e.ran[s4][0].first == 3)));
  e.require_baseline();
}

TEST_CASE("the lowest priority sequence is the one preempted") {
  fake_engine e(8, 4);
  e.add(1, prompt_of(4, 100), 20, 0);
  e.add(2, prompt_of(4, 200), 20, 7);  // admitted before 3 but less urgent
  e.add(3, prompt_of(4, 300), 20, 1);
  while (e.sched.n_preemptions() == 0) {
    e.step();
    REQUIRE(e.ran.size() < 20);
  }
  CHECK(e.preempted.back() == std::vector<request_id>{2});
  e.run_until_idle(200);
  for (request_id id = 1; id <= 3; ++id) CHECK(e.finished[id].usage.n_completion == 20);
  e.require_baseline();
}

TEST_CASE("a more urgent later arrival goes before less urgent waiting requests") {
  scheduler_config cfg;
  cfg.max_running = 1;

  SECTION("without priority preemption it waits for the slot, then passes the queue") {
    cfg.preempt_for_priority = false;
    fake_engine e(64, 4, cfg);
    e.add(1, prompt_of(4, 100), 4, 5);
    e.add(2, prompt_of(4, 200), 4, 5);
    e.step();
    e.add(3, prompt_of(4, 300), 4, 0);
    e.run_until_idle(30);
    CHECK(e.first_run(1).first == 0);
    CHECK(e.first_run(3).first == 4);
    CHECK(e.first_run(2).first == 8);
    CHECK(e.sched.n_preemptions() == 0);
    e.require_baseline();
  }

  SECTION("with priority preemption it takes the slot of the less urgent running one") {
    fake_engine e(64, 4, cfg);
    e.add(1, prompt_of(4, 100), 4, 5);
    e.add(2, prompt_of(4, 200), 4, 5);
    e.step();
    e.add(3, prompt_of(4, 300), 4, 0);
    const step_plan p = e.step();
    CHECK(p.preempted == std::vector<request_id>{1});
    CHECK(e.ran[1] == rs({{3, 4}}));
    e.run_until_idle(30);
    // 1 keeps its place ahead of 2. Its prompt block is in the prefix cache, so the recompute
    // of prompt + first output token only feeds that token.
    CHECK(e.ran[5] == rs({{1, 1}}));
    CHECK(e.first_run(2).first == 8);
    CHECK(e.finished[1].usage.n_completion == 4);
    CHECK(e.finished[1].usage.n_preemptions == 1);
    e.require_baseline();
  }
}

TEST_CASE("no starvation: a long prompt behind and before a stream of short ones finishes") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 32;
  cfg.max_running = 8;
  fake_engine e(64, 4, cfg);  // 256 slots: the long one needs 51 blocks, shorts 4 each
  request_id next = 1;
  auto add_short = [&] {
    e.add(next, prompt_of(8, static_cast<token_id>(100 * next)), 8);
    ++next;
  };
  for (int i = 0; i < 5; ++i) add_short();
  const request_id long_id = next++;
  e.add(long_id, prompt_of(200, 20000), 4);
  int steps = 0;
  while (!e.finished.count(long_id)) {
    add_short();  // one more every step
    e.step();
    REQUIRE(++steps <= 20);  // 200 tokens at <= 32 a step, less the decodes: ~12
  }
  CHECK(e.finished[long_id].reason == finish_reason::length);
  // The shorts keep flowing meanwhile: none waits unboundedly either.
  e.run_until_idle(1000);
  for (request_id id = 1; id < next; ++id) CHECK(e.finished[id].reason == finish_reason::length);
  e.require_baseline();
}

TEST_CASE("cancel frees blocks at once: waiting, mid-prefill, mid-decode, between steps") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 32;
  cfg.max_running = 2;
  fake_engine e(64, 4, cfg);
  e.add(2, prompt_of(4, 100), 50);     // decodes
  e.add(1, prompt_of(100, 1000), 10);  // long prefill: 28 + 31 tokens after two steps
  e.add(3, prompt_of(4, 200), 5);      // waits: max_running 2
  e.step();
  e.step();
  REQUIRE(e.sched.state(3) == request_state::waiting);
  const int32_t used = e.pool.stats().in_use;

  CHECK(e.sched.cancel(3));
  CHECK_FALSE(e.sched.cancel(3));
  CHECK(e.pool.stats().in_use == used);

  REQUIRE(e.sched.state(1) == request_state::running);
  REQUIRE(e.seq[1].size() == 100);  // still in prefill
  CHECK(e.sched.cancel(1));
  CHECK(e.pool.stats().in_use == used - 15);  // 59 tokens of 1: 15 blocks

  const step_plan p = e.schedule();
  std::set<request_id> ids;
  for (const auto& f : p.finished) {
    CHECK(f.reason == finish_reason::cancelled);
    ids.insert(f.id);
  }
  CHECK(ids == std::set<request_id>{1, 3});
  CHECK(e.finished[1].usage.n_completion == 0);
  REQUIRE(p.seqs.size() == 1);  // only 2 decodes: nothing left to admit
  CHECK(p.seqs[0].id == 2);
  // Cancelled after schedule() and before update(): its result is ignored.
  const auto sampled = e.forward(p);
  CHECK(e.sched.cancel(2));
  CHECK(e.pool.stats().in_use == 0);
  e.update(p, sampled);
  CHECK(e.schedule().finished.size() == 1);
  CHECK(e.finished[2].reason == finish_reason::cancelled);
  CHECK(e.finished[2].usage.n_completion == 2);
  e.require_baseline();
}

TEST_CASE("deadlines: expired requests finish at the start of schedule() and free their blocks") {
  fake_engine e(64, 4);
  e.add(1, prompt_of(10, 100), 50, 0, /*deadline*/ 5);
  e.add(2, prompt_of(10, 200), 3, 0, /*deadline*/ 100);
  e.step();  // now 0
  e.add(3, prompt_of(10, 300), 3, 5, /*deadline*/ 3);
  e.now = 4;  // 3 expires while waiting: never admitted
  auto p = e.schedule();
  REQUIRE(p.finished.size() == 1);
  CHECK(p.finished[0].id == 3);
  CHECK(p.finished[0].reason == finish_reason::deadline);
  e.update(p, e.forward(p));
  e.now = 5;  // not yet past 5
  e.step();
  CHECK(e.sched.state(1) == request_state::running);
  const int32_t used = e.pool.stats().in_use;
  e.now = 6;
  p = e.schedule();
  CHECK(e.finished[1].reason == finish_reason::deadline);
  CHECK(e.pool.stats().in_use < used);
  CHECK(e.finished[2].reason == finish_reason::length);  // finished in the step before
  CHECK(p.seqs.empty());
  e.update(p, e.forward(p));
  e.require_baseline();
}

TEST_CASE("the engine's stop ends a request before max_tokens") {
  fake_engine e(64, 4);
  e.add(1, prompt_of(6, 100), 10, 0, {}, /*stop_after*/ 3);
  e.run_until_idle(10);
  CHECK(e.finished[1].reason == finish_reason::stop);
  CHECK(e.finished[1].usage.n_completion == 3);
  e.require_baseline();
}

TEST_CASE("soak: thousands of random requests with cancels, deadlines and stops keep every invariant") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 24;
  cfg.max_running = 6;
  fake_engine e(40, 4, cfg);
  std::mt19937 rng(1234);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  // A few shared prefixes so the prefix cache, sharing and eviction all get exercised.
  std::vector<std::vector<token_id>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back(prompt_of(uniform(1, 4) * 4, 50000 + 1000 * i));

  const request_id n_requests = 3000;
  request_id next = 1;
  std::set<request_id> added;
  int steps = 0;
  while (next <= n_requests || !e.idle()) {
    for (int k = uniform(0, 2); k > 0 && next <= n_requests; --k, ++next) {
      auto prompt = uniform(0, 1) ? prefixes[static_cast<size_t>(uniform(0, 3))] : std::vector<token_id>{};
      prompt = concat(prompt, prompt_of(uniform(1, 30), static_cast<token_id>(100 + 10 * (next % 7))));
      const int32_t max_tok = uniform(1, 30);
      std::optional<int64_t> deadline;
      if (uniform(0, 9) == 0) deadline = e.now + uniform(0, 40);
      const int32_t stop_after = uniform(0, 3) == 0 ? uniform(1, max_tok) : 0;
      if (e.add(next, std::move(prompt), max_tok, uniform(0, 3), deadline, stop_after) == add_status::ok)
        added.insert(next);
    }
    step_plan p = e.schedule();
    auto sampled = e.forward(p);
    if (uniform(0, 4) == 0 && !added.empty()) {  // a client goes away, maybe mid-step
      const request_id victim = static_cast<request_id>(uniform(1, static_cast<int>(next - 1)));
      e.sched.cancel(victim);
    }
    e.update(p, sampled);
    ++e.now;
    REQUIRE(++steps < 100000);
  }
  e.schedule();  // collects the last cancellations
  CHECK(e.finished.size() == added.size());
  for (request_id id : added) CHECK(e.finished.count(id) == 1);
  std::map<finish_reason, int> by_reason;
  for (const auto& [id, f] : e.finished) ++by_reason[f.reason];
  for (auto r : {finish_reason::length, finish_reason::stop, finish_reason::cancelled, finish_reason::deadline})
    CHECK(by_reason[r] > 0);
  CHECK(e.sched.n_preemptions() > 0);
  CHECK(e.pool.stats().prefix_hit_tokens > 0);
  e.require_baseline();
}

// ---- sliding-window release (worker/model/kv_window.hpp) -----------------------------------------------

TEST_CASE("sliding window: the KV budget splits so as many max-context sequences fit either pool") {
  // Gemma 3 270M: 3 global and 15 windowed layers, window 512; 896 blocks of 16 tokens, every
  // layer: 7 sequences of 2048 tokens without the release.
  const kv_window_split s = split_kv_budget(3, 15, 512, 896, 16, 2048, 512);
  CHECK(s.window == 512);
  CHECK(s.n_layer_global == 3);
  CHECK(s.n_layer_window == 15);
  // 16128 layer-blocks / (128 x 3 + 33 x 15) = 18 sequences; 18 x 33 + one 512-token chunk (65).
  CHECK(s.n_window_blocks == 18 * 33 + 65);
  CHECK(s.n_global_blocks == (896 * 18 - 659 * 15) / 3);
  CHECK(int64_t{s.n_global_blocks} * 3 + int64_t{s.n_window_blocks} * 15 <= 896 * 18);  // the same bytes
  CHECK(s.n_global_blocks / 128 == 16);
  // No split: no windowed layer (or the release off), no global layer, or too small a budget.
  for (const kv_window_split n :
       {split_kv_budget(18, 0, 512, 896, 16, 2048, 512), split_kv_budget(0, 18, 512, 896, 16, 2048, 512),
        split_kv_budget(3, 15, 512, 64, 16, 2048, 512)}) {
    CHECK(n.window == 0);
    CHECK(n.n_layer_global == 18);
    CHECK(n.n_layer_window == 0);
    CHECK(n.n_window_blocks == 0);
  }
  CHECK(split_kv_budget(18, 0, 512, 896, 16, 2048, 512).n_global_blocks == 896);  // every block, every layer
  CHECK(split_kv_budget(3, 15, 512, 64, 16, 2048, 512).n_global_blocks == 64);
}

TEST_CASE(
    "sliding window: the split is fixed by the served context, and costs short sequences nothing at a short one") {
  // The split is made once, from --max-context (docs/worker.md, "Sliding-window layers in the KV cache"). Served no
  // longer than the window, both pools get every block: short sequences fit as many as without the release.
  for (const int64_t max_context : {64, 500, 512}) {
    INFO("max_context " << max_context);
    const kv_window_split s = split_kv_budget(3, 15, 512, 896, 16, max_context, 512);
    CHECK(s.window == 512);
    CHECK(s.n_global_blocks == 896);
    CHECK(s.n_window_blocks == 896);
  }
  // A longer context moves bytes from the window pool to the main pool: more long sequences, and
  // sequences no longer than the window (33 blocks at most) bound by the smaller window pool.
  int32_t last_window = 896, last_main = 896;
  for (const int64_t max_context : {1024, 2048, 4096, 8192, 32768}) {
    INFO("max_context " << max_context);
    const kv_window_split s = split_kv_budget(3, 15, 512, 896, 16, max_context, 512);
    CHECK(s.n_window_blocks < last_window);
    CHECK(s.n_global_blocks > last_main);
    CHECK(int64_t{s.n_global_blocks} * 3 + int64_t{s.n_window_blocks} * 15 <= 896 * 18);
    const int64_t long_seqs = (max_context + 15) / 16;
    CHECK(s.n_global_blocks / long_seqs >= 896 / long_seqs);  // never fewer long sequences than off
    last_window = s.n_window_blocks;
    last_main = s.n_global_blocks;
  }
}

TEST_CASE("sliding window: blocks behind the window go back to the window pool as it moves, exact counts") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 64;  // the whole prompt in one step
  fake_engine e(64, 4, cfg, 16, 8);
  REQUIRE(e.add(1, prompt_of(20, 100), 20) == add_status::ok);
  e.step();  // positions 0..19; the next token (20) sees 13..20: blocks 3 and 4 on
  CHECK(e.pool.stats().in_use == 5);
  CHECK(e.window_pool.stats().in_use == 2);
  CHECK(e.window_pool.stats().cached == 3);  // blocks 0..2, full and registered: reusable
  // A decode holds at most window_blocks_per_seq(8, 4, 1) = 3 window blocks; the main pool grows.
  CHECK(window_blocks_per_seq(8, 4, 1) == 3);
  int32_t peak_window = 0;
  while (!e.idle()) {
    e.step();
    peak_window = std::max(peak_window, e.window_pool.stats().in_use);
    if (!e.idle()) CHECK(e.pool.stats().in_use == (e.sched.n_computed(1) + 3) / 4);
  }
  CHECK(peak_window == 3);
  // 39 positions computed: 9 full blocks registered in each pool, the partial tenth freed.
  e.require_baseline();
  CHECK(e.pool.stats().cached == 9);
  CHECK(e.window_pool.stats().cached == 9);
  CHECK(e.window_pool.stats().free == 16 - 9);
}

TEST_CASE("sliding window: admission counts the window, so more sequences run in the same blocks") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 16;
  // Four sequences of 40 positions: 40 window blocks without the release; 4 x 3 + one chunk with it.
  fake_engine e(64, 4, cfg, 4 * 3 + 4, 8);
  for (request_id id = 1; id <= 4; ++id) REQUIRE(e.add(id, prompt_of(4, 100 + 10 * id), 37) == add_status::ok);
  int32_t peak = 0;
  while (!e.idle()) {
    e.step();
    peak = std::max(peak, e.sched.n_running());
    CHECK(e.window_pool.stats().in_use <= 4 * 3 + 1);
  }
  CHECK(peak == 4);
  CHECK(e.sched.n_preemptions() == 0);
  e.require_baseline();
  // What cannot fit alone is refused at add(): 20 positions need 5 window blocks in one step.
  fake_engine small(64, 4, cfg, 4, 8);
  CHECK(small.add(1, prompt_of(20, 100), 1) == add_status::exceeds_kv_capacity);
  CHECK(small.add(2, prompt_of(4, 100), 4) == add_status::ok);
}

TEST_CASE("sliding window: a cached prefix is reused only as far as the window pool holds its window") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 64;
  fake_engine e(64, 4, cfg, 24, 8);
  const auto P = prompt_of(40, 500);  // 10 blocks
  // Evicts every cached block of the window pool (they become free, their content forgotten).
  auto evict_window_cache = [&] {
    auto all = e.window_pool.allocate(e.window_pool.n_available());
    REQUIRE(all);
    e.window_pool.release(*all);
    REQUIRE(e.window_pool.stats().cached == 0);
  };
  REQUIRE(e.add(1, P, 1) == add_status::ok);
  e.run_until_idle(10);
  CHECK(e.window_pool.stats().cached == 10);

  // All held: the whole prefix is reused (its next token's window, blocks 8-9, is there).
  REQUIRE(e.add(2, concat(P, prompt_of(4, 900)), 1) == add_status::ok);
  e.run_until_idle(10);
  CHECK(e.finished.at(2).usage.n_cached_prompt == 40);
  CHECK(e.tokens_fed(2) == 4);

  // Window blocks gone: the main pool still has the prefix, but no part of it can continue.
  evict_window_cache();
  REQUIRE(e.add(3, concat(P, prompt_of(4, 910)), 1) == add_status::ok);
  e.run_until_idle(10);
  CHECK(e.finished.at(3).usage.n_cached_prompt == 0);
  CHECK(e.tokens_fed(3) == 44);

  // Only the window blocks of P's first 12 tokens held again: 3 blocks reused (the next token,
  // 12, sees 5..12: blocks 1 and 2), the rest recomputed.
  evict_window_cache();
  REQUIRE(e.add(4, concat(prompt_of(12, 500), prompt_of(4, 920)), 1) == add_status::ok);
  e.run_until_idle(10);
  REQUIRE(e.add(5, concat(P, prompt_of(4, 930)), 1) == add_status::ok);
  e.run_until_idle(10);
  CHECK(e.finished.at(5).usage.n_cached_prompt == 12);
  CHECK(e.tokens_fed(5) == 44 - 12);
  e.require_baseline();
}

TEST_CASE("sliding window soak: random requests, preemptions, cancels and shared prefixes keep every invariant") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 24;
  cfg.max_running = 6;
  fake_engine e(48, 4, cfg, 30, 8);
  std::mt19937 rng(99);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<token_id>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back(prompt_of(uniform(1, 6) * 4, 60000 + 1000 * i));
  request_id next = 1;
  std::set<request_id> added;
  int steps = 0;
  while (next <= 1500 || !e.idle()) {
    for (int k = uniform(0, 2); k > 0 && next <= 1500; --k, ++next) {
      auto prompt = uniform(0, 1) ? prefixes[static_cast<size_t>(uniform(0, 3))] : std::vector<token_id>{};
      prompt = concat(prompt, prompt_of(uniform(1, 30), static_cast<token_id>(100 + 10 * (next % 7))));
      const int32_t max_tok = uniform(1, 40);
      if (e.add(next, std::move(prompt), max_tok, uniform(0, 3), {}, uniform(0, 3) == 0 ? uniform(1, max_tok) : 0) ==
          add_status::ok)
        added.insert(next);
    }
    step_plan p = e.schedule();
    auto sampled = e.forward(p);
    if (uniform(0, 5) == 0) e.sched.cancel(static_cast<request_id>(uniform(1, static_cast<int>(next - 1))));
    e.update(p, sampled);
    ++e.now;
    REQUIRE(++steps < 100000);
  }
  e.schedule();
  CHECK(e.finished.size() == added.size());
  CHECK(e.sched.n_preemptions() > 0);
  CHECK(e.pool.stats().prefix_hit_tokens > 0);
  e.require_baseline();
}

// ---- step-time budget ------------------------------------------------------------------------

TEST_CASE("step cost model: recovers the cost of both kinds of row, refuses to guess from one size") {
  step_cost_model m;
  // 20 ms a step, 15 ms more with prompt rows (their second weight pass), 1 ms a decode row,
  // 1.5 ms a prompt row, 0.25 ms per 1024 attended pairs.
  const step_cost truth{20.0, 15.0, 1.0, 1.5, 0.25};
  for (int i = 0; i < 20; ++i) m.observe({8, 0, 8 * 100}, truth.predict({8, 0, 8 * 100}));
  CHECK_FALSE(m.fit().has_value());  // every step 8 decodes: nothing says what a token costs
  for (int i = 0; i < 20; ++i) m.observe({1 + i % 16, 0, 100}, truth.predict({1 + i % 16, 0, 100}));
  CHECK_FALSE(m.fit().has_value());  // no step had a prompt row
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    const int64_t n_prompt = i % 3 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 256);
    const step_shape s{static_cast<int64_t>(rng() % 33), n_prompt, static_cast<int64_t>(rng() % 200000)};
    if (s.n_tokens() == 0) continue;
    const double noise = static_cast<double>(rng() % 100) / 1000.0;  // 0-0.1 ms
    m.observe(s, truth.predict(s) + noise);
  }
  const auto fit = m.fit();
  REQUIRE(fit.has_value());
  CHECK(fit->fixed_ms == Approx(truth.fixed_ms).epsilon(0.02));
  CHECK(fit->prompt_fixed_ms == Approx(truth.prompt_fixed_ms).epsilon(0.02));
  CHECK(fit->per_decode_ms == Approx(truth.per_decode_ms).epsilon(0.02));
  CHECK(fit->per_prompt_ms == Approx(truth.per_prompt_ms).epsilon(0.02));
  CHECK(fit->per_kpair_ms == Approx(truth.per_kpair_ms).epsilon(0.02));
  for (int i = 0; i < 300; ++i) m.observe({1 + i % 7, i % 64, 0}, truth.predict({1 + i % 7, i % 64, 0}));
  CHECK(m.n_observations() == step_cost_model::k_window);  // the oldest are forgotten
  // Garbage in (a zero-token step, negative rows, a negative or NaN time) is ignored.
  m.observe({0, 0, 0}, 5);
  m.observe({-4, 8, 0}, 5);
  m.observe({4, 0, 0}, -1);
  m.observe({4, 0, 0}, std::nan(""));
  CHECK(m.n_observations() == step_cost_model::k_window);
  CHECK(m.fit()->per_prompt_ms == Approx(truth.per_prompt_ms).epsilon(0.02));
}

TEST_CASE("step cost model: keeps aside the 95th percentile of its under-predictions of mixed steps") {
  const step_cost truth{20.0, 0.0, 1.0, 1.5, 0.0};
  step_cost_model exact, noisy;
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) {
    const step_shape s{1 + static_cast<int64_t>(rng() % 16), i % 2 == 0 ? 0 : 16 + static_cast<int64_t>(rng() % 48), 0};
    exact.observe(s, truth.predict(s));
    noisy.observe(s, truth.predict(s) + static_cast<double>(rng() % 1001) / 100.0);  // + 0-10 ms
  }
  REQUIRE(exact.fit().has_value());
  REQUIRE(noisy.fit().has_value());
  CHECK(exact.fit()->margin_ms == Approx(0.0).margin(1e-6));
  // The fit absorbs the mean (5 ms); what is left is -5..5 ms, whose 95th percentile is ~4.5.
  CHECK(noisy.fit()->margin_ms > 3.5);
  CHECK(noisy.fit()->margin_ms < 5.5);
  // The budget keeps the margin aside: 100 - 20 - 14 = 66 ms, 132 prompt tokens at 0.5 ms.
  const step_cost c{10.0, 0.0, 0.5, 0.5, 0.0, 20.0};
  CHECK(prefill_tokens_within(c, {8, 0, 800}, 0, 100.0, 16, 256) == 132);
}

TEST_CASE("step cost model: a fit never has negative costs") {
  step_cost_model m;
  // Time falls with attention (nonsense, as noisy timings can suggest): that term is dropped.
  for (int i = 1; i <= 32; ++i) m.observe({4, i * 4, (32 - i) * 4096}, 10.0 + 4.0 + 2.0 * i * 4 - 0.01 * (32 - i) * 4);
  const auto fit = m.fit();
  REQUIRE(fit.has_value());
  CHECK(fit->fixed_ms >= 0);
  CHECK(fit->prompt_fixed_ms >= 0);
  CHECK(fit->per_decode_ms >= 0);
  CHECK(fit->per_prompt_ms > 0);
  CHECK(fit->per_kpair_ms >= 0);
}

TEST_CASE("prefill_tokens_within: what is left of the step after the decodes, at least the minimum chunk") {
  const step_cost c{10.0, 0.0, 0.5, 0.5, 0.0};
  // 8 decodes predict 14 ms; 100 ms leaves 86 ms = 172 prompt tokens.
  CHECK(prefill_tokens_within(c, {8, 0, 800}, 0, 100.0, 16, 256) == 172);
  CHECK(prefill_tokens_within(c, {8, 0, 800}, 0, 100.0, 16, 64) == 64);     // capped by the token budget
  CHECK(prefill_tokens_within(c, {190, 0, 0}, 0, 100.0, 16, 256) == 16);    // decodes alone over it
  CHECK(prefill_tokens_within(c, {190, 0, 0}, 0, 100.0, 300, 256) == 256);  // min chunk, still capped
  // Prompt tokens deep in a long context also pay attention: 0.5 + 1 * 2048/1024 = 2.5 ms each.
  const step_cost a{10.0, 0.0, 0.5, 0.5, 1.0};
  CHECK(prefill_tokens_within(a, {8, 0, 0}, 2048, 100.0, 16, 256) == 34);
  // Having prompt rows at all costs a second pass over the weights: 100 - 14 - 30 = 56 ms left.
  const step_cost p{10.0, 30.0, 0.5, 0.5, 0.0};
  CHECK(prefill_tokens_within(p, {8, 0, 800}, 0, 100.0, 16, 256) == 112);
}

namespace {

// Runs `e` until idle, feeding every step's time from `cost` to the scheduler as the engine does;
// returns the largest prompt-token count of a step that also carried decodes.
int32_t run_with_cost(fake_engine& e, const step_cost& cost, int max_steps) {
  int32_t worst = 0;
  for (int n = 0; n < max_steps && !e.idle(); ++n) {
    // Without a budget the scheduler keeps no model: every step with decodes counts.
    const bool had_fit = e.cfg.max_step_ms <= 0 || e.sched.step_costs().fit().has_value();
    const step_plan plan = e.step();
    step_shape s;
    for (const auto& q : plan.seqs) {
      const auto k = static_cast<int64_t>(q.tokens.size());
      const bool decode = q.pos0 >= e.n_prompt[q.id];
      (decode ? s.n_decode : s.n_prompt) += k;
      s.attended_pairs += k * q.pos0 + k * (k + 1) / 2;
    }
    e.sched.observe_step(plan, cost.predict(s));
    if (s.n_decode > 0 && had_fit) worst = std::max(worst, static_cast<int32_t>(s.n_prompt));
  }
  REQUIRE(e.idle());
  return worst;
}

}  // namespace

TEST_CASE("step-time budget: prompt chunks shrink while streams decode, not when nothing decodes") {
  scheduler_config cfg;
  cfg.max_tokens_per_step = 256;
  cfg.max_running = 16;
  cfg.min_prefill_chunk = 16;
  const step_cost cost{10.0, 0.0, 0.5, 0.5, 0.0};  // a 256-token step takes 138 ms; 8 decodes 14 ms

  SECTION("off: the token budget alone") {
    fake_engine e(1024, 16, cfg);
    for (request_id id = 1; id <= 24; ++id) e.add(id, prompt_of(200, static_cast<token_id>(1000 * id)), 24);
    CHECK(run_with_cost(e, cost, 2000) > 200);
    e.require_baseline();
  }
  SECTION("on: 50 ms steps while decodes run, every request still completes") {
    cfg.max_step_ms = 50;
    fake_engine e(1024, 16, cfg);
    for (request_id id = 1; id <= 24; ++id) e.add(id, prompt_of(200, static_cast<token_id>(1000 * id)), 24);
    const int32_t worst = run_with_cost(e, cost, 4000);
    // With d decodes the step may carry (50 - 10 - 0.5 d) / 0.5 = 80 - d prompt tokens.
    CHECK(worst <= 80);
    CHECK(worst >= cfg.min_prefill_chunk);
    CHECK(e.finished.size() == 24);
    // Before the model had steps of different sizes, the first request's prompt went in whole.
    CHECK(e.ran[0] == rs({{1, 200}, {2, 56}}));
    e.require_baseline();
  }
  SECTION("on, but a prompt alone in the engine keeps the full token budget") {
    cfg.max_step_ms = 50;
    fake_engine e(1024, 16, cfg);
    for (request_id id = 1; id <= 6; ++id) e.add(id, prompt_of(static_cast<int32_t>(20 * id), 100 * id), 12);
    run_with_cost(e, cost, 100);  // the model learns from these steps
    REQUIRE(e.sched.step_costs().fit().has_value());
    e.ran.clear();
    e.add(9, prompt_of(600, 5000), 2);
    e.step();
    CHECK(e.ran[0] == rs({{9, 256}}));
    e.run_until_idle(20);
    e.require_baseline();
  }
}
