#include "common/structured/grammar.hpp"

#include <algorithm>
#include <functional>
#include <random>
#include <stdexcept>

namespace sy::grammar {
namespace {

// A pathological grammar or input cannot make a state hold more stacks than this; beyond it the
// matcher keeps the first ones (in canonical order) — a JSON Schema grammar stays far below.
constexpr size_t k_max_stacks = 1024;
constexpr int k_max_settle_depth = 4096;

std::string set_text(const byte_set& s) {
  std::string out = "[";
  for (int b = 0; b < 256; ++b) {
    if (!s[static_cast<size_t>(b)]) continue;
    int e = b;
    while (e + 1 < 256 && s[static_cast<size_t>(e + 1)]) ++e;
    auto one = [](int c) {
      if (c >= 0x21 && c < 0x7f && c != ']' && c != '\\' && c != '-') return std::string(1, static_cast<char>(c));
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      return std::string(buf);
    };
    out += one(b);
    if (e > b) out += "-" + one(e);
    b = e;
  }
  return out + "]";
}

}  // namespace

uint32_t grammar::new_rule(std::string name) {
  rules.emplace_back();
  names.push_back(std::move(name));
  return static_cast<uint32_t>(rules.size() - 1);
}

void grammar::add_alt(uint32_t rule, sequence alt) { rules.at(rule).push_back(std::move(alt)); }

element grammar::bytes(const byte_set& s) {
  for (size_t i = 0; i < sets.size(); ++i)
    if (sets[i] == s) return {element::kind::bytes, static_cast<uint32_t>(i)};
  sets.push_back(s);
  return {element::kind::bytes, static_cast<uint32_t>(sets.size() - 1)};
}

element grammar::byte(uint8_t b) {
  byte_set s;
  s.set(b);
  return bytes(s);
}

sequence grammar::literal(std::string_view s) {
  sequence out;
  out.reserve(s.size());
  for (char c : s) out.push_back(byte(static_cast<uint8_t>(c)));
  return out;
}

uint32_t grammar::alt_rule(std::string name, std::vector<sequence> alts) {
  const uint32_t r = new_rule(std::move(name));
  for (auto& a : alts) add_alt(r, std::move(a));
  return r;
}

uint32_t grammar::star(std::string name, const sequence& x) {
  const uint32_t r = new_rule(std::move(name));
  sequence rec = x;
  rec.push_back(ref(r));
  add_alt(r, std::move(rec));
  add_alt(r, {});
  return r;
}

uint32_t grammar::repeat(std::string name, const sequence& x, int min, int max) {
  if (min < 0 || (max >= 0 && max < min)) throw std::invalid_argument("grammar::repeat: bad bounds");
  sequence head;
  for (int i = 0; i < min; ++i) head.insert(head.end(), x.begin(), x.end());
  if (max < 0) {
    head.push_back(ref(star(name + "*", x)));
  } else if (max > min) {
    // opt_k := x opt_{k-1} | empty, k = max - min optional copies.
    uint32_t tail = new_rule(name + "?0");
    add_alt(tail, {});
    for (int k = 1; k <= max - min; ++k) {
      const uint32_t r = new_rule(name + "?" + std::to_string(k));
      sequence s = x;
      s.push_back(ref(tail));
      add_alt(r, std::move(s));
      add_alt(r, {});
      tail = r;
    }
    head.push_back(ref(tail));
  }
  return alt_rule(std::move(name), {std::move(head)});
}

std::string grammar::check() const {
  if (root >= rules.size()) return "the root rule does not exist";
  for (size_t r = 0; r < rules.size(); ++r) {
    if (rules[r].empty()) return "rule " + names[r] + " has no alternative";
    for (const auto& a : rules[r])
      for (const auto& e : a)
        if ((e.k == element::kind::rule && e.index >= rules.size()) ||
            (e.k == element::kind::bytes && e.index >= sets.size()))
          return "rule " + names[r] + " refers to something that does not exist";
  }
  // Nullable rules (derive the empty string), to a fixpoint.
  std::vector<bool> nullable(rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (nullable[r]) continue;
      for (const auto& a : rules[r])
        if (std::all_of(a.begin(), a.end(),
                        [&](const element& e) { return e.k == element::kind::rule && nullable[e.index]; })) {
          nullable[r] = changed = true;
          break;
        }
    }
  }
  // Left recursion: a cycle among "r may start with s" edges.
  std::vector<std::vector<uint32_t>> starts(rules.size());
  for (size_t r = 0; r < rules.size(); ++r)
    for (const auto& a : rules[r])
      for (const auto& e : a) {
        if (e.k == element::kind::bytes) break;
        starts[r].push_back(e.index);
        if (!nullable[e.index]) break;
      }
  std::vector<uint8_t> mark(rules.size(), 0);  // 0 new, 1 on the path, 2 done
  std::string cycle;
  std::function<bool(uint32_t)> visit = [&](uint32_t r) {
    mark[r] = 1;
    for (uint32_t s : starts[r]) {
      if (mark[s] == 1) {
        cycle = names[s];
        return true;
      }
      if (mark[s] == 0 && visit(s)) return true;
    }
    mark[r] = 2;
    return false;
  };
  for (uint32_t r = 0; r < rules.size(); ++r)
    if (mark[r] == 0 && visit(r)) return "rule " + cycle + " is left-recursive";
  return {};
}

size_t grammar::size() const {
  size_t n = 0;
  for (const auto& r : rules)
    for (const auto& a : r) n += a.size() + 1;
  return n;
}

std::string grammar::dump() const {
  std::string out;
  for (size_t r = 0; r < rules.size(); ++r) {
    out += names[r] + " ::=";
    for (size_t i = 0; i < rules[r].size(); ++i) {
      if (i) out += " |";
      for (const auto& e : rules[r][i])
        out += " " + (e.k == element::kind::rule ? names[e.index] : set_text(sets[e.index]));
      if (rules[r][i].empty()) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

// ---- matcher ----------------------------------------------------------------------------------

uint64_t matcher_state::hash() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  };
  for (const auto& st : stacks_) {
    for (const auto& f : st) mix((uint64_t{f.rule} << 40) ^ (uint64_t{f.alt} << 20) ^ f.pos);
    mix(0xffffffffffffffffull);
  }
  return h;
}

void matcher::settle(stack st, std::vector<stack>& out, int depth) const {
  if (depth > k_max_settle_depth) throw std::runtime_error("grammar: expansion too deep (left recursion?)");
  const grammar& g = *g_;
  while (!st.empty()) {
    frame& f = st.back();
    const sequence& alt = g.rules[f.rule][f.alt];
    if (f.pos == alt.size()) {
      st.pop_back();
      continue;
    }
    const element e = alt[f.pos];
    if (e.k == element::kind::bytes) break;
    ++f.pos;
    if (f.pos == alt.size()) st.pop_back();  // the reference ends this alternative: tail call
    const auto& alts = g.rules[e.index];
    for (uint32_t i = 0; i < alts.size(); ++i) {
      stack s2 = st;
      s2.push_back({e.index, i, 0});
      settle(std::move(s2), out, depth + 1);
    }
    return;
  }
  out.push_back(std::move(st));
}

void matcher::canonical(std::vector<stack>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  if (v.size() > k_max_stacks) v.resize(k_max_stacks);
}

matcher_state matcher::initial() const {
  matcher_state s;
  for (uint32_t i = 0; i < g_->rules[g_->root].size(); ++i) settle(stack{{g_->root, i, 0}}, s.stacks_, 0);
  canonical(s.stacks_);
  return s;
}

matcher_state matcher::accept(const matcher_state& s, uint8_t b) const {
  matcher_state out;
  for (const stack& st : s.stacks_) {
    if (st.empty()) continue;
    const frame& top = st.back();
    const element e = g_->rules[top.rule][top.alt][top.pos];
    if (!g_->sets[e.index][b]) continue;
    stack s2 = st;
    ++s2.back().pos;
    settle(std::move(s2), out.stacks_, 0);
  }
  canonical(out.stacks_);
  return out;
}

matcher_state matcher::accept(const matcher_state& s, std::string_view bytes) const {
  matcher_state cur = s;
  for (char c : bytes) {
    cur = accept(cur, static_cast<uint8_t>(c));
    if (cur.dead()) break;
  }
  return cur;
}

byte_set matcher::next_bytes(const matcher_state& s) const {
  byte_set out;
  for (const stack& st : s.stacks_) {
    if (st.empty()) continue;
    const frame& top = st.back();
    out |= g_->sets[g_->rules[top.rule][top.alt][top.pos].index];
  }
  return out;
}

std::optional<std::string> random_sentence(const matcher& m, uint64_t seed, size_t soft_len, size_t max_len) {
  std::mt19937_64 rng(seed);
  matcher_state s = m.initial();
  std::string out;
  while (out.size() < max_len) {
    const bool closing = out.size() >= soft_len;
    if (s.must_end() || (s.accepting() && (closing || rng() % 16 == 0))) return out;
    const byte_set next = m.next_bytes(s);
    if (next.none()) return std::nullopt;
    int pick = -1;
    if (closing)
      for (char c : std::string_view("\"}]0ntf:")) {
        if (next[static_cast<uint8_t>(c)]) {
          pick = static_cast<uint8_t>(c);
          break;
        }
      }
    if (pick < 0) {
      std::vector<int> opts;
      for (int b = 0; b < 256; ++b)
        if (next[static_cast<size_t>(b)]) opts.push_back(b);
      pick = opts[rng() % opts.size()];
    }
    out.push_back(static_cast<char>(pick));
    s = m.accept(s, static_cast<uint8_t>(pick));
  }
  return std::nullopt;
}

}  // namespace sy::grammar
