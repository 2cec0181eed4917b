#include "worker/service/worker_service.hpp"

#include <chrono>
#include <cstdio>

#include "common/tokenizer/chat_template.hpp"

namespace sy {
namespace {

// Engine-side id, unique across routers: the identity's length, the identity, the request id.
std::string engine_id(const std::string& peer, const std::string& request_id) {
  return std::to_string(peer.size()) + ":" + peer + request_id;
}

}  // namespace

proto::tokenizer_spec tokenizer_spec_from(const gguf::file& f) {
  proto::tokenizer_spec t = tokenizer::spec_from_gguf(f);  // every tokenizer.ggml.* field, defaults applied
  t.chat_template = chat_template::source_of(f);
  return t;
}

worker_service::worker_service(engine& eng, service_config config)
    : eng_(eng), config_(std::move(config)), constraints_(eng.model().vocab()) {
  welcome_.worker_id = config_.worker_id;
  welcome_.model_id = config_.model_id;
  welcome_.served_model_names = config_.served_model_names;
  const auto& ec = eng_.config();
  welcome_.context_length = static_cast<uint32_t>(ec.max_context);
  welcome_.kv_capacity_tokens = static_cast<uint32_t>(ec.n_kv_blocks * ec.block_size);
  welcome_.kv_block_size = static_cast<uint32_t>(ec.block_size);
  welcome_.max_running = static_cast<uint32_t>(ec.sched.max_running);
  welcome_.tokenizer = tokenizer_spec_from(eng_.model().file());
  welcome_.tokenizer.add_bos = eng_.model().vocab().add_bos();  // the effective value, default included
  if (!config_.chat_template.empty()) welcome_.tokenizer.chat_template = config_.chat_template;
  if (ec.prefix_caching) kv_ = std::make_unique<kv_publisher>(eng_.pool(), config_.model_id);
  welcome_.kv_events = kv_ != nullptr;
  welcome_.kv_hash_salt = eng_.pool().salt();
}

void worker_service::send_kv(std::vector<kv_publisher::addressed>& msgs, std::vector<out_frame>& out) {
  for (const auto& [peer, m] : msgs) send(peer, m, out);
  msgs.clear();
  counters_.kv = kv_->counters();
  counters_.kv_subscribers = kv_->n_subscribers();
}

template <class T>
void worker_service::send(const std::string& peer, const T& m, std::vector<out_frame>& out) {
  out.push_back({peer, std::string(proto::name(proto::type_of<T>)), proto::encode(m)});
}

namespace {
// " trace <trace id>" for a submit's traceparent (docs/router.md, "Tracing"), "" without one.
std::string trace_note(const std::string& traceparent) {
  if (traceparent.size() < 35) return "";
  return " trace " + traceparent.substr(3, 32);
}
}  // namespace

void worker_service::send_error(const std::string& peer, const std::string& request_id, error_code code,
                                const std::string& message, std::vector<out_frame>& out, uint64_t failure) {
  proto::error e;
  e.request_id = request_id;
  e.code = code;
  e.message = message;
  e.failure = failure;
  send(peer, e, out);
  counters_.errors_sent++;
}

void worker_service::on_frame(const std::string& peer, const std::string& type, const std::string& body, int64_t now_ms,
                              std::vector<out_frame>& out) {
  counters_.frames_in++;
  proto::decode_result r = proto::decode(type, body);
  if (!r) {
    counters_.bad_messages++;
    if (type != proto::name(proto::msg_type::error)) {  // never answer an error with an error
      send(peer, proto::to_wire(r.failure()), out);
      counters_.errors_sent++;
    }
    return;
  }
  if (const auto* h = r.get_if<proto::hello>()) {
    if (auto refuse = proto::check_version(h->version)) {
      send(peer, *refuse, out);
      counters_.errors_sent++;
      return;
    }
    peers_[peer] = h->router_id;
    send(peer, welcome_, out);
    if (h->kv_events && kv_) {
      kv_->subscribe(peer, kv_out_);  // its view starts from a snapshot (before the heartbeat naming its seq)
      send_kv(kv_out_, out);
    }
    heartbeat(now_ms, out);  // load right away, so a router can dispatch at once
  } else if (const auto* s = r.get_if<proto::submit>()) {
    handle_submit(peer, *s, now_ms, out);
  } else if (const auto* em = r.get_if<proto::embed>()) {
    handle_embed(peer, *em, out);
  } else if (const auto* c = r.get_if<proto::cancel>()) {
    counters_.cancels++;
    eng_.cancel(engine_id(peer, c->request_id));  // unknown or finished: nothing to do
  } else if (r.get_if<proto::kv_resync>()) {
    if (kv_) {
      kv_->resync(peer, kv_out_);
      send_kv(kv_out_, out);
    }
  } else if (r.get_if<proto::drain>()) {
    draining_ = true;
  } else if (r.get_if<proto::error>()) {
    // A router's complaint about something we sent: counted, never answered.
    counters_.bad_messages++;
  } else {
    counters_.bad_messages++;
    send_error(peer, "", proto::error_code::bad_message, "message type '" + type + "' is not accepted by a worker",
               out);
  }
}

void worker_service::handle_submit(const std::string& peer, const proto::submit& m, int64_t now_ms,
                                   std::vector<out_frame>& out) {
  counters_.submits++;
  if (draining_) {
    counters_.rejected++;
    return send_error(peer, m.request_id, proto::error_code::overloaded, "worker is draining", out);
  }
  const std::string id = engine_id(peer, m.request_id);
  const int64_t deadline_ms = m.budget_ms != 0 ? now_ms + static_cast<int64_t>(m.budget_ms) : 0;
  auto constraint = constraints_.get(m.constraint);
  if (const auto* why = std::get_if<std::string>(&constraint)) {
    counters_.rejected++;
    return send_error(peer, m.request_id, proto::error_code::invalid_request, *why, out);
  }
  std::vector<token_id> prompt(m.prompt.begin(), m.prompt.end());
  auto err = eng_.submit(id, std::move(prompt), m.sampling, m.priority, deadline_ms,
                         static_cast<int32_t>(m.n_generated),  // < prompt size (checked when decoded)
                         std::get<std::shared_ptr<grammar_masks>>(std::move(constraint)), m.cache_root);
  if (err) {
    counters_.rejected++;
    std::fprintf(stderr, "switchyard-worker: request %s%s refused: %s\n", m.request_id.c_str(),
                 trace_note(m.traceparent).c_str(), err->message.c_str());
    // The engine's message names its internal id; routers know theirs.
    if (err->code == error_code::duplicate_request)
      return send_error(peer, m.request_id, error_code::duplicate_request,
                        "request_id '" + m.request_id + "' is already live", out);
    // exceeds_kv_capacity too: the request cannot fit here whatever the load, a 400 as before.
    return send_error(peer, m.request_id, error_code::invalid_request, err->message, out);
  }
  owner o;
  o.peer = peer;
  o.request_id = m.request_id;
  o.stream = m.stream;
  o.trace = trace_note(m.traceparent);
  if (counters_.requests_muted < config_.mute_first_requests) {  // fault injection (tests)
    counters_.requests_muted++;
    o.muted = true;
  }
  o.pending.request_id = m.request_id;
  owners_[id] = std::move(o);
}

void worker_service::handle_embed(const std::string& peer, const proto::embed& m, std::vector<out_frame>& out) {
  counters_.embeds++;
  if (draining_) {
    counters_.rejected++;
    return send_error(peer, m.request_id, proto::error_code::overloaded, "worker is draining", out);
  }
  if (m.dimensions != 0 && static_cast<int32_t>(m.dimensions) != eng_.embedding_size()) {
    counters_.rejected++;
    return send_error(peer, m.request_id, error_code::invalid_request,
                      "dimensions " + std::to_string(m.dimensions) +
                          " is not supported: this model's embeddings have " + std::to_string(eng_.embedding_size()) +
                          " dimensions",
                      out);
  }
  // The answer must fit one embeddings body (5 bytes a float32 in msgpack, plus each array's header).
  const size_t per_input = 5 * static_cast<size_t>(eng_.embedding_size()) + 8;
  const size_t max_inputs = (proto::k_max_embeddings_body_bytes - 4096) / per_input;
  if (m.inputs.size() > max_inputs) {
    counters_.rejected++;
    return send_error(peer, m.request_id, error_code::invalid_request,
                      std::to_string(m.inputs.size()) + " inputs: at most " + std::to_string(max_inputs) +
                          " fit one answer of this model's " + std::to_string(eng_.embedding_size()) +
                          "-dimension embeddings; split the request",
                      out);
  }
  const std::string id = engine_id(peer, m.request_id);
  std::vector<std::vector<token_id>> inputs(m.inputs.begin(), m.inputs.end());
  if (auto err = eng_.submit_embedding(id, std::move(inputs))) {
    counters_.rejected++;
    if (err->code == error_code::duplicate_request)
      return send_error(peer, m.request_id, error_code::duplicate_request,
                        "request_id '" + m.request_id + "' is already live", out);
    const error_code code = err->code == error_code::embeddings_not_supported ? err->code : error_code::invalid_request;
    return send_error(peer, m.request_id, code, err->message, out);
  }
  owner o;
  o.peer = peer;
  o.request_id = m.request_id;
  o.stream = false;
  owners_[id] = std::move(o);
}

bool worker_service::step(int64_t now_ms, std::vector<out_frame>& out) {
  if (!eng_.has_work()) return false;
  events_.clear();
  try {
    eng_.step(now_ms, events_);
  } catch (const std::exception& e) {
    // The step failed (a device error, an allocation): no request waits for an answer that will
    // never come, and the worker keeps serving. What the failed step produced is dropped.
    counters_.step_failures++;
    std::fprintf(stderr, "switchyard-worker: a step failed, ending %zu request(s): %s\n", owners_.size(), e.what());
    fail_all(std::string("the worker's step failed: ") + std::string(e.what()).substr(0, 1000), out);
    if (kv_) {  // the pool may have changed before the step failed
      kv_->publish(kv_out_);
      send_kv(kv_out_, out);
    }
    return eng_.has_work();
  }
  if (kv_) {
    kv_->publish(kv_out_);
    send_kv(kv_out_, out);
  }
  for (auto& ev : events_) {
    // Counted whether or not the router is still there to hear about it.
    if (ev.finish != finish_reason::none) counters_.finished[static_cast<size_t>(ev.finish)]++;
    counters_.generated_tokens += ev.tokens.size();
    auto it = owners_.find(ev.id);
    if (it == owners_.end()) continue;  // its router is gone
    owner& o = it->second;
    proto::tokens& t = o.pending;
    t.token_ids.insert(t.token_ids.end(), ev.tokens.begin(), ev.tokens.end());
    for (const auto& lp : ev.logprobs) {
      proto::token_logprob w{lp.token, lp.logprob, {}};
      for (const auto& [id, v] : lp.top) w.top.push_back({id, v});
      t.logprobs.push_back(std::move(w));
    }
    t.text += ev.text;
    const bool done = ev.finish != finish_reason::none;
    if (done) {
      t.finish_reason = ev.finish;
      t.usage.prompt_tokens = static_cast<uint32_t>(ev.usage.n_prompt);
      t.usage.cached_prompt_tokens = static_cast<uint32_t>(std::max(0, ev.usage.n_cached_prompt));
      t.usage.completion_tokens = static_cast<uint32_t>(ev.usage.n_completion);
      t.stop = ev.stop;
      counters_.prompt_tokens += t.usage.prompt_tokens;
      counters_.cached_prompt_tokens += t.usage.cached_prompt_tokens;
    }
    if (o.stream || done) {
      // Split long accumulations so every body stays under the protocol's limits.
      while (t.token_ids.size() > proto::k_max_tokens_per_message) {
        proto::tokens part;
        part.request_id = t.request_id;
        part.token_ids.assign(t.token_ids.begin(), t.token_ids.begin() + proto::k_max_tokens_per_message);
        t.token_ids.erase(t.token_ids.begin(), t.token_ids.begin() + proto::k_max_tokens_per_message);
        if (!t.logprobs.empty()) {  // one per token: they split with the ids
          part.logprobs.assign(t.logprobs.begin(), t.logprobs.begin() + proto::k_max_tokens_per_message);
          t.logprobs.erase(t.logprobs.begin(), t.logprobs.begin() + proto::k_max_tokens_per_message);
        }
        part.seq = ++o.frames_sent;
        if (!(o.muted && part.seq > 1) && !drop_injected())
          send(o.peer, part, out);  // text travels with the final part
      }
      if (!t.token_ids.empty() || !t.text.empty() || done) {
        t.seq = ++o.frames_sent;
        if (!(o.muted && t.seq > 1) && (done || !drop_injected())) send(o.peer, t, out);
      }
      t.token_ids.clear();
      t.text.clear();
      t.logprobs.clear();
    }
    if (done) owners_.erase(it);
  }
  embedded_.clear();
  eng_.take_embeddings(embedded_);
  for (auto& e : embedded_) {
    counters_.prompt_tokens += static_cast<uint64_t>(e.prompt_tokens);
    auto it = owners_.find(e.id);
    if (it == owners_.end()) continue;  // its router is gone
    proto::embeddings m;
    m.request_id = it->second.request_id;
    m.data = std::move(e.data);
    m.prompt_tokens = static_cast<uint32_t>(e.prompt_tokens);
    send(it->second.peer, m, out);
    counters_.embeds_answered++;
    owners_.erase(it);
  }
  return eng_.has_work();
}

bool worker_service::drop_injected() {
  if (counters_.frames_dropped >= config_.drop_first_frames) return false;
  counters_.frames_dropped++;
  return true;
}

void worker_service::fail_all(const std::string& message, std::vector<out_frame>& out) {
  for (const auto& [id, o] : owners_) {
    std::fprintf(stderr, "switchyard-worker: request %s%s ended: internal_error\n", o.request_id.c_str(),
                 o.trace.c_str());
    send_error(o.peer, o.request_id, proto::error_code::internal_error, message, out, counters_.step_failures);
    eng_.cancel(id);
  }
  owners_.clear();
}

void worker_service::heartbeat(int64_t now_ms, std::vector<out_frame>& out) {
  const engine_stats s = eng_.stats();
  proto::heartbeat hb;
  hb.running = static_cast<uint32_t>(s.running);
  hb.waiting = static_cast<uint32_t>(s.waiting);
  hb.free_kv_blocks = static_cast<uint32_t>(s.free_blocks);
  hb.total_kv_blocks = static_cast<uint32_t>(s.total_blocks);
  hb.free_window_kv_blocks = static_cast<uint32_t>(s.window_free_blocks);
  hb.total_window_kv_blocks = static_cast<uint32_t>(s.window_total_blocks);
  hb.step_time_ms = s.mean_step_ms;
  hb.steps = s.steps;
  hb.draining = draining_;
  (void)now_ms;  // the engine's clock is steady; the heartbeat reports the wall clock for people
  hb.unix_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  for (const auto& [peer, router_id] : peers_) {
    hb.kv_seq = kv_ ? kv_->last_seq(peer) : 0;
    send(peer, hb, out);
  }
}

void worker_service::on_peer_gone(const std::string& peer) {
  counters_.peers_gone++;
  peers_.erase(peer);
  if (kv_) {
    kv_->unsubscribe(peer);
    counters_.kv_subscribers = kv_->n_subscribers();
  }
  for (auto it = owners_.begin(); it != owners_.end();) {
    if (it->second.peer == peer) {
      eng_.cancel(it->first);
      it = owners_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace sy
