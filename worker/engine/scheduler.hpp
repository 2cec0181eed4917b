// Iteration-level (continuous batching) scheduler: decides, step by step, which tokens of which
// requests go into the next batched forward, and keeps each request's KV block table in the
// kv_block_pool.
//
// A plain state machine with explicit inputs and outputs (vLLM v1's schedule() /
// update_from_output()): no threads, no model, no clock — time comes in as `now_ms`.
//   add(request_spec)           a request arrives;
//   schedule(now_ms) -> plan    what to run this step (tokens, positions, block tables);
//   update(plan, sampled)       what the forward produced: one token per sampled sequence.
// cancel() may be called between any two of these calls.
//
// One step, in order:
//   1. expire   requests whose deadline < now_ms finish with finish_reason::deadline;
//   2. decode   one token for every running sequence whose (re)computed prefill is done;
//   3. prefill  the rest of the token budget goes to running sequences still in prefill, as
//               chunks (chunked prefill), best priority first;
//   4. admit    waiting requests, strictly in queue order (priority, then arrival), while
//               blocks, budget and max_running last. The head is never skipped: if it cannot be
//               admitted, nothing behind it is. Skipped in a step that had to preempt in 2-3.
// Ordering key everywhere: lower `priority` value = more urgent (as vLLM); ties by arrival.
//
// KV blocks: a running request holds blocks covering positions [0, n_computed + n_scheduled);
// blocks[i] holds positions [i * block_size, (i + 1) * block_size). Full blocks are registered
// in the pool's prefix cache after the step that filled them; a request only ever writes into
// blocks it allocated itself and that are not yet full, never into shared or registered ones.
// When a running sequence cannot get the blocks it needs, the running request with the worst
// priority (ties: the most recently admitted) is preempted — possibly the one asking: all its
// blocks are released and it goes back to the queue at its original place, to recompute prompt
// + output so far (mostly from the prefix cache) when readmitted.
//
// Sliding-window layers (worker/model/kv_window.hpp; docs/worker.md, "Sliding-window layers in the KV
// cache"): with a window pool, a running request also holds a window table, as long as its block
// table, for the windowed layers. After each step the entries wholly behind the window of its
// next token are released to the window pool and become k_released_block; so a sequence holds at
// most window_blocks_per_seq(window, block_size, step tokens) window blocks. Admission counts the
// window pool too, and a cached prefix is reused only as far as the window pool still holds
// the blocks its next token's window needs (window_prefix).
//
// Owned by one thread (the engine's step loop), like the pool it drives; not thread-safe.
// Nothing here throws on the step path (besides std::bad_alloc); misuse is an assert.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/finish_reason.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "worker/engine/kv_block_pool.hpp"
#include "worker/engine/step_cost_model.hpp"

namespace sy {

using request_id = uint64_t;

// Lifecycle of a request inside the scheduler:
//   waiting   -> running     admitted: blocks allocated, prefix cache consulted;
//   running   -> preempted   out of blocks: blocks released, requeued at its arrival place;
//   preempted -> running     readmitted: recomputes prompt + output so far;
//   any       -> finished    terminal: blocks released in the same call, then forgotten.
enum class request_state : uint8_t { waiting, running, preempted, finished };

// finish_reason (common/finish_reason.hpp) as the scheduler sets it: stop when update() gets
// sampled_token::stop (EOS or a stop string), length at max_tokens, cancelled or error by
// cancel(id, reason), deadline when its deadline passed first.

const char* to_string(request_state s);

struct request_spec {
  request_id id = 0;                   // unique among live requests
  std::vector<token_id> prompt;        // not empty
  int32_t max_tokens = 16;             // output tokens, >= 1
  int32_t priority = 0;                // lower = more urgent
  std::optional<int64_t> deadline_ms;  // finished with `deadline` once deadline < now_ms
  // Resumed elsewhere-started output: the prompt's last n_generated tokens are output (the
  // request starts as if preempted after sampling them). < prompt.size().
  int32_t n_generated = 0;
  // Its prefix-cache namespace (proto::submit::cache_root): blocks are shared only within it.
  uint64_t cache_root = 0;
};

// `serve --max-step-ms` when not given: off. Measured at 8 streams on a 2-core EPYC
// (docs/worker.md, "Step-time budget"), 80 ms with --prompt-panels resident took ITL p99 from
// ~585 to ~95 ms for ~3 % of output tok/s: an operator's choice for latency-bound CPU workers
// (it changes nothing where steps are short, and resident panels cost memory).
inline constexpr double k_default_max_step_ms = 0;

struct scheduler_config {
  int32_t max_tokens_per_step = 256;  // token budget of one forward (decodes + chunks)
  int32_t max_running = 32;           // requests holding KV blocks at once
  // A waiting request strictly more urgent than the worst running one preempts it when it
  // cannot otherwise be admitted.
  bool preempt_for_priority = true;
  // Step-time budget (0: none). While decodes run, the prompt tokens of a step (chunks and
  // admissions) are cut so the step's predicted time stays under this many milliseconds, but
  // never below `min_prefill_chunk`: streams keep a bounded inter-token latency while prompts are
  // admitted. The prediction is the step_cost_model fitted on the engine's measured steps
  // (observe_step); until it has a fit, such a step carries min_prefill_chunk prompt tokens.
  double max_step_ms = 0;
  int32_t min_prefill_chunk = 16;
};

// Token counts of a request, as billed (OpenAI `usage`).
struct request_usage {
  int32_t n_prompt = 0;
  int32_t n_cached_prompt = 0;  // prompt tokens found in the prefix cache at first admission
  int32_t n_completion = 0;     // output tokens sampled
  int32_t n_preemptions = 0;    // times it was preempted and recomputed
};

struct finished_request {
  request_id id = 0;
  finish_reason reason = finish_reason::none;
  request_usage usage;
};

// One sequence of a step: feed `tokens` at positions [pos0, pos0 + tokens.size()).
struct scheduled_seq {
  request_id id = 0;
  int64_t pos0 = 0;                    // K/V of [0, pos0) already in the blocks
  std::vector<token_id> tokens;        // prompt chunk, recompute chunk, or last sampled token
  std::vector<block_id> block_table;   // covers [0, pos0 + tokens.size())
  std::vector<block_id> window_table;  // with a window pool: the windowed layers' table, else empty
  bool sample = false;                 // the chunk ends the known tokens: sample one after it
  int32_t n_prompt = 0;                // the request's prompt: rows at positions >= it are generated tokens
};

struct step_plan {
  uint64_t step = 0;                       // 1, 2, ... (schedule() calls)
  std::vector<scheduled_seq> seqs;         // decodes, then prefill chunks, then admissions
  std::vector<request_id> preempted;       // preempted in this schedule() (requeued)
  std::vector<finished_request> finished;  // cancelled since the last schedule(), or expired
  int32_t n_tokens = 0;                    // sum of seqs[i].tokens.size() <= max_tokens_per_step
};

// What the forward produced for one sampled sequence, in the order of the plan's sampled seqs.
struct sampled_token {
  request_id id = 0;
  token_id token = 0;
  bool stop = false;  // the engine decided it is finished (EOS, stop string)
};

enum class add_status : uint8_t {
  ok,
  exceeds_kv_capacity,  // prompt + max_tokens needs more blocks than the whole pool (or window pool) holds
};

// The windowed layers' pool and their window, for a scheduler that releases blocks behind it.
struct window_kv {
  kv_block_pool* pool = nullptr;  // null: no release (every layer in the main pool)
  int64_t window = 0;             // tokens a query sees, itself included
};

class scheduler {
 public:
  // `pool` must outlive the scheduler, and the scheduler must be its only user.
  // `window`: the sliding-window release's pool (the same block size and salt as `pool`), or none.
  explicit scheduler(kv_block_pool& pool, scheduler_config config = {}, window_kv window = {});
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  add_status add(request_spec spec);
  // Finishes a live request now (`reason`: cancelled or error): a waiting one just leaves the
  // queue, a running one releases its blocks at once. Reported in the next plan's `finished`.
  // False when `id` is not live (unknown or already finished).
  bool cancel(request_id id, finish_reason reason = finish_reason::cancelled);

  step_plan schedule(int64_t now_ms);
  // `sampled`: one entry per plan seq with sample == true, in plan order. Advances every
  // scheduled sequence, registers blocks that became full, appends sampled tokens and finishes
  // requests on stop or max_tokens (releasing their blocks). Returns those finished. Sequences
  // cancelled between schedule() and update() are skipped.
  std::vector<finished_request> update(const step_plan& plan, std::span<const sampled_token> sampled);
  // The engine's measured time of a step it ran from `plan`: feeds the step-time budget's model
  // (ignored while no budget is set).
  void observe_step(const step_plan& plan, double ms);
  const step_cost_model& step_costs() const { return costs_; }

  int32_t n_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t n_waiting() const { return static_cast<int32_t>(waiting_.size()); }  // incl. preempted
  uint64_t n_preemptions() const { return n_preemptions_; }
  // Live requests only (finished ones are reported once, by schedule() or update()).
  std::optional<request_state> state(request_id id) const;
  std::optional<request_usage> usage(request_id id) const;
  // Prompt + output tokens of a live request.
  std::span<const token_id> tokens(request_id id) const;
  // Leading tokens of a live request whose K/V are in its blocks (0 when not live).
  int32_t n_computed(request_id id) const;

  // Block tables agree with the pool's ref counts (the scheduler as its only user), waiting
  // requests hold no blocks, queues agree with states; plus the pool's own invariants.
  bool check_invariants(std::string* why = nullptr) const;

 private:
  struct request {
    request_id id = 0;
    int32_t priority = 0;
    uint64_t arrival = 0;    // add() order: its queue place, kept across preemptions
    uint64_t admission = 0;  // order of its latest admission: larger = more recent
    std::optional<int64_t> deadline_ms;
    int32_t max_tokens = 0;
    int32_t n_prompt = 0;
    std::vector<token_id> tokens;  // prompt, then the output tokens sampled so far
    uint64_t cache_root = 0;       // its prefix-cache namespace (request_spec::cache_root)
    request_state state = request_state::waiting;
    // Leading tokens whose K/V are in `blocks`. While live, n_computed < tokens.size(): the
    // last sampled token is always still to be fed.
    int32_t n_computed = 0;
    // tokens.size() at the latest admission: in prefill (or recompute) while n_computed < this.
    int32_t n_prefill_end = 0;
    std::vector<block_id> blocks;         // block table; empty unless running
    std::vector<block_id> window_blocks;  // window table (a window pool only): as long as blocks
    int32_t window_first = 0;             // window_blocks[0, window_first) are released
    std::vector<uint64_t> block_hashes;   // chain hashes of blocks[0, size()), all full
    int32_t n_cached_prompt = -1;         // -1 until first admission
    int32_t n_preemptions = 0;
  };
  struct queue_key {
    int32_t priority;
    uint64_t arrival;
    auto operator<=>(const queue_key&) const = default;
  };
  struct slot {
    request* req;
    int32_t n_tokens;
  };
  enum class admit_result : uint8_t { admitted, no_slot, no_blocks };

  void expire(int64_t now_ms, step_plan& plan);
  void schedule_decodes(step_plan& plan);
  void apply_step_time_budget();
  void schedule_prefill_chunks(step_plan& plan);
  void admit_waiting(step_plan& plan);
  admit_result try_admit(request& r);
  bool reserve_blocks(request& r, int32_t n_tokens, step_plan& plan);
  request* pick_victim() const;
  void preempt(request& r, step_plan& plan);
  void unschedule(const request& r);
  void finish(request& r, finish_reason reason, std::vector<finished_request>& out);
  void release_blocks(request& r);
  void register_full_blocks(request& r);
  // Window pool: releases r's window blocks behind its next token's window.
  void release_behind_window(request& r);
  // The longest prefix of `n_hits` cached blocks of r whose next token's window blocks the
  // window pool holds (docs/worker.md, "Sliding-window layers in the KV cache"), in blocks.
  int32_t window_prefix(const request& r, int32_t n_hits) const;
  // r's window table for [0, n_cached_blocks) cached and [n_cached_blocks, n_blocks) fresh
  // blocks; false (nothing held) when the window pool is short.
  bool take_window_blocks(request& r, int32_t n_cached_blocks, int32_t n_blocks);
  std::vector<request*> running_by_priority() const;
  void build_plan(step_plan& plan) const;

  kv_block_pool& pool_;
  window_kv window_;
  scheduler_config config_;
  int32_t block_size_;
  std::unordered_map<request_id, request> requests_;    // live: waiting, preempted, running
  std::set<std::pair<queue_key, request_id>> waiting_;  // waiting + preempted, admission order
  std::vector<request*> running_;                       // admission order
  std::set<std::pair<int64_t, request_id>> deadlines_;  // live requests with a deadline
  std::vector<finished_request> cancelled_;             // since the last schedule()
  uint64_t n_arrivals_ = 0;                             // add() calls: the next arrival number
  uint64_t n_admissions_ = 0;                           // admissions, readmissions included
  uint64_t n_preemptions_ = 0;
  uint64_t n_steps_ = 0;
  // The step being built: what is scheduled so far and the budget left.
  std::vector<slot> slots_;
  int32_t budget_left_ = 0;
  step_cost_model costs_;
  // The head that last failed to get blocks and the pool's availability then: it is not tried
  // again (acquire_prefix + release) until blocks free up, so a blocked head does not inflate
  // the prefix-cache query statistics every step.
  struct blocked_head {
    request_id id;
    int32_t n_available, n_window_available;
  };
  std::optional<blocked_head> blocked_head_;
  int32_t n_window_available() const { return window_.pool ? window_.pool->n_available() : 0; }
};

}  // namespace sy
