// Text <-> value for the enums whose values are 0..N-1 and whose text is a table indexed by value
// (wire names, metric labels): msg_type, finish_reason, error_code.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace sy {

// names[e], or `fallback` for a value outside the table.
template <class E, size_t N>
constexpr std::string_view enum_name(const std::string_view (&names)[N], E e, std::string_view fallback) {
  const auto i = static_cast<size_t>(e);
  return i < N ? names[i] : fallback;
}

// The value whose name is `s` (exact, case-sensitive match); nullopt for anything else.
template <class E, size_t N>
constexpr std::optional<E> enum_parse(const std::string_view (&names)[N], std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}

}  // namespace sy
