#include "worker/engine.hpp"

#include <algorithm>
#include <chrono>
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

}  // namespace

engine::engine(const llama_model& model, cpu::thread_pool& pool, engine_config config)
    : engine(model,
             std::make_unique<cpu_backend>(model, pool, config.n_kv_blocks, config.block_size,
                                           checked_kv_type(model, config.kv_type), config.max_context),
             config) {
  sampling_pool_ = &pool;
}

engine::engine(const llama_model& model, std::unique_ptr<forward_backend> backend, engine_config config)
    : model_(model),
      config_(with_backend_kv(config, *backend)),
      backend_(std::move(backend)),
      pool_(config_.n_kv_blocks, config_.block_size, model_salt(model)),
      sched_(pool_, config_.sched) {
  stats_.total_blocks = config_.n_kv_blocks;
  pool_.set_prefix_caching(config_.prefix_caching);
}

int64_t engine::live_kv_tokens() const {
  int64_t n = 0;
  for (const auto& [id, lr] : live_) n += sched_.n_computed(id);
  return n;
}

std::optional<submit_error> engine::submit(const std::string& id, std::vector<token_id> prompt,
                                           const sampling_params& params, int32_t priority, int64_t deadline_ms,
                                           int32_t n_generated, std::shared_ptr<grammar_masks> constraint,
                                           uint64_t cache_root) {
  if (id.empty()) return submit_error{error_code::invalid_request, "request_id is empty"};
  if (by_name_.count(id)) return submit_error{error_code::duplicate_request, "request_id '" + id + "' is already live"};
  if (prompt.empty()) return submit_error{error_code::invalid_request, "prompt is empty"};
  const int64_t n_vocab = model_.hparams().n_vocab;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= n_vocab)
      return submit_error{error_code::invalid_request,
                          "prompt[" + std::to_string(i) + "] = " + std::to_string(prompt[i]) +
                              " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")"};
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
  if (it == by_name_.end()) return false;
  return sched_.cancel(it->second, finish_reason::cancelled);
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
  by_name_.erase(lr.name);
  live_.erase(it);
}

void engine::step(int64_t now_ms, std::vector<request_event>& events) {
  const auto t0 = std::chrono::steady_clock::now();
  event_index_.clear();
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
    const token_id tok = p.token;
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
  s.preemptions = sched_.n_preemptions();
  const auto ps = pool_.stats();
  s.prefix_query_tokens = ps.prefix_query_tokens;
  s.prefix_hit_tokens = ps.prefix_hit_tokens;
  return s;
}

}  // namespace sy
