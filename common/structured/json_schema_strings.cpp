// String `pattern` and `format` for the JSON Schema compiler: a regex subset compiled to grammar
// rules that write the JSON-escaped content of a string; each format is a pattern of that subset.
//
// Matching: JSON Schema's `pattern` matches anywhere in the string (an unanchored search). The
// grammar writes strings that match the whole pattern, which also match anywhere, so `^` at the
// start and `$` at the end are accepted and change nothing; anchors elsewhere are refused.
//
// The subset: literal characters (UTF-8 too), escapes of punctuation (\. \( \\ ...), \t \n \r \f \v,
// classes [a-z0-9_] and negated [^...] (ASCII), \d \w \s and \D \W \S (ASCII), `.`, groups (...) and
// (?:...), alternation |, quantifiers ? * + {m} {m,} {m,n} (a lazy `?` after one changes no match).
// Negated classes and `.` write printable ASCII only (a subset of what they match). Refused with
// the construct named: lookaround and other (?...) groups, backreferences, \b \B \A \Z, \p{..},
// \uXXXX, anchors inside, a `*`/`+`/{m,} over something that may be empty.
#include <bitset>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "common/json_text.hpp"
#include "common/structured/json_schema_parts.hpp"

namespace sy::json_schema_parts {
namespace {

using grammar::element;
using grammar::sequence;
using char_class = std::bitset<128>;  // ASCII characters (values, before JSON escaping)

constexpr int64_t k_unbounded = -1;

char_class span(int lo, int hi) {
  char_class c;
  for (int i = lo; i <= hi; ++i) c.set(static_cast<size_t>(i));
  return c;
}
const char_class k_printable = span(0x20, 0x7e);
const char_class k_digit = span('0', '9');
const char_class k_word = span('0', '9') | span('a', 'z') | span('A', 'Z') | span('_', '_');
const char_class k_space = span(' ', ' ') | span('\t', '\r');  // \t \n \v \f \r

// How a character is written inside a JSON string.
std::string json_escaped(uint8_t c) {
  std::string out;
  const char ch = static_cast<char>(c);
  append_json_escaped(out, std::string_view(&ch, 1));
  return out;
}

// A parsed part of a pattern: its grammar and the lengths (in characters) of its matches.
struct part {
  sequence seq;
  int64_t min_len = 0;
  int64_t max_len = 0;  // k_unbounded: no limit
};

int64_t add_len(int64_t a, int64_t b) { return a == k_unbounded || b == k_unbounded ? k_unbounded : a + b; }

class regex_compiler {
 public:
  // `cap` >= 0: an unbounded repetition {m,} is written as {m,m+cap} (see compile()).
  regex_compiler(grammar::grammar& g, std::string_view re, std::string path, const json_schema_limits& limits,
                 int64_t cap)
      : g_(g), re_(re), path_(std::move(path)), limits_(limits), cap_(cap) {}

  part run() {
    size_t end = re_.size();
    if (!re_.empty() && re_.front() == '^') pos_ = 1;
    if (end > pos_ && re_[end - 1] == '$') {
      size_t slashes = 0;  // `\$` is a literal dollar
      while (end - 1 - slashes > pos_ && re_[end - 2 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) --end;
    }
    re_ = re_.substr(0, end);
    part p = alternation();
    if (pos_ < re_.size()) fail_at("an unmatched `)`");
    return p;
  }

 private:
  [[noreturn]] void fail_at(const std::string& what) const {
    fail(path_, what + " at offset " + std::to_string(pos_) + " is not supported in `pattern`");
  }
  bool more() const { return pos_ < re_.size(); }
  char peek() const { return re_[pos_]; }

  part alternation() {
    std::vector<part> alts = {branch()};
    while (more() && peek() == '|') {
      ++pos_;
      alts.push_back(branch());
    }
    if (alts.size() == 1) return std::move(alts[0]);
    part out{{}, alts[0].min_len, alts[0].max_len};
    std::vector<sequence> seqs;
    for (auto& a : alts) {
      out.min_len = std::min(out.min_len, a.min_len);
      out.max_len =
          out.max_len == k_unbounded || a.max_len == k_unbounded ? k_unbounded : std::max(out.max_len, a.max_len);
      seqs.push_back(std::move(a.seq));
    }
    out.seq = {g_.ref(g_.alt_rule(path_ + "/alt", std::move(seqs)))};
    return out;
  }

  part branch() {
    part out;
    while (more() && peek() != '|' && peek() != ')') {
      part p = quantified(atom());
      out.seq.insert(out.seq.end(), p.seq.begin(), p.seq.end());
      out.min_len = add_len(out.min_len, p.min_len);
      out.max_len = add_len(out.max_len, p.max_len);
    }
    return out;
  }

  // A decimal number at pos_, if there is one.
  std::optional<int64_t> number() {
    if (!more() || peek() < '0' || peek() > '9') return std::nullopt;
    int64_t n = 0;
    while (more() && peek() >= '0' && peek() <= '9') {
      n = std::min<int64_t>(n * 10 + (peek() - '0'), 1000000);
      ++pos_;
    }
    return n;
  }

  part quantified(part p) {
    if (!more()) return p;
    int64_t lo = 0, hi = k_unbounded;
    const char q = peek();
    if (q == '?') {
      hi = 1;
    } else if (q == '*') {
    } else if (q == '+') {
      lo = 1;
    } else if (q == '{') {
      const size_t start = pos_++;
      if (more() && peek() == ',') fail_at("a `{,n}` quantifier (Python reads {0,n}, ECMAScript a literal)");
      const auto m = number();
      if (!m) {  // `{` that starts no quantifier is a literal brace, as in Python and ECMAScript
        pos_ = start;
        return p;
      }
      lo = hi = *m;
      if (more() && peek() == ',') {
        ++pos_;
        const auto n = number();
        hi = n ? *n : k_unbounded;
      }
      if (!more() || peek() != '}') fail_at("a malformed `{m,n}` quantifier");
      if (hi != k_unbounded && hi < lo) fail_at("a `{m,n}` quantifier with n < m");
      if (std::max(lo, hi) > limits_.max_bounded_repeat)
        fail_at("a repetition count above " + std::to_string(limits_.max_bounded_repeat));
    } else {
      return p;
    }
    ++pos_;
    if (more() && peek() == '?') ++pos_;  // lazy: the same strings
    if (more() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
      fail_at("a quantifier on a quantifier");
    if (hi == k_unbounded && p.min_len == 0) fail_at("an unbounded repetition of something that may be empty");
    if (hi == k_unbounded && cap_ >= 0) hi = lo + cap_;
    // Repeated as one rule reference: copies stay one element each, however long the part.
    if (p.seq.size() > 1) p.seq = {g_.ref(g_.alt_rule(path_ + "/group", {p.seq}))};
    part out;
    out.seq = {g_.ref(g_.repeat(path_ + "/rep", p.seq, static_cast<int>(lo), static_cast<int>(hi)))};
    out.min_len = p.min_len * lo;
    out.max_len = hi == k_unbounded ? (p.max_len == 0 ? 0 : k_unbounded)
                                    : (p.max_len == k_unbounded ? k_unbounded : p.max_len * hi);
    if (g_.size() > limits_.max_grammar_size) fail(path_, "the pattern is too large to enforce");
    return out;
  }

  part one_char(const char_class& c) { return {{klass(c)}, 1, 1}; }

  // One character of `c`, JSON-escaped where it must be.
  element klass(const char_class& c) {
    grammar::byte_set plain;
    std::vector<sequence> escaped;
    for (int ch = 0; ch < 128; ++ch) {
      if (!c[static_cast<size_t>(ch)]) continue;
      const std::string e = json_escaped(static_cast<uint8_t>(ch));
      if (e.size() == 1)
        plain.set(static_cast<uint8_t>(ch));
      else
        escaped.push_back(g_.literal(e));
    }
    if (escaped.empty() && plain.any()) return g_.bytes(plain);
    if (plain.any()) escaped.push_back({g_.bytes(plain)});
    if (escaped.empty()) fail_at("a class that matches no character");
    return g_.ref(g_.alt_rule(path_ + "/class", std::move(escaped)));
  }

  // The class of an escape letter (\d \w \s and their negations), if it is one.
  std::optional<char_class> class_escape(char e) const {
    switch (e) {
      case 'd':
        return k_digit;
      case 'w':
        return k_word;
      case 's':
        return k_space;
      case 'D':
        return k_printable & ~k_digit;
      case 'W':
        return k_printable & ~k_word;
      case 'S':
        return k_printable & ~k_space;
      default:
        return std::nullopt;
    }
  }

  // The character an escape `\e` stands for (other than the classes).
  uint8_t escaped_char(char e) {
    switch (e) {
      case 't':
        return '\t';
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      default:
        break;
    }
    const auto u = static_cast<uint8_t>(e);
    if (u >= 0x80 || std::isalnum(u)) {
      --pos_;
      fail_at(std::string("the escape `\\") + e + "`");
    }
    return u;  // escaped punctuation is itself
  }

  part atom() {
    const char c = peek();
    const size_t start = pos_++;
    switch (c) {
      case '(': {
        if (more() && peek() == '?') {
          if (pos_ + 1 < re_.size() && re_[pos_ + 1] == ':') {
            pos_ += 2;
          } else {
            pos_ = start;
            fail_at("the group `(?`");
          }
        }
        part p = alternation();
        if (!more() || peek() != ')') fail_at("an unclosed `(`");
        ++pos_;
        if (p.seq.empty()) p.seq = {g_.ref(g_.alt_rule(path_ + "/empty", {{}}))};
        return p;
      }
      case '[':
        return one_char(bracket());
      case '.':
        return one_char(k_printable);
      case '^':
      case '$':
        pos_ = start;
        fail_at(std::string("the anchor `") + c + "` inside the pattern");
      case '*':
      case '+':
      case '?':
        pos_ = start;
        fail_at(std::string("a `") + c + "` with nothing to repeat");
      case '\\': {
        if (!more()) fail_at("a trailing `\\`");
        const char e = re_[pos_++];
        if (const auto k = class_escape(e)) return one_char(*k);
        return literal(escaped_char(e));
      }
      default:
        break;
    }
    const auto u = static_cast<uint8_t>(c);
    if (u < 0x80) return literal(u);
    // A UTF-8 character is one atom: its continuation bytes follow it.
    part p{{g_.byte(u)}, 1, 1};
    while (more() && (static_cast<uint8_t>(peek()) & 0xc0) == 0x80)
      p.seq.push_back(g_.byte(static_cast<uint8_t>(re_[pos_++])));
    return p;
  }

  part literal(uint8_t c) { return {g_.literal(json_escaped(c)), 1, 1}; }

  // [...] after the `[`.
  char_class bracket() {
    bool negated = false;
    if (more() && peek() == '^') {
      negated = true;
      ++pos_;
    }
    char_class out;
    bool first = true;
    while (true) {
      if (!more()) fail_at("an unclosed `[`");
      if (peek() == ']' && !first) break;
      first = false;
      auto one = [&]() -> std::optional<uint8_t> {  // a single character, or nothing for \d and kin
        const char c = re_[pos_++];
        if (static_cast<uint8_t>(c) >= 0x80) {
          --pos_;
          fail_at("a non-ASCII character in `[...]`");
        }
        if (c != '\\') return static_cast<uint8_t>(c);
        if (!more()) fail_at("a trailing `\\`");
        const char e = re_[pos_++];
        if (const auto k = class_escape(e)) {
          out |= *k;
          return std::nullopt;
        }
        if (e == 'b') return '\b';  // in a class, \b is a backspace
        return escaped_char(e);
      };
      const auto lo = one();
      if (!lo) continue;
      if (pos_ + 1 < re_.size() && peek() == '-' && re_[pos_ + 1] != ']') {
        ++pos_;
        const auto hi = one();
        if (!hi || *hi < *lo) fail_at("a bad range in `[...]`");
        out |= span(*lo, *hi);
      } else {
        out.set(*lo);
      }
    }
    ++pos_;
    return negated ? k_printable & ~out : out;
  }

  grammar::grammar& g_;
  std::string_view re_;
  std::string path_;
  const json_schema_limits& limits_;
  int64_t cap_;
  size_t pos_ = 0;
};

[[noreturn]] void out_of_length(const std::string& path, const part& p) {
  const std::string lens =
      std::to_string(p.min_len) + (p.max_len == k_unbounded ? " or more" : " to " + std::to_string(p.max_len));
  fail(path, "`minLength`/`maxLength` beside it are supported only when the matches can be kept within them (here: " +
                 lens + " characters)");
}

// With a maxLength and a pattern whose matches may be longer (`[a-z]+`), the unbounded repetitions
// are capped (the largest cap that keeps every match within maxLength): a subset of the strings
// the schema allows, never more. Each try compiles into a copy, so only the chosen one is kept.
sequence compile(grammar::grammar& g, std::string_view pattern, const std::string& path, int min_len, int max_len,
                 const json_schema_limits& limits) {
  const auto fits = [&](const part& p) { return max_len < 0 || (p.max_len != k_unbounded && p.max_len <= max_len); };
  if (max_len < 0) {  // no try to undo: straight into g
    const part p = regex_compiler(g, pattern, path, limits, -1).run();
    if (p.min_len < min_len) out_of_length(path, p);
    return p.seq;
  }
  grammar::grammar out = g;
  part p = regex_compiler(out, pattern, path, limits, -1).run();
  if (!fits(p) && p.max_len == k_unbounded) {
    int64_t lo = 0, hi = max_len;  // the largest cap in [lo, hi] that fits, if any
    std::optional<std::pair<grammar::grammar, part>> best;
    while (lo <= hi) {
      const int64_t cap = (lo + hi) / 2;
      grammar::grammar t = g;
      part q = regex_compiler(t, pattern, path, limits, cap).run();
      if (fits(q)) {
        best.emplace(std::move(t), std::move(q));
        lo = cap + 1;
      } else {
        hi = cap - 1;
      }
    }
    if (best) std::tie(out, p) = std::move(*best);
  }
  if (p.min_len < min_len || !fits(p)) out_of_length(path, p);
  g = std::move(out);
  return p.seq;
}

// Each format as a pattern of the subset above, writing only valid values (a subset of them).
constexpr std::string_view k_octet = "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
constexpr std::string_view k_label = "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?";
// Years 1000-9999; days valid in every year (no 29 February).
constexpr std::string_view k_date =
    "[1-9]\\d{3}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))";
// RFC 3339 full-time: the offset is required; no leap second.
constexpr std::string_view k_time = "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)";

std::string format_pattern(std::string_view format) {
  const std::string label(k_label), octet(k_octet);
  if (format == "date") return std::string(k_date);
  if (format == "time") return std::string(k_time);
  if (format == "date-time") return std::string(k_date) + "T" + std::string(k_time);
  if (format == "uuid") return "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
  if (format == "ipv4") return octet + "(\\." + octet + "){3}";
  if (format == "ipv6") return "[0-9a-f]{1,4}(:[0-9a-f]{1,4}){7}";  // the full form, no `::`
  // At most 3 labels of up to 63 characters: within the 253 characters a hostname may have.
  if (format == "hostname") return label + "(\\." + label + "){0,2}";
  // A practical email: dot-separated atoms of common characters, a domain with a letters-only TLD.
  if (format == "email")
    return "[a-zA-Z0-9_+-]{1,32}(\\.[a-zA-Z0-9_+-]{1,32}){0,2}@" + label + "(\\." + label + "){0,1}\\.[a-zA-Z]{2,12}";
  return {};
}

}  // namespace

void fail(const std::string& path, const std::string& what) {
  throw json_schema_error("json_schema at " + path + ": " + what);
}

sequence string_pattern(grammar::grammar& g, std::string_view pattern, const std::string& path, int min_len,
                        int max_len, const json_schema_limits& limits) {
  return compile(g, pattern, path, min_len, max_len, limits);
}

sequence string_format(grammar::grammar& g, std::string_view format, const std::string& path, int min_len, int max_len,
                       const json_schema_limits& limits) {
  const std::string p = format_pattern(format);
  if (p.empty())
    fail(path, "the format `" + std::string(format) +
                   "` is not supported (supported: date, time, date-time, uuid, email, hostname, ipv4, ipv6)");
  return compile(g, p, path, min_len, max_len, limits);
}

}  // namespace sy::json_schema_parts
