// A request the dispatcher has admitted and not yet answered: its state machine and the clients
// listening to its generation. Plain data; the dispatcher (dispatcher.hpp) moves it between
// phases and the coalescer (coalescer.hpp) adds listeners to it.
//
// Life of a request (the worker's side is in worker/engine/scheduler.hpp):
//
//   admitted ──> queued ──pump──> running ──every choice finished──> answered (out of the tables)
//                  ^                 │
//                  └─────────────────┘  its worker refused it (draining), or failed it (lost,
//                                       a worker error) within max_attempts and the retry budget:
//                                       attempt + 1, frames of the old attempt are ignored
//
//   queued or running ──> ended: deadline passed, retries exhausted, a client error, or its last
//                         listener left (cancel sent to the worker); out of the tables, answered
//                         with an error (or not at all: nobody listens)
//
// A request that goes back to the queue after some output reached a client keeps it (its
// choices' tokens) and resumes from there; one that goes back before keeps nothing.
// Times are seconds on the dispatcher's clock (its `now_s`; steady_clock in production).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/finish_reason.hpp"
#include "router/dispatch/admission.hpp"
#include "router/dispatch/routed_request.hpp"
#include "router/fleet/worker_pool.hpp"
#include "router/openai/openai_response.hpp"

namespace sy::router {

enum class request_phase : uint8_t {
  queued,   // in its model's queue (first time, or again after a worker refused or failed it)
  running,  // dispatched to `worker` as attempt `attempt`: its frames are accepted
};

// One choice (n > 1: several) of a generation.
struct choice_state {
  sy::finish_reason finish_reason = sy::finish_reason::none;  // none: not finished
  bool echoed = false;                                        // echo: the prompt text went first
  std::string text;                                           // non-streamed: accumulated
  std::vector<token_logprobs> logprobs;
  uint32_t completion_tokens = 0;   // the worker's count, in the choice's last frame
  uint32_t tokens_seen = 0;         // token ids received so far (continuous_usage_stats)
  std::vector<std::string> deltas;  // cacheable requests: the text pieces as streamed
  std::vector<int32_t> tokens;      // the token ids received: a lost stream resumes from them
  uint32_t frames = 0;              // tokens frames of the current attempt received in order (their seq)
  std::string stop;                 // the stop string that ended it, as its worker named it ("": none)

  bool finished() const { return finish_reason != sy::finish_reason::none; }
};

// A client waiting for a generation: the request's own, or an identical cacheable request
// coalesced onto it. Stream listeners get chunks as they come, others the whole answer at the end.
struct listener {
  std::shared_ptr<routed_request> r;
  bool own = false;           // the generation's own request: logprobs, usage chunks, its own text
  std::vector<bool> started;  // per choice: a chunk went out (streams)

  bool stream() const { return r->req.stream; }
};

struct active_request {
  std::shared_ptr<routed_request> r;
  admission_permit permit;
  request_phase phase = request_phase::queued;
  worker_ref worker = 0;  // running: where
  uint32_t attempt = 0;   // dispatches so far; the wire id carries it
  uint32_t failures = 0;  // dispatches a worker failed (lost it, or ended it with a worker error)
  uint32_t gaps = 0;      // attempts ended because a frame of theirs was lost on the link
  // Attempts whose worker died (or restarted) while running it, having been heard from shortly
  // before the attempt reached it (worker_alive_at_dispatch): the query-of-death evidence.
  uint32_t workers_lost = 0;
  // The current attempt's worker had been heard from within half the heartbeat timeout when the
  // attempt was sent: it was alive to receive it. A worker already silent then (killed with the
  // rest of the fleet, its death not yet noticed) is not evidence against the prompt.
  bool worker_alive_at_dispatch = false;
  // The current attempt's last tokens frame (0: none yet): a started attempt silent past the
  // try-idle timeout lost its frames or its worker lost it.
  double t_last_frame_s = 0;
  std::optional<worker_ref> avoid;  // the worker that failed it last: its retry goes elsewhere
  std::vector<choice_state> choices;
  uint32_t n_finished = 0;
  usage_info usage;
  int64_t queue_tokens = 0;  // what it weighs in the queue (admission's estimate), every time
  double work_done = 0;      // of queue_tokens, counted as done in its model's service rate
  std::vector<uint64_t> block_hashes;
  double t_enqueued_s = 0;  // first admission: its deadline counts from here
  double t_first_token_s = 0, t_last_token_s = 0, t_dispatched_s = 0;
  // Its own client first (until it leaves), then coalesced ones. Empty: nobody listens.
  std::vector<listener> listeners;

  bool running_on(worker_ref w) const { return phase == request_phase::running && worker == w; }
  // Every unfinished choice can go on elsewhere from the tokens it has: fewer than max_tokens
  // (one that has them all lost only its final frame; a resume cannot express that).
  bool resumable() const {
    return std::all_of(choices.begin(), choices.end(), [&](const choice_state& cs) {
      return cs.finished() || cs.tokens.size() < static_cast<size_t>(r->req.sampling.max_tokens);
    });
  }
  // Some client has received part of the output: no silent restart from scratch from here on.
  bool output_sent() const {
    return std::any_of(listeners.begin(), listeners.end(), [](const listener& l) {
      return std::find(l.started.begin(), l.started.end(), true) != l.started.end();
    });
  }
};

// What a request weighs in the queue and against a tenant's tokens/min: prompt + max_tokens per
// choice. Without max_tokens the default fills the context, which alone may exceed a small
// tokens/min budget: such a request is charged the whole budget at most, never refused forever.
int64_t queue_tokens(const routed_request& r);

}  // namespace sy::router
