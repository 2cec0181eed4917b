// The worker's engine: continuous batching over the paged KV cache, one step at a time.
//
// A plain state class (the engine actor is a thin shell around it): submit() and cancel()
// between steps, step() runs one scheduler iteration — one batched forward over every scheduled
// token — and reports what each request produced. Owned by one thread (the engine actor's).
//
// Per step: scheduler.schedule(now) -> the forward backend over the plan (decodes + prefill
// chunks, K/V written through block tables) -> per sampled sequence: the token (sampled by the
// backend, or by the request's host sampler from its logits row), UTF-8-safe detokenizer, stop
// strings, EOS -> scheduler.update(). Finished requests (stop, length, cancelled, deadline)
// release their blocks in the step that finishes them.
//
// The backend (worker/model/forward_backend.hpp) is the only part that differs between devices: the
// CPU one (the default) or cuda_forward. A backend that samples gets the rows of requests that
// need no logprobs and no repetition penalty (the device sampler has neither), so only their
// token ids come back; the others' rows come back as logits for the host sampler.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error_code.hpp"
#include "common/tokenizer/stream_decoder.hpp"
#include "worker/engine/kv_block_pool.hpp"
#include "worker/engine/sampler.hpp"
#include "worker/engine/scheduler.hpp"
#include "worker/engine/stop_matcher.hpp"
#include "worker/engine/thinking_budget.hpp"
#include "worker/engine/token_mask.hpp"
#include "worker/model/cpu_backend.hpp"
#include "worker/model/forward_backend.hpp"

namespace sy {

// Embeddings (docs/worker.md, "Embeddings"): how an input's final normed hidden states become
// one vector. none: the engine serves no embeddings (submit_embedding refuses).
enum class embedding_pooling : uint8_t { none, mean, last };

struct engine_config {
  int32_t n_kv_blocks = 1024;  // KV arena size in blocks (a given backend's own count wins)
  int32_t block_size = 16;     // tokens per block
  int64_t max_context = 2048;  // prompt + max_tokens per request
  bool prefix_caching = true;  // reuse cached KV blocks of identical prompt prefixes
  // Sliding-window layers keep only the blocks their window still sees (worker/model/kv_window.hpp);
  // n_kv_blocks is then the byte budget, split between the two pools. CPU only.
  bool kv_window_release = true;
  cpu::kv_type kv_type = cpu::kv_type::f16;  // KV element type; q8_0 needs head_dim % 32 == 0
  scheduler_config sched;
  embedding_pooling pooling = embedding_pooling::none;  // --embeddings / --pooling
};

// Why submit() refused a request (the caller turns it into an error message).
struct submit_error {
  error_code code = error_code::invalid_request;  // duplicate_request, invalid_request or exceeds_kv_capacity
  std::string message;                            // names the field or the limit
};

// What one request produced in a step: new tokens and text, and the end when finished.
// Completion tokens (docs/worker.md, "Completion tokens and logprobs"): every token sampled for a
// request is one — the end-of-generation token that ends it included — so `tokens` holds it,
// usage counts it and `logprobs` has its entry; only its text is empty.
struct request_event {
  std::string id;
  std::vector<token_id> tokens;
  std::string text;                           // UTF-8-complete delta, stop strings excluded
  std::vector<token_logprobs_info> logprobs;  // one per token when the request asked for them
  finish_reason finish = finish_reason::none;
  request_usage usage;  // filled on finish
  std::string stop;     // finish stop on a stop string: that string (empty: any other end)

  // The one place a sampled token joins the event (the rule above); returns nothing, adds no text.
  void add_completion_token(token_id t, token_logprobs_info&& lp, bool want_logprobs) {
    tokens.push_back(t);
    if (want_logprobs) logprobs.push_back(std::move(lp));
  }
};

// A finished embedding request (submit_embedding): one unit-length vector per input, in order.
struct embedding_event {
  std::string id;
  std::vector<std::vector<float>> data;
  int64_t prompt_tokens = 0;  // tokens run, all inputs
};

struct engine_stats {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t free_blocks = 0;  // available: free + evictable cached
  int32_t total_blocks = 0;
  int32_t window_free_blocks = 0;  // the sliding-window release's pool (0 and 0 without it)
  int32_t window_total_blocks = 0;
  uint64_t steps = 0;
  uint64_t preemptions = 0;
  uint64_t prompt_tokens = 0;  // tokens run through the forward as prefill
  uint64_t decode_tokens = 0;  // tokens sampled
  uint64_t prefix_query_tokens = 0;
  uint64_t prefix_hit_tokens = 0;
  double last_step_ms = 0;
  double mean_step_ms = 0;  // exponential moving average
  int32_t last_batch_tokens = 0;
  int32_t last_batch_seqs = 0;
};

// The CPU backend for `config`: cpu_backend with config.n_kv_blocks blocks' bytes, split between
// the two pools when the sliding-window release is on (split_kv_budget). Throws
// std::invalid_argument when the model's heads cannot be stored as config.kv_type.
std::unique_ptr<forward_backend> make_cpu_backend(const llama_model& model, cpu::thread_pool& pool,
                                                  const engine_config& config);

// `--kv-window-release on|off` (default on) into config.kv_window_release; throws
// std::invalid_argument naming the flag on any other value.
bool parse_kv_window_release(const std::string& value);

class engine {
 public:
  // On the CPU (cpu_backend with config.n_kv_blocks, block_size, kv_type; with the window
  // release, those bytes split as split_kv_budget says). Throws
  // std::invalid_argument when the model's heads cannot be stored as config.kv_type.
  engine(const llama_model& model, cpu::thread_pool& pool, engine_config config);
  // On `backend`, whose KV storage sets the pool's size (config.n_kv_blocks and kv_type are
  // ignored; config.block_size must equal the backend's, else std::invalid_argument).
  engine(const llama_model& model, std::unique_ptr<forward_backend> backend, engine_config config);
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Validates and queues a request. `deadline_ms` is on the clock step() is given (0: none).
  // `n_generated` > 0 resumes a stream started elsewhere: the prompt's last n_generated tokens
  // are output already sent (proto::submit::n_generated). `constraint`: the output must be a
  // sentence of that grammar (structured outputs): each step masks the tokens that would leave
  // it, and the request stops as soon as the sentence is complete and nothing may follow.
  // `cache_root`: its prefix-cache namespace (proto::submit::cache_root; 0: the shared one).
  std::optional<submit_error> submit(const std::string& id, std::vector<token_id> prompt, const sampling_params& params,
                                     int32_t priority, int64_t deadline_ms = 0, int32_t n_generated = 0,
                                     std::shared_ptr<grammar_masks> constraint = nullptr, uint64_t cache_root = 0);
  // Queues an embedding request: each input's prompt goes through the forward pass (no
  // sampling) in a later step(), its final hidden states after the output norm are pooled as
  // config().pooling says and L2-normalized. The KV blocks it takes are freed in the same step
  // and never registered in the prefix cache. Refused (embeddings_not_supported) when the engine
  // serves no embeddings or its backend cannot; invalid_request for an empty input, a token
  // outside the vocabulary or an input longer than the context; exceeds_kv_capacity for one
  // longer than the KV cache.
  std::optional<submit_error> submit_embedding(const std::string& id, std::vector<std::vector<token_id>> inputs);
  // The embedding requests that step() finished since the last call (appended).
  void take_embeddings(std::vector<embedding_event>& out);
  // Cancels a live request (a generation: reported finished, cancelled, by the next step(); an
  // embedding request: dropped).
  bool cancel(const std::string& id);
  bool has_work() const { return !live_.empty() || !embeds_.empty(); }
  bool is_live(const std::string& id) const { return by_name_.count(id) != 0; }
  int32_t embedding_size() const { return static_cast<int32_t>(model_.hparams().n_embd); }

  // One iteration. Appends one event per request that produced something or finished.
  void step(int64_t now_ms, std::vector<request_event>& events);

  engine_stats stats() const;
  const kv_block_pool& pool() const { return pool_; }
  // The windowed layers' pool (0 blocks without the sliding-window release).
  const kv_block_pool& window_pool() const { return window_pool_; }
  // For the KV event publisher (worker/service/kv_publisher.hpp): recording and taking events, the
  // snapshot. Between steps only, on the engine's thread.
  kv_block_pool& pool() { return pool_; }
  // Tokens whose K/V live in the cache for running requests (KV slots holding live tokens).
  int64_t live_kv_tokens() const;
  const engine_config& config() const { return config_; }
  const llama_model& model() const { return model_; }
  const forward_backend& backend() const { return *backend_; }

 private:
  // Checks shared by submit and submit_embedding: the id (non-empty, not live as either kind)
  // and every token inside the vocabulary (`what` names the tokens in the message).
  std::optional<submit_error> check_name(const std::string& id) const;
  std::optional<submit_error> check_vocabulary(std::span<const token_id> tokens, const std::string& what) const;
  struct live_request {
    std::string name;
    sampling_params params;
    sampler smp;
    stop_matcher stops;
    stream_decoder decoder;
    std::vector<float> raw_logits;            // requests with logprobs: the row before sampling changed it
    bool on_backend = false;                  // sampled by the backend (only the token id comes back)
    uint64_t backend_seed = 0;                // its seed there: params.seed, or drawn once at submit
    std::shared_ptr<grammar_masks> grammar;   // constrained decoding, else null
    grammar::matcher_state gstate;            // after the output so far (survives preemption)
    std::optional<thinking_budget> thinking;  // params.thinking_budget set (and no grammar)
    live_request(std::string n, const sampling_params& p, const tokenizer& tok)
        : name(std::move(n)), params(p), smp(p), stops(p.stop), decoder(tok) {}
  };

  struct embed_job {
    std::string name;
    std::vector<std::vector<token_id>> inputs;
    embedding_event done;  // data filled as the inputs run
  };
  // Runs inputs of the oldest embedding job, within one step's token budget (at least one input
  // when blocks are free), and moves finished jobs to embeds_done_.
  void run_embeddings();
  void finish_event(request_id id, finish_reason reason, const request_usage& usage,
                    std::vector<request_event>& events);
  request_event& event_for(request_id id, std::vector<request_event>& events);
  row_sampling row_sampling_of(request_id id) const;

  const llama_model& model_;
  engine_config config_;
  std::unique_ptr<forward_backend> backend_;  // before pool_: its KV size sizes the pool
  kv_block_pool pool_;
  kv_block_pool window_pool_;
  scheduler sched_;
  std::unordered_map<request_id, std::unique_ptr<live_request>> live_;
  std::unordered_map<std::string, request_id> by_name_;
  request_id next_id_ = 1;
  engine_stats stats_;
  // Step scratch.
  std::vector<batch_seq> batch_;
  std::vector<row_sampling> row_sampling_;  // one per sampled sequence, plan order
  step_output out_;
  std::vector<sampled_token> sampled_;
  // Host sampling of a step: one job per row that came back as logits, and each row's result.
  struct host_row_job {
    request_id id;
    size_t row;         // among the step's sampled rows
    size_t logits_row;  // in out_.logits
  };
  struct pick {
    token_id token = 0;
    token_logprobs_info logprobs;
  };
  std::vector<host_row_job> host_rows_;
  std::vector<pick> picks_;
  cpu::thread_pool* sampling_pool_ = nullptr;  // the CPU engine's pool: rows sampled in parallel
  std::unordered_map<request_id, size_t> event_index_;
  std::vector<embed_job> embeds_;  // oldest first
  std::vector<embedding_event> embeds_done_;
  std::vector<float> hidden_;  // run_embeddings scratch
};

}  // namespace sy
