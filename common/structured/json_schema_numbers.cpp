// Integer ranges for the JSON Schema compiler (`minimum`, `maximum`, `exclusiveMinimum`,
// `exclusiveMaximum` on `integer`): an exact grammar of the decimal strings in [lo, hi], built
// digit by digit the way a range becomes a regex (split at each digit where the bounds differ).
#include <string>
#include <vector>

#include "common/structured/json_schema_parts.hpp"

namespace sy::json_schema_parts {
namespace {

using grammar::element;
using grammar::sequence;

class range_builder {
 public:
  explicit range_builder(grammar::grammar& g) : g_(g) {}

  // Natural numbers in [lo, hi], 0 <= lo <= hi, no leading zeros.
  std::vector<sequence> naturals(int64_t lo, int64_t hi) {
    const std::string a = std::to_string(lo), b = std::to_string(hi);
    std::vector<sequence> alts;
    for (size_t len = a.size(); len <= b.size(); ++len) {
      const std::string from = len == a.size() ? a : "1" + std::string(len - 1, '0');
      const std::string to = len == b.size() ? b : std::string(len, '9');
      alts.push_back({rule(between(from, to))});
    }
    return alts;
  }

 private:
  element digits(char lo, char hi) {
    grammar::byte_set s;
    for (char c = lo; c <= hi; ++c) s.set(static_cast<uint8_t>(c));
    return g_.bytes(s);
  }
  element rule(std::vector<sequence> alts) {
    if (alts.size() == 1 && alts[0].size() == 1) return alts[0][0];
    return g_.ref(g_.alt_rule("range", std::move(alts)));
  }
  static bool all(std::string_view s, char c) { return s.find_first_not_of(c) == std::string_view::npos; }

  // Digit strings of a's length in [a, b] (equal lengths, a <= b).
  std::vector<sequence> between(std::string_view a, std::string_view b) {
    if (a.empty()) return {{}};
    const std::string_view ar = a.substr(1), br = b.substr(1);
    const std::string nines(ar.size(), '9'), zeros(ar.size(), '0');
    if (a[0] == b[0]) return {{g_.byte(static_cast<uint8_t>(a[0])), rule(between(ar, br))}};
    std::vector<sequence> alts;
    char mid_lo = a[0], mid_hi = b[0];
    if (!all(ar, '0')) {  // a[0] followed by at least ar
      alts.push_back({g_.byte(static_cast<uint8_t>(a[0])), rule(between(ar, nines))});
      ++mid_lo;
    }
    if (!all(br, '9')) --mid_hi;
    if (mid_lo <= mid_hi) {  // a free leading digit, then any digits
      sequence s = {digits(mid_lo, mid_hi)};
      for (size_t i = 0; i < ar.size(); ++i) s.push_back(digits('0', '9'));
      alts.push_back(std::move(s));
    }
    if (!all(br, '9'))  // b[0] followed by at most br
      alts.push_back({g_.byte(static_cast<uint8_t>(b[0])), rule(between(zeros, br))});
    return alts;
  }

  grammar::grammar& g_;
};

}  // namespace

element integer_range(grammar::grammar& g, std::optional<int64_t> lo, std::optional<int64_t> hi,
                      const std::string& path) {
  const int64_t l = std::max(lo.value_or(-k_max_integer), -k_max_integer);
  const int64_t h = std::min(hi.value_or(k_max_integer), k_max_integer);
  if (l > h)
    fail(path, "the bounds admit no integer" + std::string(l > k_max_integer || h < -k_max_integer
                                                               ? " of at most 16 digits (what the grammar writes)"
                                                               : ""));
  range_builder b(g);
  std::vector<sequence> alts;
  if (h >= 0) alts = b.naturals(std::max<int64_t>(l, 0), h);
  if (l < 0) {  // "-" and the magnitudes in [max(1, -h), -l]
    for (auto& s : b.naturals(std::max<int64_t>(1, -h), -l)) {
      s.insert(s.begin(), g.byte('-'));
      alts.push_back(std::move(s));
    }
  }
  return g.ref(g.alt_rule(path, std::move(alts)));
}

}  // namespace sy::json_schema_parts
