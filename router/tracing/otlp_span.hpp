// A finished span and its OTLP/HTTP JSON encoding (the OTLP JSON mapping of
// opentelemetry/proto/trace/v1: ids as lower-case hex, 64-bit integers and times as decimal
// strings, enums as numbers). docs/router.md, "Tracing".
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "router/tracing/trace_context.hpp"

namespace sy::router {

enum class span_kind : int { internal = 1, server = 2 };

struct span_attribute {
  std::string key;
  std::variant<std::string, std::int64_t, bool, double> value;
};

// A span of another trace this one relates to (OTLP's Span.Link).
struct span_link {
  trace_id trace{};
  span_id span{};
};

struct span_record {
  trace_id trace{};
  span_id id{};
  span_id parent{};  // all zero: a root span (no parentSpanId written)
  std::string name;
  span_kind kind = span_kind::internal;
  std::uint64_t start_ns = 0, end_ns = 0;  // unix nanoseconds
  bool error = false;                      // status ERROR (2) with `status_message`; else UNSET
  std::string status_message;
  std::vector<span_attribute> attributes;
  std::vector<span_link> links;  // written as `links` when any
};

// One ExportTraceServiceRequest: a resource with `service.name`, one scope `switchyard`, `spans`.
std::string encode_otlp_json(const std::vector<span_record>& spans, const std::string& service_name);

}  // namespace sy::router
