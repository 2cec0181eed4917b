// TEST-ONLY fault injection: `switchyard-worker serve --fault-inject MODE` (a hidden flag, off by
// default, never set by deploy/ or the docs' examples). It wraps the real forward backend, so the
// fault surfaces where a real one would — inside engine::step(), through the worker's real error
// path — and the router's handling of bad workers (docs/reliability.md) is tested against real
// processes rather than a fake.
//
// Modes:
//   step-throw        every forward step throws std::runtime_error, as a sticky device error
//                     would: the process stays up, heartbeats, and ends each request it is given
//                     with internal_error (a "black-hole" worker).
//   crash-on:MARKER   the process kills itself (SIGKILL) in the first step that prefills a prompt
//                     chunk whose text contains MARKER: a "query of death" that takes down every
//                     worker it is sent to.
//   slow-step:MS      every forward step takes MS milliseconds longer (a big model's prefill on a
//                     loaded CPU): the engine is silent that long, the link must keep the worker
//                     alive in its routers' eyes (worker/service/worker_link.hpp).
//   sim:MS            no forward at all: each step takes MS milliseconds and streams the words of a
//                     fixed script, so that dozens of workers run on a few cores (the multi-host
//                     suite's scale scenario: discovery, fan-out and router cost per worker).
//   sim:MS:TEXT       the same, but every request's output is TEXT (tokenized by the model's
//                     tokenizer) from its first token, then EOS: a fixed answer for tests of what
//                     the router makes of a text (the reasoning split of <think>...</think>).
//   drop-frames:N     a link fault, not the backend's: the first N tokens frames that are not a
//                     request's last are never sent (their sequence numbers used up), as frames
//                     lost on the link would be (service_config::drop_first_frames).
//   mute-first:N      a link fault too: the first N requests send their first tokens frame and
//                     nothing after it while the worker runs them and heartbeats on
//                     (service_config::mute_first_requests).
#pragma once

#include <memory>
#include <string>

#include "worker/model/forward_backend.hpp"

namespace sy {

class tokenizer;

// `inner` wrapped so that it fails as `mode` says; std::invalid_argument naming --fault-inject
// for an unknown mode. `vocab` (crash-on) must outlive the result.
// N of "drop-frames:N" and of "mute-first:N" (1..1000000; std::invalid_argument otherwise);
// 0 for every other mode.
uint32_t dropped_frames_of(const std::string& mode);
uint32_t muted_requests_of(const std::string& mode);
// Whether `mode` is a fault of the forward backend (with_fault_injection takes it).
bool is_backend_fault(const std::string& mode);

std::unique_ptr<forward_backend> with_fault_injection(std::unique_ptr<forward_backend> inner, const std::string& mode,
                                                      const tokenizer& vocab);

}  // namespace sy
