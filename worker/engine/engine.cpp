#include "worker/engine/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>

#include "common/kv_hash.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace sy {
namespace {

// Prefix-cache salt: blocks are only shared between requests of the same model. The file's
// name, not its path: routers compare hashes across workers, which mount it in different places.
uint64_t model_salt(const llama_model& m) {
  const std::string& path = m.file().path();
  return kv_model_salt(m.hparams().name + "/" + path.substr(path.find_last_of('/') + 1));
}

// The configured KV type, refused (before the arena is sized) when the model's heads cannot be
// stored as it.
cpu::kv_type checked_kv_type(const llama_model& m, cpu::kv_type t) {
  const std::string why = cpu::kv_type_error(t, m.hparams().head_dim);
  if (!why.empty()) throw std::invalid_argument("engine: " + why);
  return t;
}

// The config with the backend's KV size; refuses a backend whose block size differs.
engine_config with_backend_kv(engine_config c, const forward_backend& b) {
  if (b.block_size() != c.block_size)
    throw std::invalid_argument("engine: the backend's block size (" + std::to_string(b.block_size()) +
                                ") differs from the configured one (" + std::to_string(c.block_size) + ")");
  c.n_kv_blocks = b.n_kv_blocks();
  return c;
}

// The scheduler's window pool: the backend's window arena when it has one.
window_kv window_of(const llama_model& m, const forward_backend& b, kv_block_pool& window_pool) {
  if (b.n_window_blocks() == 0) return {};
  return {&window_pool, m.hparams().sliding_window};
}

}  // namespace

std::unique_ptr<forward_backend> make_cpu_backend(const llama_model& m, cpu::thread_pool& pool,
                                                  const engine_config& c) {
  const cpu::kv_type type = checked_kv_type(m, c.kv_type);
  const kv_window_split split =
      split_kv_budget(m, c.n_kv_blocks, c.block_size, c.max_context, c.sched.max_tokens_per_step, c.kv_window_release);
  return std::make_unique<cpu_backend>(m, pool, split.n_global_blocks, c.block_size, type, c.max_context, split);
}

bool parse_kv_window_release(const std::string& value) {
  if (value != "on" && value != "off") throw std::invalid_argument("--kv-window-release must be on or off");
  return value == "on";
}

engine::engine(const llama_model& model, cpu::thread_pool& pool, engine_config config)
    : engine(model, make_cpu_backend(model, pool, config), config) {
  sampling_pool_ = &pool;
}

engine::engine(const llama_model& model, std::unique_ptr<forward_backend> backend, engine_config config)
    : model_(model),
      config_(with_backend_kv(config, *backend)),
      backend_(std::move(backend)),
      pool_(config_.n_kv_blocks, config_.block_size, model_salt(model)),
      window_pool_(backend_->n_window_blocks(), config_.block_size, model_salt(model)),
      sched_(pool_, config_.sched, window_of(model, *backend_, window_pool_)) {
  stats_.total_blocks = config_.n_kv_blocks;
  stats_.window_total_blocks = window_pool_.n_blocks();
  pool_.set_prefix_caching(config_.prefix_caching);
  window_pool_.set_prefix_caching(config_.prefix_caching);
}

int64_t engine::live_kv_tokens() const {
  int64_t n = 0;
  for (const auto& [id, lr] : live_) n += sched_.n_computed(id);
  return n;
}

std::optional<submit_error> engine::check_name(const std::string& id) const {
  if (id.empty()) return submit_error{error_code::invalid_request, "request_id is empty"};
  // Generations and embedding jobs share one namespace: a cancel names either.
  if (by_name_.count(id) ||
      std::any_of(embeds_.begin(), embeds_.end(), [&](const embed_job& j) { return j.name == id; }))
    return submit_error{error_code::duplicate_request, "request_id '" + id + "' is already live"};
  return std::nullopt;
}

std::optional<submit_error> engine::check_vocabulary(std::span<const token_id> tokens, const std::string& what) const {
  const int64_t n_vocab = model_.hparams().n_vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      return submit_error{error_code::invalid_request,
                          what + "[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                              " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")"};
  return std::nullopt;
}

std::optional<submit_error> engine::submit(const std::string& id, std::vector<token_id> prompt,
                                           const sampling_params& params, int32_t priority, int64_t deadline_ms,
                                           int32_t n_generated, std::shared_ptr<grammar_masks> constraint,
                                           uint64_t cache_root) {
  if (auto e = check_name(id)) return e;
  if (prompt.empty()) return submit_error{error_code::invalid_request, "prompt is empty"};
  if (auto e = check_vocabulary(prompt, "prompt")) return e;
  if (const auto e = validate(params)) return submit_error{error_code::invalid_request, e->field + ": " + e->message};
  if (n_generated < 0 || static_cast<size_t>(n_generated) >= prompt.size() || n_generated >= params.max_tokens)
    return submit_error{error_code::invalid_request, "n_generated must be below the prompt's length and max_tokens"};
  const int64_t need = static_cast<int64_t>(prompt.size()) - n_generated + params.max_tokens;
  if (need > config_.max_context)
    return submit_error{error_code::invalid_request, "prompt (" + std::to_string(prompt.size()) +
                                                         " tokens) + max_tokens (" + std::to_string(params.max_tokens) +
                                                         ") exceeds the context length (" +
                                                         std::to_string(config_.max_context) + ")"};
  const request_id rid = next_id_++;
  const std::vector<token_id> resumed(prompt.end() - n_generated, prompt.end());
  request_spec spec;
  spec.id = rid;
  spec.prompt = std::move(prompt);
  spec.max_tokens = params.max_tokens;
  spec.priority = priority;
  if (deadline_ms > 0) spec.deadline_ms = deadline_ms;
  spec.n_generated = n_generated;
  spec.cache_root = cache_root;
  if (sched_.add(std::move(spec)) != add_status::ok)
    return submit_error{error_code::exceeds_kv_capacity,
                        "prompt + max_tokens needs more KV blocks than this worker has (" +
                            std::to_string(config_.n_kv_blocks) + " blocks of " + std::to_string(config_.block_size) +
                            " tokens)"};
  auto lr = std::make_unique<live_request>(id, params, model_.vocab());
  // A resumed stream: detokenizer, stop strings and sampler continue from where the first
  // worker left them (a UTF-8 sequence or stop-string prefix held back there completes here);
  // the text of the resumed tokens is the client's already, so it is dropped.
  for (const token_id t : resumed) lr->stops.push(lr->decoder.push(t));
  lr->smp.skip_samples(resumed.size());
  if (constraint) {
    const auto& m = constraint->matcher();
    lr->gstate = m.initial();
    for (const token_id t : resumed) lr->gstate = m.accept(lr->gstate, model_.vocab().token_bytes(t));
    lr->grammar = std::move(constraint);
  }
  // A thinking budget (never under a grammar: the grammar decides every token there).
  if (params.thinking_budget > 0 && !lr->grammar) {
    lr->thinking.emplace(params.thinking_budget, params.thinking_end, model_.vocab());
    for (const token_id t : resumed) lr->thinking->replay(t);
  }
  // The backend samples what its sampler can: no logprobs (they need the row), no repetition
  // penalty (it needs the history).
  lr->on_backend = backend_->samples() && params.logprobs == 0 &&
                   (params.repetition_penalty == 1.f || params.repeat_last_n == 0) && !lr->grammar;
  if (lr->on_backend)
    lr->backend_seed =
        params.has_seed ? params.seed : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  live_.emplace(rid, std::move(lr));
  by_name_.emplace(id, rid);
  return std::nullopt;
}

bool engine::cancel(const std::string& id) {
  auto it = by_name_.find(id);
  if (it == by_name_.end()) {
    const auto job = std::find_if(embeds_.begin(), embeds_.end(), [&](const embed_job& j) { return j.name == id; });
    if (job == embeds_.end()) return false;
    embeds_.erase(job);
    return true;
  }
  return sched_.cancel(it->second, finish_reason::cancelled);
}

std::optional<submit_error> engine::submit_embedding(const std::string& id, std::vector<std::vector<token_id>> inputs) {
  if (config_.pooling == embedding_pooling::none)
    return submit_error{error_code::embeddings_not_supported,
                        "this worker does not serve embeddings (start it with --embeddings)"};
  if (!backend_->has_hidden_states())
    return submit_error{error_code::embeddings_not_supported,
                        "this worker's backend (" + backend_->describe() + ") does not compute embeddings"};
  if (auto e = check_name(id)) return e;
  if (inputs.empty()) return submit_error{error_code::invalid_request, "no input"};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    const std::string at = "input " + std::to_string(i);
    if (in.empty()) return submit_error{error_code::invalid_request, at + " is empty"};
    if (auto e = check_vocabulary(in, at)) return e;
    if (static_cast<int64_t>(in.size()) > config_.max_context)
      return submit_error{error_code::invalid_request, at + " has " + std::to_string(in.size()) +
                                                           " tokens, more than the context length (" +
                                                           std::to_string(config_.max_context) + ")"};
    // One step runs the whole input: the window pool (when there is one) holds all its blocks too.
    const int64_t n_blocks = (static_cast<int64_t>(in.size()) + config_.block_size - 1) / config_.block_size;
    if (n_blocks > config_.n_kv_blocks || (window_pool_.n_blocks() > 0 && n_blocks > window_pool_.n_blocks()))
      return submit_error{error_code::exceeds_kv_capacity, at + " needs more KV blocks than this worker has (" +
                                                               std::to_string(config_.n_kv_blocks) + " blocks of " +
                                                               std::to_string(config_.block_size) + " tokens)"};
  }
  embed_job job;
  job.name = id;
  job.inputs = std::move(inputs);
  job.done.id = id;
  embeds_.push_back(std::move(job));
  return std::nullopt;
}

void engine::take_embeddings(std::vector<embedding_event>& out) {
  for (auto& e : embeds_done_) out.push_back(std::move(e));
  embeds_done_.clear();
}

void engine::run_embeddings() {
  if (embeds_.empty()) return;
  embed_job& job = embeds_.front();
  const int64_t bs = config_.block_size, E = model_.hparams().n_embd;
  const bool last = config_.pooling == embedding_pooling::last;
  // The inputs of this step: from the first not yet run, within the step's token budget (one
  // input at least).
  const size_t first = job.done.data.size();
  size_t end = first;
  int64_t tokens = 0, blocks = 0;
  while (end < job.inputs.size()) {
    const int64_t n = static_cast<int64_t>(job.inputs[end].size());
    if (end > first && tokens + n > config_.sched.max_tokens_per_step) break;
    tokens += n;
    blocks += (n + bs - 1) / bs;
    ++end;
  }
  // The blocks of both pools (the window pool's only with the sliding-window release), or none.
  const bool windowed = window_pool_.n_blocks() > 0;
  auto take = [&](int32_t n) {
    auto got = pool_.allocate(n);
    if (got && windowed) {
      auto w = window_pool_.allocate(n);
      if (!w) {
        pool_.release(*got);
        return decltype(got){};
      }
      got->insert(got->end(), w->begin(), w->end());  // main blocks, then window blocks
    }
    return got;
  };
  auto got = take(static_cast<int32_t>(blocks));
  if (!got && end > first + 1) {  // the blocks for the first input alone, then
    end = first + 1;
    tokens = static_cast<int64_t>(job.inputs[first].size());
    blocks = (tokens + bs - 1) / bs;
    got = take(static_cast<int32_t>(blocks));
  }
  if (!got) return;  // running requests hold the blocks: a later step, when they have finished
  const std::vector<block_id> all = std::move(*got);
  const std::span<const block_id> ids = std::span<const block_id>(all).first(static_cast<size_t>(blocks));
  const std::span<const block_id> window_ids = std::span<const block_id>(all).subspan(ids.size());  // empty without
  auto release = [&] {
    pool_.release(ids);
    if (windowed) window_pool_.release(window_ids);
  };
  // Never registered under a hash: released, they are free (no prefix-cache entry).
  try {
    batch_.clear();
    size_t b0 = 0;
    for (size_t i = first; i < end; ++i) {
      const auto& in = job.inputs[i];
      const size_t nb = (in.size() + static_cast<size_t>(bs) - 1) / static_cast<size_t>(bs);
      batch_seq b;
      b.tokens = in;
      b.pos0 = 0;
      b.block_ids = ids.subspan(b0, nb);
      if (windowed) b.window_block_ids = window_ids.subspan(b0, nb);
      b.all_logits = !last;
      b.logits = true;
      b.n_prompt = static_cast<int64_t>(in.size());
      batch_.push_back(b);
      b0 += nb;
    }
    backend_->run_hidden(batch_, hidden_);
    const size_t rows = last ? end - first : static_cast<size_t>(tokens);
    if (hidden_.size() != rows * static_cast<size_t>(E))
      throw std::logic_error("engine: the backend returned " + std::to_string(hidden_.size()) +
                             " hidden-state floats for " + std::to_string(rows) + " rows");
  } catch (...) {
    release();
    throw;
  }
  release();
  stats_.prompt_tokens += static_cast<uint64_t>(tokens);
  size_t row = 0;
  for (size_t i = first; i < end; ++i) {
    const size_t n = last ? 1 : job.inputs[i].size();
    std::vector<double> acc(static_cast<size_t>(E), 0.0);
    for (size_t r = 0; r < n; ++r, ++row) {
      const float* h = hidden_.data() + row * static_cast<size_t>(E);
      for (int64_t k = 0; k < E; ++k) acc[static_cast<size_t>(k)] += h[k];
    }
    double norm = 0;
    for (double& x : acc) {
      x /= static_cast<double>(n);
      norm += x * x;
    }
    norm = std::sqrt(norm);
    std::vector<float> v(static_cast<size_t>(E));
    for (int64_t k = 0; k < E; ++k)
      v[static_cast<size_t>(k)] = norm > 0 ? static_cast<float>(acc[static_cast<size_t>(k)] / norm) : 0.f;
    job.done.data.push_back(std::move(v));
    job.done.prompt_tokens += static_cast<int64_t>(job.inputs[i].size());
  }
  if (job.done.data.size() == job.inputs.size()) {
    embeds_done_.push_back(std::move(job.done));
    embeds_.erase(embeds_.begin());
  }
}

row_sampling engine::row_sampling_of(request_id id) const {
  const live_request& lr = *live_.at(id);
  if (!lr.on_backend) return {};
  // step: the same after a preemption (completion tokens, not steps run)
  return {.on_backend = true,
          .draw = draw_of(lr.params, lr.backend_seed, static_cast<uint64_t>(sched_.usage(id)->n_completion))};
}

request_event& engine::event_for(request_id id, std::vector<request_event>& events) {
  auto [it, fresh] = event_index_.emplace(id, events.size());
  if (fresh) {
    events.emplace_back();
    events.back().id = live_.at(id)->name;
  }
  return events[it->second];
}

void engine::finish_event(request_id id, finish_reason reason, const request_usage& usage,
                          std::vector<request_event>& events) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  live_request& lr = *it->second;
  request_event& ev = event_for(id, events);
  // A natural end releases text held back for a possible stop string or UTF-8 completion.
  if ((reason == finish_reason::length || reason == finish_reason::stop) && !lr.stops.stopped()) {
    std::string tail = lr.stops.push(lr.decoder.flush());
    if (!lr.stops.stopped()) tail += lr.stops.flush();
    ev.text += tail;
  }
  ev.finish = reason;
  ev.usage = usage;
  if (reason == finish_reason::stop && lr.stops.stopped()) ev.stop = lr.stops.matched();
  by_name_.erase(lr.name);
  live_.erase(it);
}

void engine::step(int64_t now_ms, std::vector<request_event>& events) {
  const auto t0 = std::chrono::steady_clock::now();
  event_index_.clear();
  run_embeddings();
  const step_plan plan = sched_.schedule(now_ms);
  for (const auto& f : plan.finished) finish_event(f.id, f.reason, f.usage, events);
  if (plan.seqs.empty()) return;

  batch_.clear();
  row_sampling_.clear();
  for (const auto& s : plan.seqs) {
    batch_seq b;
    b.tokens = s.tokens;
    b.pos0 = s.pos0;
    b.block_ids = s.block_table;
    b.window_block_ids = s.window_table;
    b.logits = s.sample;
    b.n_prompt = s.n_prompt;
    batch_.push_back(b);
    if (s.sample) row_sampling_.push_back(row_sampling_of(s.id));
    if (!s.sample)
      stats_.prompt_tokens += s.tokens.size();
    else if (s.tokens.size() > 1)
      stats_.prompt_tokens += s.tokens.size() - 1;
  }
  backend_->run(batch_, row_sampling_, out_);
  const tokenizer& vocab = model_.vocab();
  const int64_t n_vocab = model_.hparams().n_vocab;
  const auto n_host_rows = std::count(out_.tokens.begin(), out_.tokens.end(), step_output::k_not_sampled);
  if (out_.tokens.size() != row_sampling_.size() || out_.logits.size() != static_cast<size_t>(n_host_rows * n_vocab))
    throw std::logic_error("engine: the backend returned " + std::to_string(out_.tokens.size()) + " rows and " +
                           std::to_string(out_.logits.size()) + " logits for " + std::to_string(row_sampling_.size()) +
                           " sampled sequences");
  // Rows that came back as logits are sampled by their requests' host samplers (and their
  // logprobs computed) first, spread over the pool when the engine has one: each touches only its
  // own request and row.
  picks_.assign(out_.tokens.size(), {});
  host_rows_.clear();
  {
    size_t row = 0, host_row = 0;
    for (const auto& s : plan.seqs) {
      if (!s.sample) continue;
      if (out_.tokens[row] == step_output::k_not_sampled) host_rows_.push_back({s.id, row, host_row++});
      picks_[row].token = out_.tokens[row];
      ++row;
    }
  }
  auto sample_row = [&](const host_row_job& j) {
    live_request& lr = *live_.at(j.id);
    std::span<float> l(out_.logits.data() + j.logits_row * n_vocab, static_cast<size_t>(n_vocab));
    if (lr.params.logprobs > 0) lr.raw_logits.assign(l.begin(), l.end());
    if (lr.grammar) {  // tokens that would leave the grammar cannot be sampled
      const auto mask = lr.grammar->mask(lr.gstate);
      for (size_t t = 0; t < l.size(); ++t)
        if (!mask->allows(static_cast<token_id>(t))) l[t] = -std::numeric_limits<float>::infinity();
      if (mask->n_allowed == 0) l[static_cast<size_t>(model_.vocab().eos())] = 0;  // cannot happen; end it
    }
    pick& p = picks_[j.row];
    p.token = lr.smp.sample(l, sched_.tokens(j.id));
    if (lr.params.logprobs > 0) p.logprobs = logprobs_of(lr.raw_logits, p.token, lr.params.logprobs);
  };
  if (sampling_pool_)
    sampling_pool_->for_each(static_cast<int64_t>(host_rows_.size()), 2,
                             [&](int64_t k) { sample_row(host_rows_[static_cast<size_t>(k)]); });
  else
    for (const auto& j : host_rows_) sample_row(j);
  sampled_.clear();
  size_t row = 0;
  for (const auto& s : plan.seqs) {
    if (!s.sample) continue;
    live_request& lr = *live_.at(s.id);
    pick& p = picks_[row++];
    // A thinking past its budget is closed: the end text's tokens replace what was sampled.
    const token_id tok = lr.thinking ? lr.thinking->pick(p.token) : p.token;
    bool stop = false;
    request_event& ev = event_for(s.id, events);
    ev.add_completion_token(tok, std::move(p.logprobs), lr.params.logprobs > 0);
    if (!lr.params.ignore_eos && vocab.is_eog(tok)) {
      stop = true;  // counted and logprob'd like any token; no text
    } else {
      ev.text += lr.stops.push(lr.decoder.push(tok));
      stop = lr.stops.stopped();
      if (lr.grammar) {
        // A complete sentence after which nothing may follow ends the request now (no step spent
        // on a forced end token); a dead state cannot happen (the mask kept it alive).
        lr.gstate = lr.grammar->matcher().accept(lr.gstate, vocab.token_bytes(tok));
        stop = stop || lr.gstate.must_end() || lr.gstate.dead();
      }
    }
    sampled_.push_back({s.id, tok, stop});
  }
  stats_.decode_tokens += sampled_.size();
  for (const auto& f : sched_.update(plan, sampled_)) finish_event(f.id, f.reason, f.usage, events);

  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  sched_.observe_step(plan, ms);
  stats_.steps++;
  stats_.last_step_ms = ms;
  stats_.mean_step_ms = stats_.steps == 1 ? ms : 0.9 * stats_.mean_step_ms + 0.1 * ms;
  stats_.last_batch_tokens = plan.n_tokens;
  stats_.last_batch_seqs = static_cast<int32_t>(plan.seqs.size());
}

engine_stats engine::stats() const {
  engine_stats s = stats_;
  s.running = sched_.n_running();
  s.waiting = sched_.n_waiting();
  s.free_blocks = pool_.n_available();
  s.window_free_blocks = window_pool_.n_available();
  s.preemptions = sched_.n_preemptions();
  const auto ps = pool_.stats();
  s.prefix_query_tokens = ps.prefix_query_tokens;
  s.prefix_hit_tokens = ps.prefix_hit_tokens;
  return s;
}

}  // namespace sy
