#include "worker/service/engine_actor.hpp"

#include <caf/all.hpp>
#include <chrono>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "worker/service/actor_protocol.hpp"

namespace sy {
namespace {

// The engine's clock: steady, so deadlines survive wall-clock steps and skew between hosts.
int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void flush(engine_actor_state& st, zmq::context_t* ctx) {
  if (st.out.empty()) return;
  if (!st.outbox) {
    st.outbox = std::make_unique<zmq::socket_t>(*ctx, zmq::socket_type::push);
    st.outbox->set(zmq::sockopt::linger, 0);
    st.outbox->set(zmq::sockopt::sndhwm, 0);  // inproc to the link: never drop, never block long
    st.outbox->connect(k_outbox_endpoint);
  }
  for (auto& f : st.out) {
    st.outbox->send(zmq::buffer(f.peer), zmq::send_flags::sndmore);
    st.outbox->send(zmq::buffer(f.type), zmq::send_flags::sndmore);
    st.outbox->send(zmq::buffer(f.body), zmq::send_flags::none);
  }
  st.out.clear();
}

void publish(engine_actor_state& st) {
  st.local.engine = st.service->eng().stats();
  st.local.service = st.service->counters();
  st.local.draining = st.service->draining();
  std::lock_guard<std::mutex> lk(st.shared->mu);
  st.shared->snap = st.local;
}

}  // namespace

caf::behavior engine_actor(caf::stateful_actor<engine_actor_state>* self, zmq::context_t* ctx, engine* eng,
                           service_config cfg, std::shared_ptr<shared_metrics> metrics) {
  auto& st = self->state;
  st.service = std::make_unique<worker_service>(*eng, std::move(cfg));
  st.shared = std::move(metrics);
  auto kick = [self] {
    if (!self->state.stepping && self->state.service->has_work()) {
      self->state.stepping = true;
      self->send(self, step_atom::value);
    }
  };
  self->send(self, tick_atom::value);
  return {
      [=](frame_atom, const std::string& peer, const std::string& type, const std::string& body) {
        self->state.service->on_frame(peer, type, body, steady_ms(), self->state.out);
        publish(self->state);  // before the replies go out: a client that saw them sees these metrics
        flush(self->state, ctx);
        kick();
      },
      [=](gone_atom, const std::string& peer) {
        self->state.service->on_peer_gone(peer);
        publish(self->state);
        kick();
      },
      [=](step_atom) {
        auto& s = self->state;
        s.stepping = false;
        const uint64_t steps_before = s.service->eng().stats().steps;
        s.service->step(steady_ms(), s.out);
        const engine_stats es = s.service->eng().stats();
        if (es.steps != steps_before) {
          s.local.step_seconds.observe(es.last_step_ms / 1000.0);
          s.local.batch_tokens.observe(es.last_batch_tokens);
          s.local.batch_seqs.observe(es.last_batch_seqs);
        }
        publish(s);  // a copy under a mutex: ~1 us, against steps of milliseconds; before the flush
        flush(s, ctx);
        kick();
      },
      [=](tick_atom) {
        auto& s = self->state;
        s.service->heartbeat(steady_ms(), s.out);
        publish(s);
        flush(s, ctx);
        kick();  // deadlines expire even when nothing else arrives
        self->delayed_send(self, std::chrono::milliseconds(500), tick_atom::value);
      },
      [=](drain_atom) {
        self->state.service->drain();
        publish(self->state);
      },
  };
}

std::string render_metrics(const metrics_snapshot& m) {
  std::string o;
  const auto& e = m.engine;
  const auto& c = m.service;
  metric(o, "switchyard_worker_requests_running", "gauge", "Requests holding KV blocks in the running batch.",
         e.running);
  metric(o, "switchyard_worker_requests_waiting", "gauge", "Requests queued on the worker.", e.waiting);
  metric(o, "switchyard_worker_kv_blocks_total", "gauge", "KV cache blocks in the arena.", e.total_blocks);
  metric(o, "switchyard_worker_kv_blocks_free", "gauge", "KV blocks free or evictable (cached prefixes).",
         e.free_blocks);
  metric(o, "switchyard_worker_kv_usage_ratio", "gauge", "Fraction of KV blocks in use by live sequences.",
         e.total_blocks ? 1.0 - static_cast<double>(e.free_blocks) / e.total_blocks : 0.0);
  metric(o, "switchyard_worker_kv_window_blocks_total", "gauge",
         "KV blocks of the sliding-window layers' own pool (0 without the window release).", e.window_total_blocks);
  metric(o, "switchyard_worker_kv_window_blocks_free", "gauge",
         "Sliding-window KV blocks free or evictable (cached prefixes).", e.window_free_blocks);
  metric(o, "switchyard_worker_prefix_cache_query_tokens_total", "counter",
         "Prompt tokens looked up in the prefix cache.", static_cast<double>(e.prefix_query_tokens));
  metric(o, "switchyard_worker_prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache.",
         static_cast<double>(e.prefix_hit_tokens));
  metric(o, "switchyard_worker_preemptions_total", "counter", "Sequences preempted for lack of KV blocks.",
         static_cast<double>(e.preemptions));
  metric(o, "switchyard_worker_steps_total", "counter", "Engine steps run.", static_cast<double>(e.steps));
  metric(o, "switchyard_worker_prompt_tokens_processed_total", "counter", "Prompt tokens run through the model.",
         static_cast<double>(e.prompt_tokens));
  metric(o, "switchyard_worker_generation_tokens_total", "counter", "Tokens sampled.",
         static_cast<double>(e.decode_tokens));
  metric_family finished(o, "switchyard_worker_requests_finished_total", "counter", "Requests finished, by reason.");
  for (size_t i = 0; i < k_n_finish_reasons; ++i) {
    const auto r = static_cast<finish_reason>(i);
    if (r == finish_reason::none || r == finish_reason::tool_calls) continue;  // not an engine's ending
    finished.sample({{"reason", name(r)}}, c.finished[i]);
  }
  metric(o, "switchyard_worker_requests_rejected_total", "counter", "Submits answered with an error.",
         static_cast<double>(c.rejected));
  metric(o, "switchyard_worker_embed_requests_total", "counter",
         "Embedding requests received (docs/worker.md, \"Embeddings\"); refused ones are in requests_rejected too.",
         static_cast<double>(c.embeds));
  metric(o, "switchyard_worker_embed_requests_answered_total", "counter",
         "Embedding requests answered with their vectors.", static_cast<double>(c.embeds_answered));
  metric(o, "switchyard_worker_messages_bad_total", "counter", "Undecodable or unexpected messages.",
         static_cast<double>(c.bad_messages));
  metric(o, "switchyard_worker_errors_sent_total", "counter", "Error messages sent to routers.",
         static_cast<double>(c.errors_sent));
  metric(o, "switchyard_worker_step_failures_total", "counter",
         "Engine steps that failed; their requests ended with internal_error.", static_cast<double>(c.step_failures));
  if (c.frames_dropped > 0)  // only under fault injection (tests)
    metric(o, "switchyard_worker_fault_frames_dropped_total", "counter",
           "Tokens frames not sent on purpose (--fault-inject drop-frames:N).", static_cast<double>(c.frames_dropped));
  metric_family kv_events(o, "switchyard_worker_kv_events_total", "counter",
                          "Block hashes published to routers' prefix views, by kind (once per step, whatever the "
                          "number of routers).");
  kv_events.sample({{"kind", "stored"}}, c.kv.stored);
  kv_events.sample({{"kind", "evicted"}}, c.kv.evicted);
  metric(o, "switchyard_worker_kv_snapshots_total", "counter",
         "Full prefix-cache snapshots sent to routers (on hello, on a router's resync request, after lost events).",
         static_cast<double>(c.kv.snapshots));
  metric(o, "switchyard_worker_kv_resync_requests_total", "counter", "Routers' requests for a snapshot after a gap.",
         static_cast<double>(c.kv.resyncs));
  metric(o, "switchyard_worker_kv_event_subscribers", "gauge", "Routers receiving this worker's KV block events.",
         static_cast<double>(c.kv_subscribers));
  metric(o, "switchyard_worker_draining", "gauge", "1 while the worker accepts no new requests.", m.draining ? 1 : 0);
  m.step_seconds.render(o, "switchyard_worker_step_seconds", "Duration of one engine step.");
  m.batch_tokens.render(o, "switchyard_worker_batch_tokens", "Tokens in one engine step.");
  m.batch_seqs.render(o, "switchyard_worker_batch_sequences", "Sequences in one engine step.");
  return o;
}

}  // namespace sy
