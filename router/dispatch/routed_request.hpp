// A validated, tokenized generation request on its way from the HTTP layer to the dispatcher.
// Built on an HTTP thread, then owned by the dispatcher thread (moved in a shared_ptr).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "router/base/http_exchange.hpp"
#include "router/dispatch/tenants.hpp"
#include "router/fleet/model_registry.hpp"
#include "router/openai/openai_request.hpp"
#include "router/openai/openai_response.hpp"
#include "router/tracing/request_tracing.hpp"

namespace sy::router {

// POST /v1/embeddings (router/openai/embeddings_api.hpp): the inputs' token ids and how to answer.
struct embedding_job {
  std::vector<std::vector<int32_t>> inputs;
  bool base64 = false;      // encoding_format "base64"
  uint32_t dimensions = 0;  // the client's `dimensions` (0: not given), checked by the worker
};

struct routed_request {
  uint64_t id = 0;         // router-local, unique for the process's life
  std::string request_id;  // X-Request-Id (echoed or generated)
  std::shared_ptr<http_exchange> ex;
  const tenant* who = nullptr;
  int32_t priority = 0;           // the request's (clamped into the tenant's range), or the tenant's default
  bool priority_clamped = false;  // the request asked for a priority outside its tenant's range
  generation_request req;         // validated; req.sampling.max_tokens is the effective limit
  std::vector<int32_t> prompt;
  std::string echo_text;  // completions with echo: the prompt text
  std::shared_ptr<const model_entry> model;
  response_meta meta;
  // Seconds on the router's clock (router_clock.hpp).
  double t_received_s = 0;  // request fully read
  double t_parsed_s = 0;    // validated and tokenized
  double timeout_s = 0;     // until the deadline, from t_received_s; 0: none
  // The client's own queue timeout ("queue_timeout"; 0: none): it only shortens its tenant's
  // (docs/router.md, "Queue timeout").
  double queue_timeout_s = 0;

  // Response cache (empty key: not cacheable). The dispatcher coalesces identical in-flight
  // requests by key and, when cache_store, stores the finished response under it.
  std::string cache_key;
  std::string prompt_hash;
  bool cache_store = false;
  bool rate_charged = false;  // the HTTP edge took it from the tenant's requests/s bucket (precheck)
  // Not looked up (Cache-Control: no-cache) or the lookup failed (Redis error, breaker open,
  // cache threads backed up): generated and stored, but counted as a bypass, not a miss.
  bool cache_bypassed = false;
  std::optional<std::string> preview;  // prompt text for the dashboard (tenants that allow it)
  // Its lookup in the response cache, for its trace: the result (`name(lookup_status)`; empty:
  // none was asked) and when it was asked and answered (router clock).
  std::string cache_lookup;
  double t_lookup_start_s = 0, t_lookup_end_s = 0;
  // An embedding request: dispatched as an `embed` (not a submit) and answered from the worker's
  // `embeddings`; `prompt` then holds every input's ids (its weight in the queue), `req` n = 1,
  // no stream, max_tokens 0, and it is never cached.
  std::optional<embedding_job> embed;
  // Its trace (docs/router.md, "Tracing"); nullopt: tracing is off.
  std::optional<request_trace> trace;
  // Sets `priority` from the one the request asked for (nullopt: the tenant's default), clamped
  // into the tenant's range unless the tenant is strict (docs/router.md, "Priorities").
  void set_priority(std::optional<int32_t> asked) {
    priority = who->limits.effective_priority(asked.value_or(who->limits.default_priority));
    priority_clamped = asked && priority != *asked;
  }
};

// The headers every successful answer to `r` starts with (a response or a stream's head):
// X-Request-Id, and X-Switchyard-Priority with the priority it ran at when its asked one was
// clamped into its tenant's range.
inline std::vector<std::pair<std::string, std::string>> answer_headers(const routed_request& r) {
  std::vector<std::pair<std::string, std::string>> h = {{"X-Request-Id", r.request_id}};
  if (r.priority_clamped) h.emplace_back("X-Switchyard-Priority", std::to_string(r.priority));
  return h;
}

// What every span of `r` (docs/router.md, "Tracing") says of it, ended at `now_s` with `status`
// (`error`: the error code of a failed one): model, tenant, prompt tokens, the cache lookup.
inline request_outcome traced_outcome(const routed_request& r, int status, std::string error, double now_s) {
  request_outcome o;
  o.status = status;
  o.error = std::move(error);
  o.model = r.model ? r.model->id : r.meta.model;
  o.tenant = r.who ? r.who->name : "";
  o.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  o.cache = r.cache_lookup;
  o.t_lookup_start_s = r.t_lookup_start_s;
  o.t_lookup_end_s = r.t_lookup_end_s;
  o.t_received_s = r.t_received_s;
  o.t_end_s = now_s;
  return o;
}

}  // namespace sy::router
