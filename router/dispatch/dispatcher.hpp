// The router's core (docs/architecture.md, "The path of a request", from admission on):
// admission, the cluster priority queue, dispatch to workers, and turning workers' token messages
// into HTTP/SSE responses. A plain state class (docs/engineering.md, "Actors are thin shells"):
// the dispatcher actor feeds it requests, frames and clock ticks and ships the frames it returns;
// unit-testable without sockets or actors.
//
// Owned by one thread. Answers go straight to each request's http_exchange (thread-safe).
// Time is one clock, seconds (router_clock.hpp): every entry point takes `now_s`, frames their
// receive time, requests their stamps; nothing here reads a clock itself.
//
// Request life (its state machine: active_request.hpp): admitted (or rejected with
// 429/403/503) -> queued -> running on a worker as n submits (one per choice, wire id
// "<id>-<attempt>.<choice>") -> tokens stream back -> response ends (stop/length), or an error,
// or its last listener goes (cancel sent to the worker). Identical cacheable requests in flight
// share one generation (coalescer.hpp).
// A worker declared dead: requests that have not sent the client any token go back to the
// front of the queue (attempt + 1, frames of the old attempt are ignored); started streams are
// continued on another worker from what the client has — prompt + the tokens already sent,
// recomputed there as output, with the sampler's state carried on (proto::submit::n_generated) —
// so the client sees a pause, not an error. Nothing waits forever: queued requests expire at
// their deadline.
// Retries are bounded (docs/reliability.md): a request a worker failed — lost with its worker, or
// ended with a worker error — runs at most `max_attempts` times, and only while the cluster's
// retry budget allows; then it ends with a 502 `retries_exhausted` / `retry_budget_exhausted`.
// A worker that keeps failing requests is ejected for a while (worker_pool.hpp, `ejected`).
// Every accepted request ends with an answer: one that throws inside the dispatcher gets a 500.
//
// Workers (worker_pool.hpp for their states): a worker that is no longer listed gets no new
// requests and is removed — its connection closed ("_close"), its metric labels gone — once
// what it runs has ended; a dead one is removed after the pool's grace, and greeted afresh under
// a new ref if it is still listed. No request refers to a worker when it is removed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/metrics.hpp"
#include "router/dispatch/active_request.hpp"
#include "router/dispatch/admission.hpp"
#include "router/dispatch/cache_service.hpp"
#include "router/dispatch/coalescer.hpp"
#include "router/dispatch/model_queues.hpp"
#include "router/dispatch/priority_queue.hpp"
#include "router/dispatch/retry_budget.hpp"
#include "router/dispatch/routed_request.hpp"
#include "router/dispatch/service_rate.hpp"
#include "router/fleet/model_registry.hpp"
#include "router/fleet/worker_pool.hpp"
#include "router/tracing/otlp_exporter.hpp"

namespace sy::router {

// A frame for the link: [worker ref][type][body]. Types starting with '_' are link commands:
// "_connect" (body: endpoint; a ref the link has not seen), "_flush" (drop frames still waiting
// to be sent to that worker), "_close" (close its connection; the ref is never used again).
struct link_frame {
  worker_ref worker = 0;
  std::string type;
  std::string body;
};

struct dispatcher_config {
  std::string router_id = "router";
  // Wall-clock unix seconds: only for the `created` of models as /v1/models lists them.
  std::function<int64_t()> unix_time_s = [] {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  admission_config admission;
  queue_config queue;
  worker_pool_config pool;
  double hello_retry_s = 1.0;
  bool kv_events = true;  // ask workers for their KV block events (docs/kv-events.md)
  // Dispatches per request when workers fail it (lost, or a worker error), the first included:
  // a query of death takes down at most this many workers. 1: never retried.
  uint32_t max_attempts = 2;
  retry_budget_config retry;
  // A model that has had no ready worker for this long (its workers died, drained or left):
  // its queued requests end with 503 no_workers and new ones are refused at once, with
  // Retry-After, instead of waiting out their deadlines. The time before is the grace of a
  // starting fleet, a replacement pod, a worker restarting at its address. 0: no grace.
  double no_worker_timeout_s = 10.0;
  // A gap longer than this between two ticks means this router's own loop stalled (SIGSTOP, CPU
  // throttling under a limit, a VM pause, a debugger): the workers' silence during it is
  // forgiven (worker_pool::forgive_silence) instead of read as their death. 0: off (unit tests
  // that step the clock in big jumps); the router sets a quarter of the heartbeat timeout.
  double stall_threshold_s = 0;
  // A started attempt (it sent a token) that sends nothing more for this long while its worker
  // heartbeats lost a frame or was lost by its worker: it resumes from what the router has, as
  // for a frame gap. Only started attempts: a queued or prefilling one is bounded by its
  // deadline. 0: off.
  double try_idle_timeout_s = 60.0;
  // A prompt that took down max_attempts workers (each lost while running it: a query of death)
  // is refused at once for this long (400 query_of_death), so that a client re-sending it does
  // not take down the fleet two workers at a time. 0: never remembered.
  double query_of_death_ttl_s = 600.0;
  // A request still in its model's queue this long after it was admitted, never dispatched,
  // ends with 408 queue_timeout and Retry-After (docs/router.md, "Queue timeout"); a tenant's
  // queue_timeout_s overrides it, a request's own "queue_timeout" may shorten it. Once dispatched it is never cut by
  // this (a request that comes back to the queue has only its deadline). 0: off.
  double queue_timeout_s = 0;
  // --otlp-endpoint: where the spans of sampled traced requests go (docs/router.md, "Tracing");
  // null: none. Outlives the dispatcher.
  otlp_exporter* tracer = nullptr;
};

class dispatcher {
 public:
  // `cache` (may be null: no response cache) receives finished cacheable responses and the
  // miss/coalesced analytics events; its methods only queue work.
  dispatcher(dispatcher_config cfg, const tenant_registry& tenants, model_registry& models,
             cache_service* cache = nullptr);

  // Lists a worker (static list or discovery): a new one is connected and greeted.
  void add_worker(const std::string& endpoint, double now_s, std::vector<link_frame>& out);
  // No longer listed (it left the DNS answer): no new requests go there, what runs there
  // finishes, then it is removed.
  void retire_worker(const std::string& endpoint, double now_s, std::vector<link_frame>& out);
  void on_request(std::shared_ptr<routed_request> r, double now_s, std::vector<link_frame>& out);
  void on_client_gone(uint64_t id, double now_s, std::vector<link_frame>& out);
  // `t_recv_s`: when the link received it (0: not stamped; now_s stands in).
  void on_frame(worker_ref worker, std::string_view type, std::string_view body, double now_s, double t_recv_s,
                std::vector<link_frame>& out);
  // Liveness, worker removal, expiry, hello retries, dispatch. Call every ~100 ms.
  void tick(double now_s, std::vector<link_frame>& out);
  // Stop admitting (503); what is queued and running finishes.
  void drain() { draining_ = true; }

  // Takes requests: not draining, and some worker is ready and was heard from (welcome or
  // heartbeat) within the heartbeat timeout as of now_s (between the ticks that declare it dead),
  // or a model lost its last one less than no_worker_timeout_s ago (requests queue for a
  // replacement meanwhile: readiness does not flap out of the Service during a rollout).
  bool ready(double now_s) const;
  size_t active() const { return active_.size(); }
  size_t queued() const { return queue_.size(); }
  const worker_pool& workers() const { return pool_; }
  // For the HTTP edge's take_rate (thread-safe); everything else in it is this thread's.
  admission_controller& admission() { return admission_; }
  std::string render_metrics(double now_s) const;

 private:
  void pump(double now_s, std::vector<link_frame>& out);
  void dispatch(active_request& a, worker_ref worker, double now_s, std::vector<link_frame>& out);
  void on_tokens(worker_ref worker, const proto::tokens& m, double now_s, double t_recv_s,
                 std::vector<link_frame>& out);
  void on_worker_error(worker_ref worker, const proto::error& m, double now_s, std::vector<link_frame>& out);
  // A worker's answer to an embed (POST /v1/embeddings): the response to each listener.
  void on_embeddings(worker_ref worker, proto::embeddings& m, double now_s);
  void on_welcome(worker_ref worker, proto::welcome& m, double now_s, std::vector<link_frame>& out);
  // The requests dispatched to a worker that died or restarted: back to the front of the queue if
  // nothing reached the client yet, else ended with worker_lost.
  void requeue_or_fail(worker_ref worker, double now_s, std::vector<link_frame>& out);
  // A worker failed `a` (`cause`: what the client gets if it is not retried). Before any token
  // reached the client it runs again elsewhere, within max_attempts and the retry budget.
  // `charged`: whether the retry draws on the retry budget (the requests of one failed step are
  // one failure: only the first is charged).
  void retry_or_fail(active_request& a, const api_error& cause, double now_s, std::vector<link_frame>& out,
                     bool charged = true);
  // A tokens frame of `a` came with a sequence number past the next one: frames were lost on the
  // link. What the client has is kept; the rest is generated again from there (not charged as a
  // worker failure), at most k_max_gaps times, then the request ends with 502 frames_lost.
  void on_frame_gap(active_request& a, uint32_t choice, uint32_t expected, uint32_t got, std::vector<link_frame>& out);
  // The current attempt of `a` lost frames (`why`, for the log): resumed from what the router
  // has (not charged as a worker failure), or ended with 502 frames_lost past k_max_gaps.
  void resume_lost_try(active_request& a, const std::string& why, std::vector<link_frame>& out);
  // A worker ended a request with a worker error: its outlier record (ejection) is updated.
  void on_worker_fault(worker_ref worker, double now_s);
  // on_request's work; on_request answers a request it throws on before it was registered.
  void admit(std::shared_ptr<routed_request> r, double now_s, std::vector<link_frame>& out);
  // Back to the front of its model's queue (a worker refused or lost it before it started), with
  // its first enqueue time and deadline, so it still expires on time.
  // keep_progress (a started stream that will resume): its choices keep what they sent.
  void requeue(active_request& a, bool keep_progress = false);
  void on_worker_dead(worker_ref worker, double now_s, std::vector<link_frame>& out);
  // A kv_resync to each worker whose prefix view is stale (rate-limited by the pool).
  void request_kv_resyncs(double now_s, std::vector<link_frame>& out);
  void greet(worker_ref worker, double now_s, std::vector<link_frame>& out);
  // Takes out every worker the pool says may go (closing its connection), relisting the dead
  // ones still listed.
  void remove_workers(double now_s, std::vector<link_frame>& out);
  void log_worker_changes();
  // Ends the request with an error to each listener: an HTTP error response, or a terminal SSE
  // error event.
  void fail(active_request& a, const api_error& e, std::vector<link_frame>& out);
  // All choices done: the response (or usage chunk + [DONE]) to each listener; stored in the cache.
  void finish(active_request& a, double now_s);
  // A traced, sampled request ended with `status`: its spans to the exporter (never blocks).
  void trace_end(const active_request& a, int status, const std::string& error, const usage_info& u, double now_s);
  // `r` refused before admission with `e`: its server span.
  void trace_refusal(const routed_request& r, const api_error& e, double now_s);
  // A client coalesced onto `a`'s generation ended with `status`: its server span, linked to a's.
  void trace_coalesced(const active_request& a, const routed_request& r, int status, const std::string& error,
                       const usage_info& u, double now_s);
  void cancel_on_worker(const active_request& a, std::vector<link_frame>& out);
  void erase(uint64_t id);
  // Takes a request out of every table and hands it over (null when unknown).
  std::unique_ptr<active_request> detach(uint64_t id);
  // Work of `a` done, in queue tokens (never more than it weighs), for its model's service rate.
  void credit(active_request& a, double tokens);
  // How long `model`'s queued work takes at its measured service rate; nothing while unknown.
  std::optional<double> queue_wait_s(const std::string& model) const;
  active_request* find_wire(std::string_view wire_id, uint32_t* choice);
  token_logprobs render_logprobs(const routed_request& r, const proto::token_logprob& lp) const;
  template <class T>
  void send(worker_ref worker, const T& m, std::vector<link_frame>& out);
  void count_status(int status) { status_counts_[status]++; }
  // `r` joins the generation of an identical request in flight, if there is one.
  bool coalesce(std::shared_ptr<routed_request>& r);
  // Whether request `id` is in the tables (running, queued, or listening to another's generation).
  bool registered(uint64_t id) const;
  // Whether `model` has been without a ready worker for no_worker_timeout_s (its requests get
  // 503 no_workers).
  bool unserved(const std::string& model, double now_s) const;
  // Records, per model, since when it has had no ready worker; ends the queued requests of the
  // models unserved too long.
  void check_served(double now_s, std::vector<link_frame>& out);
  // A long gap since the last tick: this router stalled; its workers' silence is forgiven.
  void check_stall(double now_s);
  // usage.completion_tokens_details.reasoning_tokens of `a`'s tokens so far (all its choices);
  // nullopt for a request whose answer has no reasoning split.
  static std::optional<uint32_t> reasoning_tokens_of(const active_request& a);
  // Queued requests past their queue timeout end with 408 queue_timeout.
  void check_queue_timeouts(double now_s, std::vector<link_frame>& out);
  // The queue timeout of `r`: its tenant's, else queue_timeout_s, shortened by the request's own
  // (0: none).
  double queue_timeout_of(const routed_request& r) const {
    return r.who->limits.effective_queue_timeout(cfg_.queue_timeout_s, r.queue_timeout_s);
  }
  // Started attempts silent past try_idle_timeout_s resume from what the router has.
  void check_idle_tries(double now_s, std::vector<link_frame>& out);
  // The identity of a prompt for the query-of-death memory: model and token ids.
  static uint64_t prompt_fingerprint(const routed_request& r);

  dispatcher_config cfg_;
  const tenant_registry& tenants_;
  model_registry& models_;
  admission_controller admission_;
  model_queues queue_;
  worker_pool pool_;
  std::unordered_map<uint64_t, std::unique_ptr<active_request>> active_;
  cache_service* cache_ = nullptr;
  coalescer coalesce_;
  std::unordered_map<worker_ref, double> hello_sent_s_;  // per worker in the pool
  bool draining_ = false;
  std::map<std::string, service_rate> rates_;  // per model: how fast its queue is cleared
  double last_tick_s_ = -1;
  // Prompts that took down max_attempts workers (prompt_fingerprint), and until when they are
  // refused; at most k_max_deadly entries (the oldest expiry goes first).
  std::unordered_map<uint64_t, double> deadly_until_s_;
  // Models (served before, or named by queued requests) without a ready worker, and since when.
  std::unordered_map<std::string, double> unserved_since_s_;

  // Metrics (this thread only).
  std::map<int, uint64_t> status_counts_;
  uint64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  uint64_t redispatched_ = 0, worker_lost_ = 0, client_cancels_ = 0, late_frames_ = 0, bad_frames_ = 0;
  uint64_t expired_ = 0;
  uint64_t queue_timeouts_ = 0;  // requests ended by check_queue_timeouts
  uint64_t no_workers_ = 0, stalls_ = 0, frame_gaps_ = 0, idle_tries_ = 0, deadly_refused_ = 0;
  uint64_t uncharged_retries_ = 0;  // retries of a failed step's bystanders (not from the budget)
  double stalled_s_ = 0;
  uint64_t retries_exhausted_ = 0, retry_budget_exhausted_ = 0, internal_errors_ = 0, streams_resumed_ = 0;
  retry_budget retries_;
  histogram ttft_s_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  histogram e2e_s_{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}};
  histogram itl_s_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
  histogram queue_wait_s_{{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30}};
  // Router's own cost: request parsed -> submit handed to the link, minus time in the queue.
  histogram dispatch_overhead_s_{{25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3}};
};

}  // namespace sy::router
