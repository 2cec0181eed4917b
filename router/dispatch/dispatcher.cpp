#include "router/dispatch/dispatcher.hpp"

#include "common/kv_hash.hpp"
#include "router/base/router_clock.hpp"
#include "router/dispatch/answers.hpp"
#include "router/openai/anthropic_api.hpp"
#include "router/openai/embeddings_api.hpp"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cstdio>
#include <utility>

namespace sy::router {
namespace {

// How long after its deadline a dispatched request may still be ended by its worker.
constexpr double k_deadline_grace_s = 5.0;
// Attempts a request may lose to frames lost on the link before it ends with frames_lost.
constexpr uint32_t k_max_gaps = 3;
// Query-of-death prompts remembered at most (router/dispatch/dispatcher.hpp, query_of_death_ttl_s).
constexpr size_t k_max_deadly = 1024;

std::string wire_id(uint64_t id, uint32_t attempt, uint32_t choice) {
  return std::to_string(id) + "-" + std::to_string(attempt) + "." + std::to_string(choice);
}

}  // namespace

int64_t queue_tokens(const routed_request& r) {
  int64_t tokens = static_cast<int64_t>(r.prompt.size()) + static_cast<int64_t>(r.req.sampling.max_tokens) * r.req.n;
  if (const int64_t tpm = r.who->limits.tokens_per_min; tpm > 0 && !r.req.max_tokens_given)
    tokens = std::min(tokens, tpm);
  return tokens;
}

dispatcher::dispatcher(dispatcher_config cfg, const tenant_registry& tenants, model_registry& models,
                       cache_service* cache)
    : cfg_(std::move(cfg)),
      tenants_(tenants),
      models_(models),
      admission_(cfg_.admission, tenants),
      queue_(cfg_.queue),
      pool_(cfg_.pool),
      cache_(cache),
      retries_(cfg_.retry) {}

template <class T>
void dispatcher::send(worker_ref worker, const T& m, std::vector<link_frame>& out) {
  out.push_back({worker, std::string(proto::name(proto::type_of<T>)), proto::encode(m)});
}

void dispatcher::add_worker(const std::string& endpoint, double now_s, std::vector<link_frame>& out) {
  const auto [w, joined] = pool_.add(endpoint);
  if (joined) {
    out.push_back({w, "_connect", endpoint});
    greet(w, now_s, out);
  }
  log_worker_changes();
  pump(now_s, out);  // a retired worker listed again takes work at once
}

void dispatcher::retire_worker(const std::string& endpoint, double now_s, std::vector<link_frame>& out) {
  pool_.retire(endpoint);
  remove_workers(now_s, out);  // one that runs nothing of ours goes at once
  log_worker_changes();
}

// The one place a hello is written: first contact, a dead worker that may come back, retries.
void dispatcher::greet(worker_ref w, double now_s, std::vector<link_frame>& out) {
  hello_sent_s_[w] = now_s;
  proto::hello h;
  h.router_id = cfg_.router_id;
  h.kv_events = cfg_.kv_events;  // mirror its prefix cache (router/fleet/kv_view.hpp)
  send(w, h, out);
}

void dispatcher::remove_workers(double now_s, std::vector<link_frame>& out) {
  for (const worker_ref w : pool_.removable(now_s)) {
    const worker_view& v = pool_.at(w);
    const std::string endpoint = v.endpoint;
    const bool relist = v.listed;
    // Nothing of ours runs there: a retired worker is removable only once its in-flight count
    // is back to zero, and a dead one had its requests re-queued or ended when it died.
    const auto stranded =
        std::count_if(active_.begin(), active_.end(), [w](const auto& kv) { return kv.second->running_on(w); });
    assert(stranded == 0 && "a worker was removed while requests still referred to it");
    if (stranded != 0) {  // never in a correct build; the requests must not wait for a closed connection
      std::fprintf(stderr, "switchyard-router: BUG: worker %s removed with %zu requests on it: re-sent or ended\n",
                   endpoint.c_str(), static_cast<size_t>(stranded));
      requeue_or_fail(w, now_s, out);
    }
    out.push_back({w, "_close", {}});
    hello_sent_s_.erase(w);
    pool_.remove(w);
    if (relist) add_worker(endpoint, now_s, out);  // dead too long but still listed: start afresh
  }
}

void dispatcher::log_worker_changes() {
  for (const worker_change& c : pool_.take_changes()) {
    const char* ep = c.endpoint.c_str();
    if (!c.from) {
      std::fprintf(stderr, "switchyard-router: worker %s joined (%s)\n", ep, std::string(name(*c.to)).c_str());
    } else if (!c.to) {
      std::fprintf(stderr, "switchyard-router: worker %s removed (was %s)\n", ep, std::string(name(*c.from)).c_str());
    } else {
      std::string why;
      const worker_view* v = pool_.find(c.ref);
      switch (*c.to) {
        case worker_state::ready:
          if (v) why = v->info.worker_id + ", serving " + v->info.model_id;
          break;
        case worker_state::draining:
          why = "refuses new work";
          break;
        case worker_state::retired:
          why = "no longer listed: finishing what it runs";
          break;
        case worker_state::dead:
          why = "missed its heartbeats";
          break;
        case worker_state::ejected:
          why = "failing requests: none sent to it for a while";
          break;
        case worker_state::connecting:
          break;
      }
      std::fprintf(stderr, "switchyard-router: worker %s %s -> %s%s%s%s\n", ep, std::string(name(*c.from)).c_str(),
                   std::string(name(*c.to)).c_str(), why.empty() ? "" : " (", why.c_str(), why.empty() ? "" : ")");
    }
  }
}

bool dispatcher::registered(uint64_t id) const {
  if (active_.count(id) != 0) return true;
  const auto to = coalesce_.listening_to(id);
  if (!to) return false;
  const auto it = active_.find(*to);
  if (it == active_.end()) return false;
  const auto& ls = it->second->listeners;
  return std::any_of(ls.begin(), ls.end(), [id](const listener& l) { return l.r->id == id; });
}

void dispatcher::on_request(std::shared_ptr<routed_request> r, double now_s, std::vector<link_frame>& out) {
  const std::shared_ptr<routed_request> keep = r;  // to answer it if admission throws
  try {
    admit(std::move(r), now_s, out);
  } catch (const std::exception& e) {
    // Registered (running, queued, or listening to a coalesced generation), it is answered by the
    // paths that end requests; otherwise nothing would ever answer it: do so now.
    const uint64_t id = keep->id;
    if (registered(id)) throw;
    coalesce_.leave(id);
    std::fprintf(stderr, "switchyard-router: request %s%s failed before it was queued: %s\n", keep->request_id.c_str(),
                 trace_note(keep->trace).c_str(), e.what());
    internal_errors_++;
    count_status(answer_internal_error(*keep, e.what()));
  }
}

void dispatcher::admit(std::shared_ptr<routed_request> r, double now_s, std::vector<link_frame>& out) {
  routed_request& req = *r;
  // Refused before admission: answered, counted and traced (docs/router.md, "Tracing").
  const auto refuse = [&](const api_error& e, double retry_after_s) {
    trace_refusal(req, e, now_s);
    count_status(reply_error(req, e, retry_after_s));
  };
  if (draining_) {
    refuse(make_error(503, "overloaded_error", "draining", "the router is shutting down"), 5);
    return;
  }
  // Submitted from a cache thread after a lookup, the request may come after its client's
  // "gone" (sent from the I/O thread), which found nothing to cancel: nobody would listen.
  if (req.ex->disconnected()) {
    client_cancels_++;
    count_status(499);
    return;
  }
  if (unserved(req.model->id, now_s)) {
    no_workers_++;
    refuse(make_error(503, "overloaded_error", "no_workers",
                      "the model '" + req.model->id + "' has no ready worker; retry shortly"),
           2);
    return;
  }
  if (!deadly_until_s_.empty()) {
    const auto it = deadly_until_s_.find(prompt_fingerprint(req));
    if (it != deadly_until_s_.end() && now_s < it->second) {
      deadly_refused_++;
      refuse(make_error(400, "invalid_request_error", "query_of_death",
                        "this prompt took down " + std::to_string(cfg_.max_attempts) +
                            " workers in a row and is refused for a while (" +
                            std::to_string(static_cast<int>(it->second - now_s)) + " s more)"),
             0);
      return;
    }
    if (it != deadly_until_s_.end()) deadly_until_s_.erase(it);
  }
  if (coalesce(r)) return;
  const int64_t tokens = queue_tokens(req);
  const double deadline_s = req.timeout_s > 0 ? now_s + req.timeout_s : 0;
  queue_load load;
  load.requests = queue_.size();
  load.tokens = queue_.tokens();
  load.est_wait_s = queue_wait_s(req.model->id).value_or(0);  // unknown: nothing refused on it
  auto verdict = admission_.admit(*req.who, req.priority, tokens, deadline_s, now_s, load, req.rate_charged);
  if (auto* no = std::get_if<rejection>(&verdict)) {
    const char* type = no->status == 429   ? "rate_limit_error"
                       : no->status == 403 ? "permission_error"
                                           : "overloaded_error";
    // A priority outside a strict tenant's range is permanent: no Retry-After.
    refuse(make_error(no->status, type, std::string(name(no->reason)), no->message),
           no->status == 403 ? 0 : no->retry_after_s);
    return;
  }
  auto a = std::make_unique<active_request>();
  a->permit = std::move(std::get<admission_permit>(verdict));
  a->choices.resize(static_cast<size_t>(req.req.n));
  a->t_enqueued_s = now_s;
  a->queue_tokens = tokens;
  if (req.req.stream) req.ex->start_stream(200, answer_headers(req));
  prompt_tokens_ += req.prompt.size();
  queue_entry e;
  e.id = req.id;
  e.tenant = req.who->index;
  e.priority = req.priority;
  e.enqueued_s = now_s;
  e.deadline_s = deadline_s;
  e.tokens = tokens;
  if (const double qt = queue_timeout_of(req); qt > 0) e.queue_deadline_s = now_s + qt;
  queue_.push(req.model->id, e);
  if (!req.cache_key.empty() && cache_)
    cache_->record({req.cache_bypassed ? cache::event_kind::bypass : cache::event_kind::miss, req.who->name,
                    req.model->id, req.prompt_hash, 0, 0, 0, req.preview});
  listener own;
  own.r = std::move(r);
  own.own = true;
  own.started.assign(a->choices.size(), false);
  a->r = own.r;
  a->listeners.push_back(std::move(own));
  coalesce_.lead(*a);
  active_.emplace(e.id, std::move(a));
  pump(now_s, out);
}

bool dispatcher::coalesce(std::shared_ptr<routed_request>& r) {
  if (r->cache_key.empty()) return false;
  const auto id = coalesce_.generating(r->cache_key);
  if (!id) return false;
  const auto it = active_.find(*id);
  if (it == active_.end()) return false;
  const routed_request& req = *r;
  if (cache_)
    cache_->record({cache::event_kind::coalesced, req.who->name, req.model->id, req.prompt_hash,
                    static_cast<uint32_t>(req.prompt.size()), 0, 0, req.preview});
  coalesce_.join(*it->second, std::move(r));
  return true;
}

void dispatcher::pump(double now_s, std::vector<link_frame>& out) {
  // Each model's queue on its own: a model without a free worker holds back only its own requests.
  for (auto& [model, q] : queue_.by_model()) {
    while (!q.empty()) {
      const queue_entry* e = q.peek(now_s);
      if (!e) break;
      auto it = active_.find(e->id);
      if (it == active_.end()) {  // cannot happen: entries leave the queue with their request
        q.remove(e->id);
        continue;
      }
      active_request& a = *it->second;
      if (a.block_hashes.empty()) {
        for (const auto& [ref, v] : pool_.all()) {
          if (v.state == worker_state::ready && v.info.model_id == model) {
            // The workers' own hash (common/kv_hash.hpp): their kv_events name blocks by it.
            a.block_hashes = kv_block_hashes(a.r->prompt, v.info.kv_block_size, v.info.kv_hash_salt,
                                             kv_cache_root(a.r->who->cache_namespace));
            break;
          }
        }
      }
      const auto w = pool_.choose(model, a.block_hashes, a.avoid);
      if (!w) break;
      q.pop(now_s);
      try {
        dispatch(a, *w, now_s, out);
      } catch (const std::exception& e) {
        // Neither queued nor running, it would wait for nothing: ended here (the worker is told
        // to drop any submit that went out).
        internal_errors_++;
        std::fprintf(stderr, "switchyard-router: dispatching request %s%s failed: %s\n", a.r->request_id.c_str(),
                     trace_note(a.r->trace).c_str(), e.what());
        fail(a, make_error(500, "server_error", "internal_error", std::string("dispatch failed: ") + e.what()), out);
      }
    }
  }
}

void dispatcher::dispatch(active_request& a, worker_ref worker, double now_s, std::vector<link_frame>& out) {
  const routed_request& r = *a.r;
  a.phase = request_phase::running;
  a.worker = worker;
  a.attempt++;
  if (a.attempt == 1) retries_.on_request(now_s);  // first attempts fund the retry budget
  a.t_dispatched_s = now_s;
  a.t_last_frame_s = 0;  // none of this attempt yet
  a.worker_alive_at_dispatch = now_s - pool_.at(worker).last_seen_s <= cfg_.pool.heartbeat_timeout_s / 2;
  queue_wait_s_.observe(now_s - a.t_enqueued_s);
  if (r.embed) {  // POST /v1/embeddings: one embed, answered by one embeddings message
    proto::embed e;
    e.request_id = wire_id(r.id, a.attempt, 0);
    e.inputs = r.embed->inputs;
    e.dimensions = r.embed->dimensions;
    e.priority = r.priority;
    if (r.timeout_s > 0)
      e.budget_ms =
          static_cast<uint32_t>(std::clamp((r.timeout_s - (now_s - r.t_received_s)) * 1000.0, 1.0, 4294967295.0));
    send(a.worker, e, out);
    pool_.on_dispatched(worker, a.block_hashes, now_s);
    dispatch_overhead_s_.observe(std::max(0.0, now_s - r.t_parsed_s - (now_s - a.t_enqueued_s)));
    return;
  }
  proto::submit s;
  s.prompt = r.prompt;
  s.sampling = r.req.sampling;
  s.constraint = r.req.constraint;
  if (r.req.want_logprobs) s.sampling.logprobs = std::max(1, s.sampling.logprobs);
  s.priority = r.priority;
  s.cache_root = kv_cache_root(r.who->cache_namespace);  // the tenant's prefix-cache namespace
  if (r.trace) s.traceparent = r.trace->traceparent();   // the worker logs its trace id
  s.stream = true;  // always: progress is how a dead worker's requests are sorted out
  if (r.timeout_s > 0) {
    const double left_s = r.timeout_s - (now_s - r.t_received_s);
    // Relative: the worker's clock may differ from ours (the wire carries no wall-clock time).
    s.budget_ms = static_cast<uint32_t>(std::clamp(left_s * 1000.0, 1.0, 4294967295.0));
  }
  for (uint32_t c = 0; c < a.choices.size(); ++c) {
    choice_state& cs = a.choices[c];
    if (cs.finished()) continue;
    cs.frames = 0;  // a new wire id: its frames are numbered from 1
    s.request_id = wire_id(r.id, a.attempt, c);
    if (r.req.sampling.has_seed) s.sampling.seed = choice_seed(r.req.sampling.seed, c);
    // A resumed choice: the worker recomputes what the client has and goes on from there.
    s.prompt.resize(r.prompt.size());
    s.prompt.insert(s.prompt.end(), cs.tokens.begin(), cs.tokens.end());
    s.n_generated = static_cast<uint32_t>(cs.tokens.size());
    send(a.worker, s, out);
    pool_.on_dispatched(worker, a.block_hashes, now_s);
  }
  // The router's own time: parsed -> enqueued, plus dequeued -> this dispatch (as of now_s, the
  // time this event began; the submits' encoding is not in it).
  const double in_queue = now_s - a.t_enqueued_s;
  dispatch_overhead_s_.observe(std::max(0.0, now_s - r.t_parsed_s - in_queue));
}

active_request* dispatcher::find_wire(std::string_view wire, uint32_t* choice) {
  const size_t dash = wire.find('-'), dot = wire.find('.');
  if (dash == std::string_view::npos || dot == std::string_view::npos || dot < dash) return nullptr;
  uint64_t id = 0;
  uint32_t attempt = 0;
  const char* b = wire.data();
  if (std::from_chars(b, b + dash, id).ec != std::errc{}) return nullptr;
  if (std::from_chars(b + dash + 1, b + dot, attempt).ec != std::errc{}) return nullptr;
  if (std::from_chars(b + dot + 1, b + wire.size(), *choice).ec != std::errc{}) return nullptr;
  auto it = active_.find(id);
  if (it == active_.end()) return nullptr;
  active_request& a = *it->second;
  if (a.phase != request_phase::running || a.attempt != attempt || *choice >= a.choices.size()) return nullptr;
  return &a;
}

void dispatcher::on_frame(worker_ref worker, std::string_view type, std::string_view body, double now_s,
                          double t_recv_s, std::vector<link_frame>& out) {
  if (!pool_.find(worker)) {  // sent before its worker was removed, still on its way
    late_frames_++;
    return;
  }
  auto decoded = proto::decode(type, body);
  if (!decoded) {
    bad_frames_++;
    std::fprintf(stderr, "switchyard-router: bad frame from %s: %s\n", pool_.at(worker).endpoint.c_str(),
                 decoded.failure().message.c_str());
    return;
  }
  proto::message& m = decoded.value();
  if (auto* t = std::get_if<proto::tokens>(&m)) {
    on_tokens(worker, *t, now_s, t_recv_s > 0 ? t_recv_s : now_s, out);
  } else if (auto* em = std::get_if<proto::embeddings>(&m)) {
    on_embeddings(worker, *em, now_s);
  } else if (auto* hb = std::get_if<proto::heartbeat>(&m)) {
    pool_.on_heartbeat(worker, *hb, now_s);
  } else if (auto* w = std::get_if<proto::welcome>(&m)) {
    on_welcome(worker, *w, now_s, out);
  } else if (auto* k = std::get_if<proto::kv_events>(&m)) {
    pool_.on_kv_events(worker, *k);
    request_kv_resyncs(now_s, out);
  } else if (auto* e = std::get_if<proto::error>(&m)) {
    if (e->request_id.empty()) {
      std::fprintf(stderr, "switchyard-router: worker %s: %s: %s\n", pool_.at(worker).endpoint.c_str(),
                   std::string(name(e->code)).c_str(), e->message.c_str());
    } else {
      on_worker_error(worker, *e, now_s, out);
    }
  } else {
    bad_frames_++;
  }
  log_worker_changes();
  pump(now_s, out);
}

void dispatcher::on_welcome(worker_ref worker, proto::welcome& m, double now_s, std::vector<link_frame>& out) {
  if (auto err = proto::check_version(m.version)) {
    std::fprintf(stderr, "switchyard-router: worker %s: %s\n", pool_.at(worker).endpoint.c_str(), err->message.c_str());
    return;
  }
  if (const auto known = models_.find(m.model_id); !known || known->id != m.model_id) {  // not an alias's
    try {
      // A template that cannot be applied does not stop the model: its completions are served
      // and its chat requests refused (api_handler).
      auto entry = std::make_shared<model_entry>(
          model_entry{m.model_id, m.context_length, cfg_.unix_time_s(), tokenizer::from_spec(m.tokenizer),
                      chat_template::parse(m.tokenizer.chat_template), m.tokenizer});
      if (!entry->tmpl.supported())
        std::fprintf(stderr,
                     "switchyard-router: worker %s serves %s, whose chat template cannot be applied (%s): chat "
                     "requests for it are refused\n",
                     pool_.at(worker).endpoint.c_str(), m.model_id.c_str(), entry->tmpl.unsupported_reason.c_str());
      models_.put(std::move(entry));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "switchyard-router: worker %s serves %s, whose tokenizer is unusable: %s\n",
                   pool_.at(worker).endpoint.c_str(), m.model_id.c_str(), e.what());
      return;
    }
  } else {
    models_.narrow_context(m.model_id, m.context_length);  // the smallest context among its workers
  }
  for (const std::string& name : m.served_model_names)  // --served-model-name on the worker
    if (!models_.alias(name, m.model_id))
      std::fprintf(stderr, "switchyard-router: worker %s: the served model name '%s' names another model: ignored\n",
                   pool_.at(worker).endpoint.c_str(), name.c_str());
  const std::string id = m.worker_id;
  const worker_view& before = pool_.at(worker);
  const bool restarted = before.liveness == worker_liveness::up && before.info.worker_id != id;
  if (restarted) {
    // A new process behind the same address, back before its heartbeats were missed: what the
    // old one was running is gone with it.
    std::fprintf(stderr, "switchyard-router: worker %s restarted (now %s): its requests are re-sent or ended\n",
                 before.endpoint.c_str(), id.c_str());
    requeue_or_fail(worker, now_s, out);
  }
  // We did not ask for its events, so it sends none: hints are all we have.
  if (!cfg_.kv_events) m.kv_events = false;
  pool_.on_welcome(worker, std::move(m), now_s);  // logged as a state change
  if (restarted) pump(now_s, out);
}

token_logprobs dispatcher::render_logprobs(const routed_request& r, const proto::token_logprob& lp) const {
  token_logprobs t;
  t.token = r.model->tok.token_bytes(lp.token, /*render_special=*/true);
  t.logprob = lp.logprob;
  const size_t n_top = static_cast<size_t>(std::max(0, r.req.sampling.logprobs));
  for (size_t i = 0; i < lp.top.size() && i < n_top; ++i)
    t.top.emplace_back(r.model->tok.token_bytes(lp.top[i].token, true), lp.top[i].logprob);
  return t;
}

void dispatcher::on_tokens(worker_ref worker, const proto::tokens& m, double now_s, double t_recv_s,
                           std::vector<link_frame>& out) {
  uint32_t c = 0;
  active_request* ap = find_wire(m.request_id, &c);
  if (!ap || ap->worker != worker || ap->choices[c].finished()) {
    late_frames_++;
    return;
  }
  active_request& a = *ap;
  const routed_request& r = *a.r;
  choice_state& cs = a.choices[c];
  a.t_last_frame_s = now_s;
  if (m.seq != 0) {  // numbered (workers that predate numbering send 0)
    if (m.seq != cs.frames + 1) {
      on_frame_gap(a, c, cs.frames + 1, m.seq, out);
      return;
    }
    cs.frames = m.seq;
  }
  const finish_reason fr = m.finish_reason;
  if (fr == finish_reason::cancelled || fr == finish_reason::error) {
    // The worker gave up on it without the client asking: an upstream failure, 502 like a worker
    // error frame (the router itself did nothing wrong). An error is the worker's fault, and
    // retried as a worker error frame is.
    const std::string why(name(fr));
    const api_error e = make_error(502, "server_error", "worker_" + why, "the worker ended the request: " + why);
    if (fr == finish_reason::cancelled) {
      fail(a, e, out);
      return;
    }
    on_worker_fault(worker, now_s);
    retry_or_fail(a, e, now_s, out);
    return;
  }
  if (fr == finish_reason::deadline) {
    fail(a, make_error(504, "timeout_error", "deadline_exceeded", "the request's deadline passed while generating"),
         out);
    return;
  }
  if (!m.token_ids.empty()) {
    if (a.t_first_token_s == 0) {
      a.t_first_token_s = t_recv_s;
      ttft_s_.observe(t_recv_s - r.t_received_s);
      credit(a, static_cast<double>(r.prompt.size()));  // its prompt is done
    } else {
      itl_s_.observe(t_recv_s - a.t_last_token_s);
    }
    a.t_last_token_s = t_recv_s;
    credit(a, static_cast<double>(m.token_ids.size()));
  }
  cs.completion_tokens = m.usage.completion_tokens;  // a resumed choice's worker counts what it resumed from
  cs.tokens.insert(cs.tokens.end(), m.token_ids.begin(), m.token_ids.end());
  cs.tokens_seen += static_cast<uint32_t>(m.token_ids.size());
  a.usage.prompt_tokens = std::max(a.usage.prompt_tokens, m.usage.prompt_tokens);
  a.usage.cached_tokens = std::max(a.usage.cached_tokens, m.usage.cached_prompt_tokens);
  std::vector<token_logprobs> lps;
  if (r.req.want_logprobs)
    for (const auto& lp : m.logprobs) lps.push_back(render_logprobs(r, lp));
  std::string text = m.text;
  if (r.req.echo && !cs.echoed) {  // the prompt goes before the choice's first text
    text = r.echo_text + text;
    cs.echoed = true;
  }
  const bool done = fr == finish_reason::stop || fr == finish_reason::length;
  const finish_reason ends = done ? fr : finish_reason::none;  // the chunk's finish_reason
  if (!r.req.stream) {
    cs.text += text;
    for (auto& lp : lps) cs.logprobs.push_back(std::move(lp));
  }
  if (fr == finish_reason::stop) cs.stop = m.stop;  // the worker names the stop string it found (stop_reason)
  if (fr == finish_reason::stop && !cs.tokens.empty() && r.model) {
    // The Anthropic API tells a stop string from the end of the turn, which the worker both ends
    // with "stop": only the end of the turn's last token is an end-of-generation token.
    const bool eog = r.model->tok.is_eog(cs.tokens.back());
    for (listener& l : a.listeners)
      if (l.r->meta.anthropic) {
        l.r->meta.anthropic->ended_on_eog = eog;
        l.r->meta.anthropic->stop_matched = m.stop;
      }
  }
  // A stream's first chunk goes out with the choice's first tokens even when they make no text
  // yet (a partial UTF-8 character, a special token): the client sees its first token when it is
  // generated, as time to first token means. Later chunks wait for text.
  if (!text.empty() || !lps.empty() || done || !m.token_ids.empty()) {
    for (listener& l : a.listeners) {
      if (!l.stream()) continue;
      if (text.empty() && lps.empty() && !done && l.started[c]) continue;
      if (!l.own) {
        send_chunk(l, c, text, ends, {}, nullptr, t_recv_s, cs.stop);
        continue;
      }
      // stream_options.continuous_usage_stats: the usage so far in every chunk. Workers report
      // usage in a request's last frame only, so until then it is what the router has seen;
      // the reasoning tokens are counted as finish() counts them, over the tokens so far.
      usage_info so_far = a.usage;
      if (r.req.continuous_usage) {
        so_far.prompt_tokens = std::max(so_far.prompt_tokens, static_cast<uint32_t>(r.prompt.size()));
        so_far.completion_tokens = 0;
        for (const auto& each : a.choices)
          so_far.completion_tokens += std::max(each.completion_tokens, each.tokens_seen);
        so_far.reasoning_tokens = reasoning_tokens_of(a);
      }
      send_chunk(l, c, text, ends, lps, r.req.continuous_usage ? &so_far : nullptr, t_recv_s, cs.stop);
    }
  }
  if (!r.cache_key.empty() && !text.empty()) cs.deltas.push_back(text);
  if (done) {
    cs.finish_reason = fr;
    a.n_finished++;
    pool_.on_finished(worker);
    pool_.on_request_succeeded(worker);
    if (a.n_finished == a.choices.size()) {
      // Out of the tables before anyone is answered: a throwing answer cannot leave it stuck.
      const auto owned = detach(r.id);
      finish(*owned, now_s);
    }
  }
}

void dispatcher::on_embeddings(worker_ref worker, proto::embeddings& m, double now_s) {
  uint32_t c = 0;
  active_request* ap = find_wire(m.request_id, &c);
  if (!ap || ap->worker != worker || !ap->r->embed) {
    late_frames_++;
    return;
  }
  pool_.on_finished(worker);
  pool_.on_request_succeeded(worker);
  const auto owned = detach(ap->r->id);  // out of the tables before the answer goes out (see on_tokens)
  const routed_request& r = *owned->r;
  if (m.data.size() != r.embed->inputs.size()) {
    internal_errors_++;
    for (const listener& l : owned->listeners) {
      count_status(502);
      answer_error(l, make_error(502, "server_error", "bad_worker_answer",
                                 "the worker sent " + std::to_string(m.data.size()) + " embeddings for " +
                                     std::to_string(r.embed->inputs.size()) + " inputs"));
    }
    return;
  }
  e2e_s_.observe(now_s - r.t_received_s);
  trace_end(*owned, 200, "", usage_info(m.prompt_tokens, 0), now_s);
  const std::string body = format_embeddings(r.meta.model, m.data, r.embed->base64, m.prompt_tokens);
  for (const listener& l : owned->listeners) {
    count_status(200);
    http_response resp;
    resp.body = body;
    resp.headers = answer_headers(*l.r);
    l.r->ex->respond(std::move(resp));
  }
}

std::optional<uint32_t> dispatcher::reasoning_tokens_of(const active_request& a) {
  const routed_request& r = *a.r;
  if (!r.meta.reasoning || !r.model) return std::nullopt;
  uint32_t n = 0;  // the tokens inside the thinking, by their own texts
  for (const auto& cs : a.choices)
    n += count_reasoning_tokens(r.model->tok, *r.meta.reasoning, cs.tokens, cs.finished());
  return n;
}

void dispatcher::finish(active_request& a, double now_s) {
  const routed_request& r = *a.r;
  usage_info u = a.usage;
  u.completion_tokens = 0;
  for (const auto& cs : a.choices) u.completion_tokens += cs.completion_tokens;
  u.reasoning_tokens = reasoning_tokens_of(a);
  completion_tokens_ += u.completion_tokens;
  cached_tokens_ += u.cached_tokens;
  e2e_s_.observe(now_s - r.t_received_s);
  // Queued before the answers go out, so that a client's next identical request (looked up on
  // another cache thread) rarely overtakes the store.
  if (cache_ && r.cache_store) {
    cache::stored_response sr;
    sr.endpoint = r.req.kind == endpoint::chat_completions ? 1 : 0;
    sr.model = r.model->id;
    for (const auto& cs : a.choices) sr.choices.push_back({cs.deltas, cs.finish_reason, {}, cs.stop});
    sr.prompt_tokens = u.prompt_tokens;
    sr.completion_tokens = u.completion_tokens;
    sr.cached_tokens = u.cached_tokens;
    sr.reasoning_tokens = u.reasoning_tokens.value_or(0);
    sr.generation_s = a.attempt == 0 ? 0 : now_s - a.t_dispatched_s;
    cache_->store(r.cache_key, std::move(sr));
  }
  trace_end(a, 200, "", u, now_s);
  for (const listener& l : a.listeners) {
    count_status(200);
    answer_success(l, a, u);
  }
}

void dispatcher::trace_end(const active_request& a, int status, const std::string& error, const usage_info& u,
                           double now_s) {
  if (cfg_.tracer == nullptr) return;
  const routed_request& r = *a.r;
  request_outcome o = traced_outcome(r, status, error, now_s);
  o.prompt_tokens = u.prompt_tokens != 0 ? u.prompt_tokens : static_cast<int64_t>(r.prompt.size());
  o.completion_tokens = u.completion_tokens;
  o.t_enqueued_s = a.t_enqueued_s;
  o.t_dispatched_s = a.attempt == 0 ? 0 : a.t_dispatched_s;
  o.t_first_token_s = a.t_first_token_s;
  o.t_last_token_s = a.t_last_token_s;
  export_request(cfg_.tracer, r.trace, o, now_s);
  for (const listener& l : a.listeners)
    if (!l.own) trace_coalesced(a, *l.r, status, error, u, now_s);
}

void dispatcher::trace_refusal(const routed_request& r, const api_error& e, double now_s) {
  if (cfg_.tracer == nullptr) return;
  export_request(cfg_.tracer, r.trace, traced_outcome(r, e.status, e.code.empty() ? e.message : e.code, now_s), now_s);
}

void dispatcher::trace_coalesced(const active_request& a, const routed_request& r, int status, const std::string& error,
                                 const usage_info& u, double now_s) {
  if (cfg_.tracer == nullptr || !r.trace || !r.trace->sampled) return;
  request_outcome o = traced_outcome(r, status, error, now_s);
  o.completion_tokens = u.completion_tokens;
  if (a.r->trace) o.coalesced_onto = span_link{a.r->trace->trace, a.r->trace->server};
  export_request(cfg_.tracer, r.trace, o, now_s);
}

void dispatcher::fail(active_request& a, const api_error& e, std::vector<link_frame>& out) {
  cancel_on_worker(a, out);
  const auto owned = detach(a.r->id);  // see on_tokens: removed before the answers go out
  if (!owned) return;
  trace_end(*owned, e.status, e.code.empty() ? e.message : e.code, owned->usage, steady_now_s());
  for (const listener& l : owned->listeners) {
    count_status(e.status);
    answer_error(l, e);  // after counting, as finish() does: a throwing answer is still counted
  }
}

void dispatcher::cancel_on_worker(const active_request& a, std::vector<link_frame>& out) {
  if (a.phase != request_phase::running) return;
  for (uint32_t c = 0; c < a.choices.size(); ++c) {
    if (a.choices[c].finished()) continue;
    proto::cancel m;
    m.request_id = wire_id(a.r->id, a.attempt, c);
    send(a.worker, m, out);
    pool_.on_finished(a.worker);
  }
}

void dispatcher::erase(uint64_t id) { detach(id); }

std::unique_ptr<active_request> dispatcher::detach(uint64_t id) {
  auto it = active_.find(id);
  if (it == active_.end()) return nullptr;
  std::unique_ptr<active_request> owned = std::move(it->second);
  active_.erase(it);
  if (owned->phase == request_phase::queued) queue_.remove(owned->r->model->id, id);
  // Whatever it weighed and was not counted yet left its worker's work with it.
  if (owned->attempt > 0) credit(*owned, static_cast<double>(owned->queue_tokens));
  coalesce_.forget(*owned);
  return owned;
}

void dispatcher::on_client_gone(uint64_t id, double now_s, std::vector<link_frame>& out) {
  // Its own generation, or the one it was coalesced onto.
  const uint64_t gen = coalesce_.leave(id).value_or(id);
  const auto it = active_.find(gen);
  if (it == active_.end()) return;
  auto& ls = it->second->listeners;
  const auto left = std::find_if(ls.begin(), ls.end(), [id](const listener& l) { return l.r->id == id; });
  if (left == ls.end()) return;
  if (!left->own) trace_coalesced(*it->second, *left->r, 499, "client_gone", {}, now_s);
  const auto gone = std::remove_if(ls.begin(), ls.end(), [id](const listener& l) { return l.r->id == id; });
  ls.erase(gone, ls.end());
  client_cancels_++;
  count_status(499);        // nginx's "client closed request"
  if (!ls.empty()) return;  // the generation goes on for those still listening
  cancel_on_worker(*it->second, out);
  trace_end(*it->second, 499, "client_gone", it->second->usage, now_s);
  erase(gen);
  pump(now_s, out);  // its slot is free for the next in the queue
}

void dispatcher::on_worker_error(worker_ref worker, const proto::error& m, double now_s, std::vector<link_frame>& out) {
  uint32_t c = 0;
  active_request* a = find_wire(m.request_id, &c);
  if (!a || a->worker != worker) {
    late_frames_++;
    return;
  }
  if (m.code == proto::error_code::overloaded && !a->output_sent()) {
    // The worker refused it (draining): back to the front of the queue for another worker, and
    // no more work goes there until a heartbeat says otherwise.
    pool_.mark_draining(worker);
    cancel_on_worker(*a, out);
    requeue(*a);
    return;
  }
  if (m.code == proto::error_code::embeddings_not_supported) {  // the worker was not started with --embeddings
    fail(*a,
         make_error(501, "not_supported_error", "embeddings_not_supported",
                    "the model '" + a->r->model->id +
                        "' is not served with embeddings (its workers need --embeddings): " + m.message),
         out);
    return;
  }
  const bool client_fault = m.code == proto::error_code::invalid_request;
  const api_error e = make_error(client_fault ? 400 : 502, client_fault ? "invalid_request_error" : "server_error",
                                 std::string(name(m.code)), "worker: " + m.message);
  if (m.code != proto::error_code::internal_error) {
    fail(*a, e, out);
    return;
  }
  // The worker failed it (its step threw): it may be failing everything (a black hole). The
  // requests of one failed step are one failure of the worker: counted once toward its ejection
  // and charged once to the retry budget (each still spends one of its own attempts).
  const bool first_of_its_failure = pool_.new_failure(worker, m.failure);
  if (first_of_its_failure) on_worker_fault(worker, now_s);
  retry_or_fail(*a, e, now_s, out, first_of_its_failure);
}

void dispatcher::on_frame_gap(active_request& a, uint32_t choice, uint32_t expected, uint32_t got,
                              std::vector<link_frame>& out) {
  frame_gaps_++;
  resume_lost_try(a,
                  "choice " + std::to_string(choice) + ": frame " + std::to_string(got) + " from worker " +
                      pool_.at(a.worker).endpoint + ", expected " + std::to_string(expected) + " (lost on the link)",
                  out);
}

void dispatcher::resume_lost_try(active_request& a, const std::string& why, std::vector<link_frame>& out) {
  a.gaps++;
  const bool ends = a.gaps > k_max_gaps || !a.resumable();
  std::fprintf(stderr, "switchyard-router: request %s%s: %s: %s\n", a.r->request_id.c_str(),
               trace_note(a.r->trace).c_str(), why.c_str(), ends ? "ended" : "resumed from what the client has");
  if (ends) {
    fail(a,
         make_error(502, "server_error", "frames_lost",
                    "frames of this request were lost on the worker link " + std::to_string(a.gaps) + " times"),
         out);
    return;
  }
  // Not the worker's failure and not charged to the retry budget: the link lost a frame. Its
  // choices keep what reached the router (the lost frame's tokens are generated again).
  cancel_on_worker(a, out);
  const bool sent = a.output_sent();
  if (sent) streams_resumed_++;
  requeue(a, /*keep_progress=*/true);  // the caller's pump sends it out again
}

void dispatcher::on_worker_fault(worker_ref worker, double now_s) {
  if (!pool_.on_request_failed(worker, now_s)) return;
  const worker_view& v = pool_.at(worker);
  std::fprintf(stderr, "switchyard-router: worker %s ejected for %.0f s: %u requests failed in a row (ejection %llu)\n",
               v.endpoint.c_str(), v.ejected_until_s - now_s, static_cast<unsigned>(cfg_.pool.eject_after_failures),
               static_cast<unsigned long long>(v.ejections));
}

void dispatcher::retry_or_fail(active_request& a, const api_error& cause, double now_s, std::vector<link_frame>& out,
                               bool charged) {
  // Output the client has is resumed from (each unfinished choice has its tokens so far, fewer
  // than max_tokens, unless its final frame was lost: then it cannot be, and it ends).
  const bool sent = a.output_sent();
  if (cfg_.max_attempts <= 1 || (sent && !a.resumable())) {
    if (sent && cause.code == "worker_lost") worker_lost_++;
    fail(a, cause, out);
    return;
  }
  a.failures++;
  if (a.failures >= cfg_.max_attempts) {
    retries_exhausted_++;
    if (a.workers_lost >= cfg_.max_attempts && cfg_.query_of_death_ttl_s > 0) {
      // Every attempt took its worker down: refused for a while if the client sends it again.
      if (deadly_until_s_.size() >= k_max_deadly) {
        const auto oldest = std::min_element(deadly_until_s_.begin(), deadly_until_s_.end(),
                                             [](const auto& x, const auto& y) { return x.second < y.second; });
        deadly_until_s_.erase(oldest);
      }
      deadly_until_s_[prompt_fingerprint(*a.r)] = now_s + cfg_.query_of_death_ttl_s;
      std::fprintf(stderr, "switchyard-router: request %s%s took down %u workers: its prompt is refused for %.0f s\n",
                   a.r->request_id.c_str(), trace_note(a.r->trace).c_str(), static_cast<unsigned>(a.workers_lost),
                   cfg_.query_of_death_ttl_s);
    }
    fail(a,
         make_error(502, "server_error", "retries_exhausted",
                    "the request failed on " + std::to_string(a.failures) +
                        " attempts and is not tried again (last: " + cause.message + ")"),
         out);
    return;
  }
  if (!charged) {
    uncharged_retries_++;
  } else if (!retries_.try_retry(now_s)) {
    retry_budget_exhausted_++;
    fail(a,
         make_error(502, "server_error", "retry_budget_exhausted",
                    "not retried: too many requests are being retried across the cluster (" + cause.message + ")"),
         out);
    return;
  }
  cancel_on_worker(a, out);  // in case it is only slow; a restarted or failed worker ignores it
  a.avoid = a.worker;
  if (sent) streams_resumed_++;
  requeue(a, /*keep_progress=*/sent);
}

void dispatcher::on_worker_dead(worker_ref worker, double now_s, std::vector<link_frame>& out) {
  out.push_back({worker, "_flush", {}});
  requeue_or_fail(worker, now_s, out);
  if (pool_.at(worker).listed) greet(worker, now_s, out);  // in case it comes back
}

void dispatcher::requeue(active_request& a, bool keep_progress) {
  a.phase = request_phase::queued;
  if (!keep_progress) {
    for (auto& cs : a.choices) cs = {};
    a.n_finished = 0;
    a.t_first_token_s = 0;
  }
  const double deadline_s = a.r->timeout_s > 0 ? a.t_enqueued_s + a.r->timeout_s : 0;
  queue_.push_front(a.r->model->id,
                    {a.r->id, a.r->who->index, a.r->priority, a.t_enqueued_s, deadline_s, a.queue_tokens});
  redispatched_++;
}

void dispatcher::requeue_or_fail(worker_ref worker, double now_s, std::vector<link_frame>& out) {
  std::vector<uint64_t> ids;
  for (const auto& [id, a] : active_)
    if (a->running_on(worker)) ids.push_back(id);
  // One event (the worker died or restarted): charged to the retry budget once, whatever the
  // number of requests it took with it; each still spends one of its own attempts.
  bool charged = true;
  for (const uint64_t id : ids) {
    active_request& a = *active_.at(id);
    if (a.worker_alive_at_dispatch) a.workers_lost++;
    retry_or_fail(a,
                  make_error(502, "server_error", "worker_lost", "the worker serving this request stopped responding"),
                  now_s, out, std::exchange(charged, false));
  }
}

void dispatcher::check_stall(double now_s) {
  const double gap = last_tick_s_ < 0 ? 0 : now_s - last_tick_s_;
  last_tick_s_ = now_s;
  if (cfg_.stall_threshold_s <= 0 || gap <= cfg_.stall_threshold_s) return;
  stalls_++;
  stalled_s_ += gap;
  if (gap >= 1.0)  // shorter ones are a loaded machine's scheduling, counted but not logged
    std::fprintf(stderr,
                 "switchyard-router: this router stalled for %.1f s (paused or throttled): its workers' silence "
                 "during it is not counted against them\n",
                 gap);
  pool_.forgive_silence(gap, now_s);
  for (auto& [model, since] : unserved_since_s_) since = std::min(now_s, since + gap);
  for (auto& [id, a] : active_)
    if (a->t_last_frame_s > 0) a->t_last_frame_s = std::min(now_s, a->t_last_frame_s + gap);
}

void dispatcher::check_queue_timeouts(double now_s, std::vector<link_frame>& out) {
  for (const uint64_t id : queue_.waited_too_long(now_s)) {
    auto it = active_.find(id);
    if (it == active_.end()) {  // cannot happen: entries leave the queue with their request
      for (auto& [model, q] : queue_.by_model()) q.remove(id);
      continue;
    }
    active_request& a = *it->second;
    queue_timeouts_++;
    const double qt = queue_timeout_of(*a.r);
    char waited[96];
    std::snprintf(waited, sizeof waited, "%.1f s (its queue timeout is %g s)", now_s - a.t_enqueued_s, qt);
    api_error e = make_error(408, "timeout_error", "queue_timeout",
                             "the request waited in the router's queue for a free worker of '" + a.r->model->id +
                                 "' for " + waited + "; retry later");
    // When to come back: the model's queue wait at its measured service rate (1 s while not
    // measured), within [1 s, the timeout].
    const double est = queue_wait_s(a.r->model->id).value_or(1.0);
    e.retry_after_s = std::clamp(est, 1.0, std::max(1.0, qt));
    fail(a, e, out);
  }
}

void dispatcher::check_idle_tries(double now_s, std::vector<link_frame>& out) {
  if (cfg_.try_idle_timeout_s <= 0) return;
  std::vector<uint64_t> idle;
  for (const auto& [id, a] : active_)
    if (a->phase == request_phase::running && a->t_last_frame_s > 0 &&
        now_s - a->t_last_frame_s > cfg_.try_idle_timeout_s && pool_.at(a->worker).liveness == worker_liveness::up)
      idle.push_back(id);
  for (const uint64_t id : idle) {
    idle_tries_++;
    active_request& a = *active_.at(id);
    resume_lost_try(a,
                    "no frame from worker " + pool_.at(a.worker).endpoint + " for " +
                        std::to_string(static_cast<int>(now_s - a.t_last_frame_s)) + " s while it heartbeats",
                    out);
  }
}

uint64_t dispatcher::prompt_fingerprint(const routed_request& r) {
  return kv_chain_hash(0, r.prompt, kv_model_salt(r.model->id));
}

bool dispatcher::unserved(const std::string& model, double now_s) const {
  const auto it = unserved_since_s_.find(model);
  // The table is brought up to date by ticks; a worker that welcomed since serves at once.
  return it != unserved_since_s_.end() && now_s - it->second >= cfg_.no_worker_timeout_s && !pool_.serves(model);
}

void dispatcher::check_served(double now_s, std::vector<link_frame>& out) {
  const auto track = [&](const std::string& model) {
    if (pool_.serves(model))
      unserved_since_s_.erase(model);
    else
      unserved_since_s_.emplace(model, now_s);  // keeps the first time
  };
  for (const auto& m : models_.all()) track(m->id);  // a queued request's model is among them
  std::vector<uint64_t> stranded;
  for (const auto& [id, a] : active_)
    if (a->phase == request_phase::queued && unserved(a->r->model->id, now_s)) stranded.push_back(id);
  for (const uint64_t id : stranded) {
    no_workers_++;
    active_request& a = *active_.at(id);
    fail(a,
         make_error(503, "overloaded_error", "no_workers",
                    "the model '" + a.r->model->id + "' has had no ready worker for " +
                        std::to_string(static_cast<int>(cfg_.no_worker_timeout_s)) + " s"),
         out);
  }
}

void dispatcher::tick(double now_s, std::vector<link_frame>& out) {
  check_stall(now_s);  // before liveness: a stall of this router is not its workers' silence
  for (const worker_ref w : pool_.check_liveness(now_s)) on_worker_dead(w, now_s, out);
  pool_.readmit(now_s);  // ejected workers whose time is up: logged below as ejected -> ready
  for (const uint64_t id : queue_.expired(now_s)) {
    auto it = active_.find(id);
    if (it == active_.end()) {  // cannot happen: entries leave the queue with their request
      for (auto& [model, q] : queue_.by_model()) q.remove(id);
      continue;
    }
    expired_++;
    fail(*it->second,
         make_error(504, "timeout_error", "deadline_exceeded", "the request's deadline passed in the queue"), out);
  }
  // A dispatched request whose deadline passed well ago was lost on its way (a dropped frame, a
  // worker that restarted within the heartbeat timeout): end it here rather than wait forever.
  std::vector<uint64_t> overdue;
  for (const auto& [id, a] : active_)
    if (a->phase == request_phase::running && a->r->timeout_s > 0 &&
        now_s > a->t_enqueued_s + a->r->timeout_s + k_deadline_grace_s)
      overdue.push_back(id);
  for (const uint64_t id : overdue) {
    expired_++;
    fail(*active_.at(id),
         make_error(504, "timeout_error", "deadline_exceeded", "the request's deadline passed without an answer"), out);
  }
  check_queue_timeouts(now_s, out);
  check_served(now_s, out);
  check_idle_tries(now_s, out);
  // After the requests this tick ended: a retired worker whose last one just ended goes now.
  remove_workers(now_s, out);
  pool_.expire_kv_hints(now_s);
  request_kv_resyncs(now_s, out);  // again while a snapshot asked for has not come
  for (const auto& [w, v] : pool_.all()) {
    if (v.liveness != worker_liveness::up && now_s - hello_sent_s_[w] >= cfg_.hello_retry_s) {
      // Only the latest hello matters: older ones still waiting for a connection are dropped,
      // so a worker that comes up after a long absence is not flooded with them.
      out.push_back({w, "_flush", {}});
      greet(w, now_s, out);
    }
  }
  log_worker_changes();
  pump(now_s, out);
  // After dispatching: a model with requests still queued had every worker slot taken. (A
  // model's rate is made by its first credited work; nothing before that can be measured.)
  for (auto& [model, rate] : rates_) {
    const auto q = queue_.by_model().find(model);
    rate.tick(now_s, q != queue_.by_model().end() && q->second.size() > 0);
  }
}

void dispatcher::credit(active_request& a, double tokens) {
  const double left = static_cast<double>(a.queue_tokens) - a.work_done;
  tokens = std::min(tokens, left);
  if (tokens <= 0) return;
  a.work_done += tokens;
  rates_[a.r->model->id].done(tokens);
}

std::optional<double> dispatcher::queue_wait_s(const std::string& model) const {
  const auto rate = rates_.find(model);
  const auto q = queue_.by_model().find(model);
  if (rate == rates_.end()) return std::nullopt;
  return rate->second.wait_s(q == queue_.by_model().end() ? 0.0 : static_cast<double>(q->second.tokens()));
}

void dispatcher::request_kv_resyncs(double now_s, std::vector<link_frame>& out) {
  for (const worker_ref w : pool_.kv_resyncs_due(now_s)) {
    proto::kv_resync r;
    r.reason = "missed kv_events";
    send(w, r, out);
  }
}

bool dispatcher::ready(double now_s) const {
  if (draining_) return false;
  if (pool_.any_ready(now_s)) return true;
  // Hysteresis: a model that lost its last ready worker keeps the router ready through the
  // no-worker grace (its requests queue for a replacement meanwhile). A one-worker rollout or
  // drain then never takes every router out of its Service at once; a router that has never met
  // a worker is not ready.
  for (const auto& m : models_.all())
    if (!unserved(m->id, now_s)) return true;
  return false;
}

std::string dispatcher::render_metrics(double now_s) const {
  // Per model: every model a worker has announced (0 when idle, so a scaler sees the series),
  // plus any still named by a request.
  struct per_model {
    size_t active = 0;
    double oldest_wait_s = 0;  // of its queued requests
  };
  std::map<std::string, per_model> models;
  for (const auto& m : models_.all()) models[m->id];
  for (const auto& [model, q] : queue_.by_model()) models[model];
  for (const auto& [id, a] : active_) {
    per_model& pm = models[a->r->model->id];
    pm.active++;
    if (a->phase == request_phase::queued) pm.oldest_wait_s = std::max(pm.oldest_wait_s, now_s - a->t_enqueued_s);
  }
  std::string out;
  metric_family requests(out, "switchyard_router_requests_total", "counter",
                         "Requests answered, by HTTP status (499: client went away).");
  for (const auto& [status, n] : status_counts_) requests.sample({{"status", std::to_string(status)}}, n);
  metric_family rejections(out, "switchyard_router_admission_rejections_total", "counter",
                           "Requests refused at admission, by reason.");
  for (size_t i = 0; i < k_n_reject_reasons; ++i) {
    const auto r = static_cast<reject_reason>(i);
    rejections.sample({{"reason", name(r)}}, admission_.rejected(r));
  }
  metric_family depth(out, "switchyard_router_queue_depth", "gauge",
                      "Requests waiting in the cluster queue, by model and class.");
  for (const auto& [model, pm] : models) {
    const auto q = queue_.by_model().find(model);
    for (size_t i = 0; i < k_n_priority_classes; ++i) {
      const auto c = static_cast<priority_class>(i);
      const size_t n = q == queue_.by_model().end() ? 0 : q->second.size(c);
      depth.sample({{"model", model}, {"class", name(c)}}, n);
    }
  }
  metric_family oldest(out, "switchyard_router_queue_oldest_wait_seconds", "gauge",
                       "How long the longest-waiting queued request of each model has waited (0: none queued).");
  for (const auto& [model, pm] : models) oldest.sample({{"model", model}}, pm.oldest_wait_s);
  metric(out, "switchyard_router_queued_tokens", "gauge", "Prompt + max_tokens of queued requests.",
         static_cast<double>(queue_.tokens()));
  metric_family active(out, "switchyard_router_active_requests", "gauge",
                       "Requests admitted and not yet answered (queued or running), by model.");
  for (const auto& [model, pm] : models) active.sample({{"model", model}}, pm.active);
  metric_family workers(out, "switchyard_router_workers", "gauge", "Workers by state (each in exactly one).");
  for (const auto s : k_worker_states) workers.sample({{"state", name(s)}}, pool_.count(s));
  metric_family in_flight(out, "switchyard_router_worker_in_flight", "gauge",
                          "Requests this router has running or queued on each worker.");
  for (const auto& [w, v] : pool_.all()) in_flight.sample({{"worker", v.endpoint}}, v.in_flight);
  render_worker_kv_metrics(pool_, out);
  render_kv_metrics(pool_, out);
  metric(out, "switchyard_router_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
         static_cast<double>(prompt_tokens_));
  metric(out, "switchyard_router_completion_tokens_total", "counter", "Completion tokens of finished requests.",
         static_cast<double>(completion_tokens_));
  metric(out, "switchyard_router_cached_prompt_tokens_total", "counter",
         "Prompt tokens served from workers' prefix caches.", static_cast<double>(cached_tokens_));
  if (cfg_.tracer != nullptr) {
    metric(out, "switchyard_router_trace_spans_exported_total", "counter",
           "Spans the collector accepted (--otlp-endpoint).", static_cast<double>(cfg_.tracer->exported()));
    metric(out, "switchyard_router_trace_spans_dropped_total", "counter",
           "Spans dropped: the export queue was full or the collector failed or was unreachable.",
           static_cast<double>(cfg_.tracer->dropped()));
  }
  metric(out, "switchyard_router_redispatched_total", "counter",
         "Requests sent to another worker after theirs died before streaming.", static_cast<double>(redispatched_));
  metric(out, "switchyard_router_worker_lost_total", "counter",
         "Streams ended with an error because their worker died mid-stream and they could not be resumed.",
         static_cast<double>(worker_lost_));
  metric(out, "switchyard_router_streams_resumed_total", "counter",
         "Started streams continued on another worker after theirs was lost (the client saw a pause).",
         static_cast<double>(streams_resumed_));
  metric(out, "switchyard_router_retries_total", "counter",
         "Requests dispatched again after a worker failed them (lost, or a worker error).",
         static_cast<double>(retries_.granted() + uncharged_retries_));
  metric(out, "switchyard_router_retries_exhausted_total", "counter",
         "Requests ended with 502 retries_exhausted: workers failed them max_attempts times (a query of death?).",
         static_cast<double>(retries_exhausted_));
  metric(out, "switchyard_router_retry_budget_exhausted_total", "counter",
         "Requests ended with 502 retry_budget_exhausted: the cluster's retry budget was spent.",
         static_cast<double>(retry_budget_exhausted_));
  metric(out, "switchyard_router_worker_ejections_total", "counter",
         "Times a worker was ejected for failing requests in a row (outlier detection).",
         static_cast<double>(pool_.ejections_total()));
  metric(out, "switchyard_router_internal_errors_total", "counter",
         "Requests the router itself failed to handle (answered 500).", static_cast<double>(internal_errors_));
  metric(out, "switchyard_router_client_cancels_total", "counter", "Requests cancelled because the client went away.",
         static_cast<double>(client_cancels_));
  metric(out, "switchyard_router_coalesced_total", "counter",
         "Requests that joined an identical in-flight generation instead of starting one.",
         static_cast<double>(coalesce_.coalesced()));
  metric(out, "switchyard_router_expired_total", "counter", "Requests whose deadline passed in the queue.",
         static_cast<double>(expired_));
  metric(out, "switchyard_router_queue_timeouts_total", "counter",
         "Requests answered 408 queue_timeout: still in the router's queue, never dispatched, past their queue "
         "timeout.",
         static_cast<double>(queue_timeouts_));
  metric(out, "switchyard_router_no_workers_total", "counter",
         "Requests answered 503 no_workers: their model had no ready worker for the no-worker timeout.",
         static_cast<double>(no_workers_));
  metric(out, "switchyard_router_frame_gaps_total", "counter",
         "Tokens frames that arrived after a lost one (a link backlog overflowed): the request resumed from what "
         "the router had.",
         static_cast<double>(frame_gaps_));
  metric(out, "switchyard_router_idle_tries_total", "counter",
         "Started attempts silent past the try-idle timeout while their worker heartbeats: resumed elsewhere.",
         static_cast<double>(idle_tries_));
  metric(out, "switchyard_router_query_of_death_refused_total", "counter",
         "Requests refused because their prompt took down max_attempts workers recently.",
         static_cast<double>(deadly_refused_));
  metric(out, "switchyard_router_stalls_total", "counter",
         "Times this router's own loop stalled past its threshold (paused, throttled); workers were not blamed.",
         static_cast<double>(stalls_));
  metric(out, "switchyard_router_stalled_seconds_total", "counter", "Time this router's loop spent stalled.",
         stalled_s_);
  metric(out, "switchyard_router_late_frames_total", "counter", "Worker frames for requests that had already ended.",
         static_cast<double>(late_frames_));
  metric(out, "switchyard_router_bad_frames_total", "counter", "Worker frames that could not be decoded.",
         static_cast<double>(bad_frames_));
  ttft_s_.render(out, "switchyard_router_ttft_seconds", "Request received to first token received.");
  itl_s_.render(out, "switchyard_router_inter_token_seconds", "Between token messages of one request.");
  e2e_s_.render(out, "switchyard_router_e2e_seconds", "Request received to response complete.");
  queue_wait_s_.render(out, "switchyard_router_queue_wait_seconds", "Time in the cluster queue.");
  dispatch_overhead_s_.render(out, "switchyard_router_dispatch_overhead_seconds",
                              "Router time from request parsed to submit sent, excluding queue wait.");
  return out;
}

}  // namespace sy::router
