#include "router/tracing/request_tracing.hpp"

#include <algorithm>
#include <chrono>

namespace sy::router {

std::optional<request_trace> trace_for(std::string name, std::string_view traceparent, std::string_view tracestate,
                                       const trace_policy& policy) {
  if (!policy.on) return std::nullopt;
  request_trace t;
  t.name = std::move(name);
  t.server = new_span_id();
  if (auto c = parse_traceparent(traceparent)) {
    t.trace = c->trace;
    t.parent = c->parent;
    t.sampled = c->sampled;
    t.tracestate = std::string(tracestate);
  } else {  // none, or malformed: a new trace (never an error)
    t.trace = new_trace_id();
    t.sampled = sample_new_trace(policy.sample_ratio);
  }
  return t;
}

std::string trace_note(const std::optional<request_trace>& t) { return t ? " trace " + to_hex(t->trace) : ""; }

std::vector<span_record> request_spans(const request_trace& t, const request_outcome& o, double steady_now_s,
                                       uint64_t unix_now_ns) {
  const auto unix_ns = [&](double s) {
    const double back_ns = std::max(0.0, (steady_now_s - s) * 1e9);
    return unix_now_ns - std::min<uint64_t>(unix_now_ns, static_cast<uint64_t>(back_ns));
  };
  const bool failed = o.status >= 400;
  std::vector<span_record> spans;
  span_record server;
  server.trace = t.trace;
  server.id = t.server;
  server.parent = t.parent;
  server.name = t.name;
  server.kind = span_kind::server;
  server.start_ns = unix_ns(o.t_received_s);
  server.end_ns = unix_ns(o.t_end_s);
  server.error = failed;
  server.status_message = o.error;
  server.attributes = {{"http.response.status_code", int64_t{o.status}},
                       {"gen_ai.request.model", o.model},
                       {"switchyard.tenant", o.tenant},
                       {"gen_ai.usage.input_tokens", o.prompt_tokens},
                       {"gen_ai.usage.output_tokens", o.completion_tokens},
                       {"switchyard.cache_hit", o.cache_hit}};
  if (failed && !o.error.empty()) server.attributes.push_back({"error.type", o.error});
  if (!o.cache.empty()) server.attributes.push_back({"switchyard.cache", o.cache});
  if (o.coalesced_onto) {
    server.attributes.push_back({"switchyard.coalesced", true});
    server.attributes.push_back({"switchyard.coalesced.trace_id", to_hex(o.coalesced_onto->trace)});
    server.links.push_back(*o.coalesced_onto);
  }
  if (!t.tracestate.empty()) server.attributes.push_back({"w3c.tracestate", t.tracestate});
  spans.push_back(server);
  // A phase that began and ended; the last one open when the request ended carries its error.
  const auto child = [&](const char* name, double from_s, double to_s, bool open) -> span_record* {
    if (from_s <= 0) return nullptr;
    span_record s;
    s.trace = t.trace;
    s.id = new_span_id();
    s.parent = t.server;
    s.name = name;
    s.start_ns = unix_ns(from_s);
    s.end_ns = std::max(s.start_ns, unix_ns(to_s > 0 ? to_s : o.t_end_s));
    s.error = failed && open;
    if (s.error) s.status_message = o.error;
    spans.push_back(std::move(s));
    return &spans.back();
  };
  if (!o.cache.empty()) {  // the lookup ended before anything else began: never the open phase
    if (span_record* s = child("cache.lookup", o.t_lookup_start_s, o.t_lookup_end_s, false))
      s->attributes = {{"switchyard.cache", o.cache}};
  }
  child("queue", o.t_enqueued_s, o.t_dispatched_s, o.t_dispatched_s <= 0);
  child("prefill", o.t_dispatched_s, o.t_first_token_s, o.t_first_token_s <= 0);
  child("decode", o.t_first_token_s, o.t_last_token_s, true);
  return spans;
}

void export_request(otlp_exporter* tracer, const std::optional<request_trace>& t, const request_outcome& o,
                    double steady_now_s) {
  if (tracer == nullptr || !t || !t->sampled) return;
  const auto unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  for (auto& s : request_spans(*t, o, steady_now_s, unix_ns)) tracer->submit(std::move(s));
}

}  // namespace sy::router
