// W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` header parsed and
// written, and the ids of a new trace. A header that does not parse is ignored, never an error:
// the request starts a new trace (docs/router.md, "Tracing").
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sy::router {

using trace_id = std::array<std::uint8_t, 16>;
using span_id = std::array<std::uint8_t, 8>;

struct trace_context {
  trace_id trace{};
  span_id parent{};        // the caller's span: the parent of the router's server span
  bool sampled = false;    // flags bit 0
  std::string tracestate;  // passed through as received (empty: none)
};

// `00-<32 hex>-<16 hex>-<2 hex>` (lower-case hex). Rejected: a version that is not 2 lower-case
// hex digits or is `ff`; version 00 with anything after the flags; a higher version whose text
// after the flags does not start with '-'; an all-zero trace id or span id; upper-case hex;
// wrong field lengths or separators. nullopt: start a new trace.
std::optional<trace_context> parse_traceparent(std::string_view header);

// `00-<trace>-<span>-<01|00>`.
std::string format_traceparent(const trace_id& trace, const span_id& span, bool sampled);

std::string to_hex(const trace_id& id);
std::string to_hex(const span_id& id);

// Random non-zero ids (a per-thread generator seeded from std::random_device).
trace_id new_trace_id();
span_id new_span_id();

// Whether a trace the router starts is sampled under `ratio` (0: never, 1: always).
bool sample_new_trace(double ratio);

}  // namespace sy::router
