// A request's trace (docs/router.md, "Tracing"): taken from its `traceparent` header or started
// by the router, carried on the routed request to the dispatcher and, as the router's server
// span, to the worker; when the request ends, its server span and the `cache.lookup`, `queue`,
// `prefill` and `decode` children, built from the times the router keeps for its latency metrics.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "router/tracing/otlp_exporter.hpp"
#include "router/tracing/otlp_span.hpp"
#include "router/tracing/trace_context.hpp"

namespace sy::router {

struct trace_policy {
  bool on = false;            // --otlp-endpoint given
  double sample_ratio = 1.0;  // --otlp-sample-ratio: traces the router starts
};

struct request_trace {
  trace_id trace{};
  span_id server{};  // the router's span for the request
  span_id parent{};  // the client's span (all zero: the router started the trace)
  bool sampled = false;
  std::string tracestate;  // passed through to the worker's context as received
  std::string name;        // "POST /v1/chat/completions"

  // The context the router passes on: its server span as the parent.
  std::string traceparent() const { return format_traceparent(trace, server, sampled); }
};

// " trace <32 hex>" for log lines about a traced request, "" for an untraced one.
std::string trace_note(const std::optional<request_trace>& t);

// Off: nullopt. On: the client's trace when its `traceparent` header parses (sampled as its
// flags say; `tracestate` kept), else a new one (sampled under the ratio). `name`: the server
// span's, "METHOD PATH".
std::optional<request_trace> trace_for(std::string name, std::string_view traceparent, std::string_view tracestate,
                                       const trace_policy& policy);

// What the router knows when the request ends. Times are seconds on the router's clock
// (router_clock.hpp); 0: the phase never began.
struct request_outcome {
  int status = 200;
  std::string error;  // the error code or message for a failed request (status >= 400)
  std::string model, tenant;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  bool cache_hit = false;
  // The response cache's lookup (empty: none was asked): its result, `name(lookup_status)`
  // ("hit", "miss", "error", ...), and its times (asked -> answered).
  std::string cache;
  double t_lookup_start_s = 0, t_lookup_end_s = 0;
  // A coalesced client (answered by another identical request's generation): that request's
  // server span, linked and named in `switchyard.coalesced.trace_id`.
  std::optional<span_link> coalesced_onto;
  double t_received_s = 0, t_enqueued_s = 0, t_dispatched_s = 0, t_first_token_s = 0, t_last_token_s = 0;
  double t_end_s = 0;
};

// The server span and its children (a child only for the phases that began), in unix
// nanoseconds: a router time t maps to unix_now_ns - (steady_now_s - t) s.
std::vector<span_record> request_spans(const request_trace& t, const request_outcome& o, double steady_now_s,
                                       uint64_t unix_now_ns);

// The spans of a request that ended at `steady_now_s` to `tracer` (never blocks); nothing when
// tracing is off (`tracer` null, `t` nullopt) or the trace is not sampled.
void export_request(otlp_exporter* tracer, const std::optional<request_trace>& t, const request_outcome& o,
                    double steady_now_s);

}  // namespace sy::router
