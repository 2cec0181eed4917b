#include "worker/engine/scheduler.hpp"

#include <algorithm>
#include <cassert>
#include <map>

#include "worker/model/kv_window.hpp"

namespace sy {

const char* to_string(request_state s) {
  switch (s) {
    case request_state::waiting:
      return "waiting";
    case request_state::running:
      return "running";
    case request_state::preempted:
      return "preempted";
    case request_state::finished:
      return "finished";
  }
  return "?";
}

namespace {

int32_t size32(const auto& v) { return static_cast<int32_t>(v.size()); }

}  // namespace

scheduler::scheduler(kv_block_pool& pool, scheduler_config config, window_kv window)
    : pool_(pool), window_(window), config_(config), block_size_(pool.block_size()) {
  assert(config_.max_tokens_per_step >= 1 && config_.max_running >= 1);
  assert(!window_.pool || (window_.window > 0 && window_.pool->block_size() == block_size_));
  running_.reserve(static_cast<size_t>(config_.max_running));
}

// ---- arrivals and cancellation ------------------------------------------------------------

add_status scheduler::add(request_spec spec) {
  assert(!spec.prompt.empty() && spec.max_tokens >= 1);
  assert(!requests_.contains(spec.id));
  // The longest a live request gets: prompt + max_tokens - 1 tokens fed (the last sampled token
  // never is). It must fit the pool alone, or preemption could not save it.
  const int64_t n_positions = static_cast<int64_t>(spec.prompt.size()) - spec.n_generated + spec.max_tokens - 1;
  const int64_t n_blocks = (n_positions + block_size_ - 1) / block_size_;
  if (n_blocks > pool_.n_blocks()) return add_status::exceeds_kv_capacity;
  if (window_.pool && std::min(n_blocks, window_blocks_per_seq(window_.window, block_size_,
                                                               config_.max_tokens_per_step)) > window_.pool->n_blocks())
    return add_status::exceeds_kv_capacity;

  request r;
  r.id = spec.id;
  r.priority = spec.priority;
  r.arrival = n_arrivals_++;
  r.deadline_ms = spec.deadline_ms;
  r.max_tokens = spec.max_tokens;
  r.n_prompt = size32(spec.prompt) - spec.n_generated;
  r.cache_root = spec.cache_root;
  r.tokens = std::move(spec.prompt);
  r.tokens.reserve(r.tokens.size() + static_cast<size_t>(std::min(spec.max_tokens, 4096)));
  waiting_.insert({queue_key{r.priority, r.arrival}, r.id});
  if (r.deadline_ms) deadlines_.insert({*r.deadline_ms, r.id});
  requests_.emplace(r.id, std::move(r));
  return add_status::ok;
}

bool scheduler::cancel(request_id id, finish_reason reason) {
  assert(reason == finish_reason::cancelled || reason == finish_reason::error);
  const auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  finish(it->second, reason, cancelled_);
  return true;
}

// ---- one step -------------------------------------------------------------------------------

step_plan scheduler::schedule(int64_t now_ms) {
  step_plan plan;
  plan.step = ++n_steps_;
  plan.finished = std::move(cancelled_);
  cancelled_.clear();
  slots_.clear();
  budget_left_ = config_.max_tokens_per_step;

  expire(now_ms, plan);
  schedule_decodes(plan);
  apply_step_time_budget();
  schedule_prefill_chunks(plan);
  // Having to preempt means memory is short: admitting now would only preempt again (vLLM v1).
  if (plan.preempted.empty()) admit_waiting(plan);
  build_plan(plan);
  return plan;
}

void scheduler::expire(int64_t now_ms, step_plan& plan) {
  while (!deadlines_.empty() && deadlines_.begin()->first < now_ms) {
    const auto it = requests_.find(deadlines_.begin()->second);
    assert(it != requests_.end());
    finish(it->second, finish_reason::deadline, plan.finished);  // erases the deadline entry
  }
}

void scheduler::schedule_decodes(step_plan& plan) {
  for (request* r : running_by_priority()) {
    if (budget_left_ == 0) break;
    // Preempted earlier in this loop, or still in prefill.
    if (r->state != request_state::running || r->n_computed < r->n_prefill_end) continue;
    if (!reserve_blocks(*r, 1, plan)) continue;
    slots_.push_back({r, 1});
    --budget_left_;
  }
}

void scheduler::apply_step_time_budget() {
  if (config_.max_step_ms <= 0 || slots_.empty()) return;  // no budget, or no stream to stall
  const auto cost = costs_.fit();
  if (!cost) {
    // No fit yet (a fresh worker): the smallest chunk rather than the whole token budget, so the
    // first streams do not wait on big chunks while the model learns (measured: seven 64-token
    // pre-fit steps of ~160 ms were a c=8 run's ITL p99 on their own).
    budget_left_ = std::min(budget_left_, config_.min_prefill_chunk);
    return;
  }
  step_shape decodes;
  for (const slot& s : slots_) {
    decodes.n_decode += s.n_tokens;
    decodes.attended_pairs += static_cast<int64_t>(s.req->n_computed) + 1;
  }
  // Prompt tokens go first to the running prefill of best priority, else to an admission.
  int64_t prompt_pos = 0;
  for (const request* r : running_by_priority())
    if (r->state == request_state::running && r->n_computed < r->n_prefill_end) {
      prompt_pos = r->n_computed;
      break;
    }
  budget_left_ = std::min(budget_left_, prefill_tokens_within(*cost, decodes, prompt_pos, config_.max_step_ms,
                                                              config_.min_prefill_chunk, budget_left_));
}

void scheduler::observe_step(const step_plan& plan, double ms) {
  if (config_.max_step_ms <= 0) return;  // no budget: nothing reads the model
  step_shape s;
  for (const scheduled_seq& q : plan.seqs) {
    const auto n = static_cast<int64_t>(q.tokens.size());
    // Rows at positions >= n_prompt are generated tokens (decode kernels), the others prompt rows.
    const int64_t generated = std::clamp<int64_t>(q.pos0 + n - std::max<int64_t>(q.pos0, q.n_prompt), 0, n);
    s.n_decode += generated;
    s.n_prompt += n - generated;
    // Row i of the sequence attends to pos0 + i + 1 keys.
    s.attended_pairs += n * q.pos0 + n * (n + 1) / 2;
  }
  costs_.observe(s, ms);
}

void scheduler::schedule_prefill_chunks(step_plan& plan) {
  for (request* r : running_by_priority()) {
    if (budget_left_ == 0) break;
    if (r->state != request_state::running || r->n_computed >= r->n_prefill_end) continue;
    const int32_t n = std::min(size32(r->tokens) - r->n_computed, budget_left_);
    if (!reserve_blocks(*r, n, plan)) continue;
    slots_.push_back({r, n});
    budget_left_ -= n;
  }
}

void scheduler::admit_waiting(step_plan& plan) {
  while (!waiting_.empty() && budget_left_ > 0) {
    const auto it = requests_.find(waiting_.begin()->second);
    assert(it != requests_.end());
    request& head = it->second;
    if (try_admit(head) == admit_result::admitted) continue;
    // Strict queue order: nothing behind the head goes first. Only a strictly more urgent head
    // may take room from running requests.
    if (!config_.preempt_for_priority) break;
    request* victim = pick_victim();
    if (victim == nullptr || victim->priority <= head.priority) break;
    preempt(*victim, plan);
  }
}

scheduler::admit_result scheduler::try_admit(request& r) {
  if (n_running() >= config_.max_running) return admit_result::no_slot;
  // Whatever the prefix cache holds, at least one token is computed into a fresh block.
  const int32_t n_available = pool_.n_available(), n_window = n_window_available();
  if (n_available == 0 || (window_.pool && n_window == 0)) return admit_result::no_blocks;
  if (blocked_head_ && blocked_head_->id == r.id && n_available <= blocked_head_->n_available &&
      n_window <= blocked_head_->n_window_available)
    return admit_result::no_blocks;

  std::vector<block_id> hits = pool_.acquire_prefix(r.tokens, r.cache_root);
  int32_t n_cached = size32(hits) * block_size_;
  if (n_cached >= size32(r.tokens)) {
    // The last token must be computed to get logits: recompute the last block in a fresh one
    // rather than write into a shared, registered block.
    pool_.release(std::span<const block_id>(&hits.back(), 1));
    hits.pop_back();
    n_cached -= block_size_;
  }
  if (window_.pool) {
    // Only as much of the prefix as the window pool can continue from.
    const int32_t k = window_prefix(r, size32(hits));
    pool_.release(std::span<const block_id>(hits).subspan(static_cast<size_t>(k)));
    hits.resize(static_cast<size_t>(k));
    n_cached = k * block_size_;
  }
  const int32_t n = std::min(size32(r.tokens) - n_cached, budget_left_);
  const int32_t n_blocks = (n_cached + n + block_size_ - 1) / block_size_;
  auto fresh = pool_.allocate(n_blocks - size32(hits));
  if (fresh && window_.pool && !take_window_blocks(r, size32(hits), n_blocks)) {
    pool_.release(*fresh);
    fresh.reset();
  }
  if (!fresh) {
    pool_.release(hits);
    blocked_head_ = blocked_head{r.id, n_available, n_window};
    return admit_result::no_blocks;
  }
  blocked_head_.reset();

  r.blocks = std::move(hits);
  r.blocks.insert(r.blocks.end(), fresh->begin(), fresh->end());
  r.n_computed = n_cached;
  r.n_prefill_end = size32(r.tokens);
  if (r.n_cached_prompt < 0) r.n_cached_prompt = std::min(n_cached, r.n_prompt);
  register_full_blocks(r);  // only rebuilds the hash chain: cache hits are registered already

  waiting_.erase({queue_key{r.priority, r.arrival}, r.id});
  r.state = request_state::running;
  r.admission = ++n_admissions_;
  running_.push_back(&r);
  slots_.push_back({&r, n});
  budget_left_ -= n;
  return admit_result::admitted;
}

// Gives running request `r` blocks for `n_tokens` more tokens, preempting the worst running
// request (possibly `r`) until the pool can. False when `r` itself was preempted.
bool scheduler::reserve_blocks(request& r, int32_t n_tokens, step_plan& plan) {
  for (;;) {
    const int32_t n_need = (r.n_computed + n_tokens + block_size_ - 1) / block_size_ - size32(r.blocks);
    if (n_need <= 0) return true;
    auto fresh = pool_.allocate(n_need);
    if (fresh && window_.pool) {
      auto window_fresh = window_.pool->allocate(n_need);
      if (window_fresh) {
        r.window_blocks.insert(r.window_blocks.end(), window_fresh->begin(), window_fresh->end());
      } else {
        pool_.release(*fresh);
        fresh.reset();
      }
    }
    if (fresh) {
      r.blocks.insert(r.blocks.end(), fresh->begin(), fresh->end());
      return true;
    }
    request* victim = pick_victim();
    assert(victim != nullptr);  // `r` itself is running
    preempt(*victim, plan);
    if (victim == &r) return false;
  }
}

// The running request with the worst priority; among equals the most recently admitted.
scheduler::request* scheduler::pick_victim() const {
  request* victim = nullptr;
  for (request* r : running_) {
    if (victim == nullptr || r->priority > victim->priority ||
        (r->priority == victim->priority && r->admission > victim->admission))
      victim = r;
  }
  return victim;
}

void scheduler::preempt(request& r, step_plan& plan) {
  assert(r.state == request_state::running);
  unschedule(r);
  release_blocks(r);
  std::erase(running_, &r);
  r.state = request_state::preempted;
  ++r.n_preemptions;
  ++n_preemptions_;
  waiting_.insert({queue_key{r.priority, r.arrival}, r.id});
  plan.preempted.push_back(r.id);
}

// Takes `r` out of the step being built, giving its tokens back to the budget.
void scheduler::unschedule(const request& r) {
  const auto it = std::find_if(slots_.begin(), slots_.end(), [&](const slot& s) { return s.req == &r; });
  if (it == slots_.end()) return;
  budget_left_ += it->n_tokens;
  slots_.erase(it);
}

void scheduler::finish(request& r, finish_reason reason, std::vector<finished_request>& out) {
  if (r.state == request_state::running) {
    release_blocks(r);
    std::erase(running_, &r);
  } else {
    waiting_.erase({queue_key{r.priority, r.arrival}, r.id});
  }
  if (r.deadline_ms) deadlines_.erase({*r.deadline_ms, r.id});
  out.push_back(
      {r.id, reason,
       request_usage{r.n_prompt, std::max(r.n_cached_prompt, 0), size32(r.tokens) - r.n_prompt, r.n_preemptions}});
  requests_.erase(r.id);  // `r` dangles from here on
}

void scheduler::release_blocks(request& r) {
  pool_.release(r.blocks);
  r.blocks.clear();
  if (window_.pool) {
    window_.pool->release(std::span<const block_id>(r.window_blocks).subspan(static_cast<size_t>(r.window_first)));
    r.window_blocks.clear();
    r.window_first = 0;
  }
  r.block_hashes.clear();
  r.n_computed = 0;
}

// Registers every block of `r` whose positions are all computed and that is not registered yet,
// chaining each block's hash from its parent's.
void scheduler::register_full_blocks(request& r) {
  const size_t n_full = static_cast<size_t>(r.n_computed / block_size_);
  const std::span<const token_id> tokens(r.tokens);
  while (r.block_hashes.size() < n_full) {
    const size_t i = r.block_hashes.size();
    const uint64_t parent = i == 0 ? r.cache_root : r.block_hashes[i - 1];
    const auto content = tokens.subspan(i * static_cast<size_t>(block_size_), static_cast<size_t>(block_size_));
    r.block_hashes.push_back(pool_.register_full(r.blocks[i], parent, content));
    // Under the same chain as the main pool's block; a block already behind the window (a
    // prefix-cache hit the window pool no longer needed) stays released.
    if (window_.pool && r.window_blocks[i] != k_released_block)
      window_.pool->register_full(r.window_blocks[i], parent, content);
  }
}

void scheduler::release_behind_window(request& r) {
  if (!window_.pool) return;
  const auto live = static_cast<int32_t>(first_live_block(r.n_computed, window_.window, block_size_));
  if (live <= r.window_first) return;
  const std::span<block_id> dead =
      std::span<block_id>(r.window_blocks)
          .subspan(static_cast<size_t>(r.window_first), static_cast<size_t>(live - r.window_first));
  window_.pool->release(dead);
  std::fill(dead.begin(), dead.end(), k_released_block);
  r.window_first = live;
}

int32_t scheduler::window_prefix(const request& r, int32_t n_hits) const {
  const std::span<const token_id> tokens(r.tokens);
  const auto bs = static_cast<size_t>(block_size_);
  // The parent hash of each cached block, along the chain acquire_prefix walked.
  std::vector<uint64_t> parent(static_cast<size_t>(n_hits));
  for (size_t i = 0; i < parent.size(); ++i)
    parent[i] = i == 0 ? r.cache_root
                       : kv_block_pool::chain_hash(parent[i - 1], tokens.subspan((i - 1) * bs, bs), pool_.salt());
  int32_t k = n_hits;
  for (;;) {
    // Reusing k blocks, the next token is at k * block_size: its window needs blocks [lo, k).
    const auto lo = static_cast<int32_t>(first_live_block(int64_t{k} * block_size_, window_.window, block_size_));
    int32_t missing = -1;
    for (int32_t j = k - 1; j >= lo && missing < 0; --j)
      if (!window_.pool->holds(parent[static_cast<size_t>(j)], tokens.subspan(static_cast<size_t>(j) * bs, bs)))
        missing = j;
    if (missing < 0) return k;
    k = missing;  // any longer reuse would need block `missing` in its window
  }
}

bool scheduler::take_window_blocks(request& r, int32_t n_cached_blocks, int32_t n_blocks) {
  const std::span<const token_id> tokens(r.tokens);
  const auto bs = static_cast<size_t>(block_size_);
  const auto lo =
      static_cast<int32_t>(first_live_block(int64_t{n_cached_blocks} * block_size_, window_.window, block_size_));
  std::vector<block_id> table(static_cast<size_t>(lo), k_released_block);
  uint64_t parent = r.cache_root;
  for (int32_t j = 0; j < n_cached_blocks; ++j) {
    const auto content = tokens.subspan(static_cast<size_t>(j) * bs, bs);
    if (j >= lo) {
      const auto b = window_.pool->acquire_block(parent, content);
      assert(b);  // window_prefix checked it, and nothing ran in between
      table.push_back(*b);
    }
    parent = kv_block_pool::chain_hash(parent, content, pool_.salt());
  }
  // Fresh blocks only once the cached ones are held: allocating may evict cached blocks.
  auto fresh = window_.pool->allocate(n_blocks - n_cached_blocks);
  if (!fresh) {
    window_.pool->release(std::span<const block_id>(table).subspan(static_cast<size_t>(lo)));
    return false;
  }
  table.insert(table.end(), fresh->begin(), fresh->end());
  r.window_blocks = std::move(table);
  r.window_first = lo;
  return true;
}

// Running requests, most urgent first (priority, then arrival): the order of the plan.
std::vector<scheduler::request*> scheduler::running_by_priority() const {
  std::vector<request*> order = running_;
  std::sort(order.begin(), order.end(), [](const request* a, const request* b) {
    return queue_key{a->priority, a->arrival} < queue_key{b->priority, b->arrival};
  });
  return order;
}

void scheduler::build_plan(step_plan& plan) const {
  plan.seqs.reserve(slots_.size());
  for (const slot& s : slots_) {
    const request& r = *s.req;
    scheduled_seq q;
    q.id = r.id;
    q.pos0 = r.n_computed;
    const auto first = r.tokens.begin() + r.n_computed;
    q.tokens.assign(first, first + s.n_tokens);
    q.block_table = r.blocks;
    q.window_table = r.window_blocks;
    q.sample = r.n_computed + s.n_tokens == size32(r.tokens);
    q.n_prompt = r.n_prompt;
    plan.n_tokens += s.n_tokens;
    plan.seqs.push_back(std::move(q));
  }
}

// ---- results of a step ------------------------------------------------------------------------

std::vector<finished_request> scheduler::update(const step_plan& plan, std::span<const sampled_token> sampled) {
  std::vector<finished_request> finished;
  size_t k = 0;
  for (const scheduled_seq& q : plan.seqs) {
    const sampled_token* t = nullptr;
    if (q.sample) {
      assert(k < sampled.size() && sampled[k].id == q.id);
      t = &sampled[k++];
    }
    const auto it = requests_.find(q.id);
    if (it == requests_.end() || it->second.state != request_state::running) continue;
    request& r = it->second;
    assert(r.n_computed == q.pos0 && r.n_computed + size32(q.tokens) <= size32(r.tokens));
    r.n_computed += size32(q.tokens);
    register_full_blocks(r);
    release_behind_window(r);
    if (t == nullptr) continue;
    r.tokens.push_back(t->token);
    if (t->stop)
      finish(r, finish_reason::stop, finished);
    else if (size32(r.tokens) - r.n_prompt >= r.max_tokens)
      finish(r, finish_reason::length, finished);
  }
  assert(k == sampled.size());
  return finished;
}

// ---- accessors ----------------------------------------------------------------------------------

std::optional<request_state> scheduler::state(request_id id) const {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return std::nullopt;
  return it->second.state;
}

std::optional<request_usage> scheduler::usage(request_id id) const {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return std::nullopt;
  const request& r = it->second;
  return request_usage{r.n_prompt, std::max(r.n_cached_prompt, 0), size32(r.tokens) - r.n_prompt, r.n_preemptions};
}

std::span<const token_id> scheduler::tokens(request_id id) const {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  return it->second.tokens;
}

int32_t scheduler::n_computed(request_id id) const {
  const auto it = requests_.find(id);
  return it == requests_.end() ? 0 : it->second.n_computed;
}

bool scheduler::check_invariants(std::string* why) const {
  auto fail = [&](std::string msg) {
    if (why) *why = std::move(msg);
    return false;
  };
  if (!pool_.check_invariants(why)) return false;
  if (waiting_.size() + running_.size() != requests_.size()) return fail("waiting + running != live requests");
  if (n_running() > config_.max_running) return fail("more running than max_running");

  std::map<block_id, int32_t> refs, window_refs;  // block -> running requests holding it
  int32_t n_running_seen = 0;
  for (const auto& [id, r] : requests_) {
    const std::string name = "request " + std::to_string(id);
    if (r.id != id) return fail(name + " stored under another id");
    if (size32(r.tokens) - r.n_prompt >= r.max_tokens) return fail(name + " live past max_tokens");
    if (r.state == request_state::running) {
      ++n_running_seen;
      if (std::count(running_.begin(), running_.end(), &r) != 1)
        return fail(name + " running but not once in the running list");
      if (r.n_computed >= size32(r.tokens)) return fail(name + " computed all its tokens");
      const int32_t n_min = (r.n_computed + block_size_ - 1) / block_size_;
      const int32_t n_max = (size32(r.tokens) + block_size_ - 1) / block_size_;
      if (size32(r.blocks) < n_min || size32(r.blocks) > n_max)
        return fail(name + " block table does not cover its computed tokens");
      if (size32(r.block_hashes) != r.n_computed / block_size_) return fail(name + " has full blocks not registered");
      for (block_id b : r.blocks) ++refs[b];
      if (window_.pool) {
        if (r.window_blocks.size() != r.blocks.size()) return fail(name + " window table and block table differ");
        if (r.window_first > first_live_block(r.n_computed, window_.window, block_size_))
          return fail(name + " released a window block its next token sees");
        for (int32_t j = 0; j < size32(r.window_blocks); ++j) {
          const block_id b = r.window_blocks[static_cast<size_t>(j)];
          if ((j < r.window_first) != (b == k_released_block))
            return fail(name + " window table entry " + std::to_string(j) + " released out of order");
          if (b != k_released_block) ++window_refs[b];
        }
      }
    } else if (r.state == request_state::waiting || r.state == request_state::preempted) {
      if (!waiting_.contains({queue_key{r.priority, r.arrival}, r.id})) return fail(name + " waiting but not queued");
      if (!r.blocks.empty() || r.n_computed != 0) return fail(name + " waiting but holds blocks");
    } else {
      return fail(name + " finished but still live");
    }
  }
  if (n_running_seen != n_running()) return fail("running list holds non-running requests");
  for (const auto& [b, n] : refs)
    if (pool_.ref_count(b) != n)
      return fail("block " + std::to_string(b) + " ref count " + std::to_string(pool_.ref_count(b)) + " but held by " +
                  std::to_string(n) + " running requests");
  if (pool_.stats().in_use != size32(refs)) return fail("pool has in-use blocks no running request holds");
  if (window_.pool) {
    if (!window_.pool->check_invariants(why)) return false;
    for (const auto& [b, n] : window_refs)
      if (window_.pool->ref_count(b) != n) return fail("window block " + std::to_string(b) + " ref count mismatch");
    if (window_.pool->stats().in_use != size32(window_refs))
      return fail("window pool has in-use blocks no running request holds");
  }
  return true;
}

}  // namespace sy
