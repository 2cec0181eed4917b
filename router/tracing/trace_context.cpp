#include "router/tracing/trace_context.hpp"

#include <algorithm>
#include <random>

namespace sy::router {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case is invalid in traceparent
}

template <std::size_t N>
bool parse_hex(std::string_view s, std::array<std::uint8_t, N>& out) {
  if (s.size() != 2 * N) return false;
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return true;
}

template <std::size_t N>
bool all_zero(const std::array<std::uint8_t, N>& a) {
  return std::all_of(a.begin(), a.end(), [](std::uint8_t b) { return b == 0; });
}

template <std::size_t N>
std::string hex_of(const std::array<std::uint8_t, N>& a) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(2 * N, '0');
  for (std::size_t i = 0; i < N; ++i) {
    s[2 * i] = digits[a[i] >> 4];
    s[2 * i + 1] = digits[a[i] & 15];
  }
  return s;
}

std::mt19937_64& rng() {
  thread_local std::mt19937_64 g{(static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};
  return g;
}

template <std::size_t N>
std::array<std::uint8_t, N> random_id() {
  std::array<std::uint8_t, N> a{};
  do {
    for (auto& b : a) b = static_cast<std::uint8_t>(rng()());
  } while (all_zero(a));
  return a;
}

}  // namespace

std::optional<trace_context> parse_traceparent(std::string_view h) {
  // version(2) - trace(32) - span(16) - flags(2) = 55 characters.
  constexpr std::size_t base = 55;
  if (h.size() < base || h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
  std::array<std::uint8_t, 1> version{}, flags{};
  if (!parse_hex(h.substr(0, 2), version) || version[0] == 0xff) return std::nullopt;
  if (version[0] == 0 && h.size() != base) return std::nullopt;
  if (version[0] != 0 && h.size() > base && h[base] != '-') return std::nullopt;
  trace_context c;
  if (!parse_hex(h.substr(3, 32), c.trace) || all_zero(c.trace)) return std::nullopt;
  if (!parse_hex(h.substr(36, 16), c.parent) || all_zero(c.parent)) return std::nullopt;
  if (!parse_hex(h.substr(53, 2), flags)) return std::nullopt;
  c.sampled = (flags[0] & 1) != 0;
  return c;
}

std::string format_traceparent(const trace_id& trace, const span_id& span, bool sampled) {
  return "00-" + hex_of(trace) + "-" + hex_of(span) + (sampled ? "-01" : "-00");
}

std::string to_hex(const trace_id& id) { return hex_of(id); }
std::string to_hex(const span_id& id) { return hex_of(id); }

trace_id new_trace_id() { return random_id<16>(); }
span_id new_span_id() { return random_id<8>(); }

bool sample_new_trace(double ratio) {
  if (ratio >= 1.0) return true;
  if (ratio <= 0.0) return false;
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng()) < ratio;
}

}  // namespace sy::router
