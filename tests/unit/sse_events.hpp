// Splits formatted server-sent events ("event: NAME\ndata: JSON\n\n" ...) into (name, data)
// pairs, in order, for the tests of the APIs whose streams name their events (Anthropic
// Messages, Responses). Fails the test on a frame of another shape.
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace sy::test {

inline std::vector<std::pair<std::string, nlohmann::json>> named_events(const std::string& text) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find("\n\n", at);
    if (end == std::string::npos) end = text.size();
    const std::string ev = text.substr(at, end - at);
    REQUIRE(ev.rfind("event: ", 0) == 0);
    const size_t nl = ev.find("\ndata: ");
    REQUIRE(nl != std::string::npos);
    out.emplace_back(ev.substr(7, nl - 7), nlohmann::json::parse(ev.substr(nl + 7)));
    at = end + 2;
  }
  return out;
}

}  // namespace sy::test
