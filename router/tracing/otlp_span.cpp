#include "router/tracing/otlp_span.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace sy::router {
namespace {

using nlohmann::json;

json any_value(const span_attribute& a) {
  return std::visit(
      [](const auto& v) -> json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) return {{"stringValue", v}};
        if constexpr (std::is_same_v<T, std::int64_t>) return {{"intValue", std::to_string(v)}};  // int64: a string
        if constexpr (std::is_same_v<T, bool>) return {{"boolValue", v}};
        if constexpr (std::is_same_v<T, double>) return {{"doubleValue", v}};
      },
      a.value);
}

bool root(const span_id& s) {
  return std::all_of(s.begin(), s.end(), [](std::uint8_t b) { return b == 0; });
}

json encode_span(const span_record& s) {
  json attrs = json::array();
  for (const auto& a : s.attributes) attrs.push_back({{"key", a.key}, {"value", any_value(a)}});
  json j = {{"traceId", to_hex(s.trace)},
            {"spanId", to_hex(s.id)},
            {"name", s.name},
            {"kind", static_cast<int>(s.kind)},
            {"startTimeUnixNano", std::to_string(s.start_ns)},
            {"endTimeUnixNano", std::to_string(s.end_ns)},
            {"attributes", std::move(attrs)}};
  if (!root(s.parent)) j["parentSpanId"] = to_hex(s.parent);
  if (!s.links.empty()) {
    json links = json::array();
    for (const auto& l : s.links) links.push_back({{"traceId", to_hex(l.trace)}, {"spanId", to_hex(l.span)}});
    j["links"] = std::move(links);
  }
  j["status"] = s.error ? json{{"code", 2}, {"message", s.status_message}} : json::object();
  return j;
}

}  // namespace

std::string encode_otlp_json(const std::vector<span_record>& spans, const std::string& service_name) {
  json out = json::array();
  for (const auto& s : spans) out.push_back(encode_span(s));
  json resource = {
      {"attributes", json::array({{{"key", "service.name"}, {"value", {{"stringValue", service_name}}}}})}};
  json scope_spans = json::array({{{"scope", {{"name", "switchyard"}}}, {"spans", std::move(out)}}});
  json body = {
      {"resourceSpans", json::array({{{"resource", std::move(resource)}, {"scopeSpans", std::move(scope_spans)}}})}};
  return body.dump();
}

}  // namespace sy::router
