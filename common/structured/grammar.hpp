// A context-free grammar over bytes and the matcher that walks it byte by byte: the engine of
// constrained decoding (structured outputs, tool calls). Grammars are built by code
// (common/structured/json_schema.hpp compiles a JSON Schema into one); the worker turns a matcher state into
// a token mask (worker/engine/token_mask.hpp).
//
// A grammar is a list of rules; a rule is a list of alternatives; an alternative is a sequence of
// elements, each a set of bytes (one byte from the set) or a reference to a rule. Repetition is
// written with right recursion (R := x R | empty) — the builder's helpers do it — and a grammar
// must not be left-recursive (a rule reachable from itself without consuming a byte):
// `grammar::check` refuses one.
//
// The matcher is the classic set-of-stacks recogniser (as llama.cpp's GBNF): a state is the set of
// parse stacks still alive; each stack's top is a byte set (or the stack is empty: the input so far
// is a complete sentence). Accepting a byte advances every stack whose top set holds it. Frames at
// the end of their alternative are popped, and a reference in last position replaces its frame
// (tail call), so `x*` over a long input keeps the stack flat. States are values: copy, compare,
// hash (the token mask cache is keyed by them).
#pragma once

#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sy::grammar {

using byte_set = std::bitset<256>;

struct element {
  enum class kind : uint8_t { bytes, rule };
  kind k = kind::bytes;
  uint32_t index = 0;  // into grammar::sets (bytes) or grammar::rules (rule)
};

using sequence = std::vector<element>;

struct grammar {
  std::vector<byte_set> sets;
  std::vector<std::vector<sequence>> rules;  // rule -> alternatives
  std::vector<std::string> names;            // per rule, for messages and dumps
  uint32_t root = 0;

  // ---- building ----
  uint32_t new_rule(std::string name);
  void add_alt(uint32_t rule, sequence alt);
  element bytes(const byte_set& s);  // deduplicated
  element byte(uint8_t b);
  element ref(uint32_t rule) const { return {element::kind::rule, rule}; }
  sequence literal(std::string_view s);
  // Rules for common shapes; each returns the new rule.
  uint32_t alt_rule(std::string name, std::vector<sequence> alts);
  uint32_t star(std::string name, const sequence& x);                      // x*
  uint32_t repeat(std::string name, const sequence& x, int min, int max);  // x{min,max}, max < 0: unbounded

  // Empty string when the grammar is usable; otherwise why not (a dangling reference, a rule with
  // no alternative, left recursion).
  std::string check() const;
  size_t size() const;  // elements in all alternatives: a measure for limits
  std::string dump() const;
};

// One parse position: rule, alternative, element index.
struct frame {
  uint32_t rule = 0;
  uint32_t alt = 0;
  uint32_t pos = 0;
  auto operator<=>(const frame&) const = default;
};
using stack = std::vector<frame>;  // back() is the top

class matcher_state {
 public:
  bool dead() const { return stacks_.empty(); }
  // The input so far is a complete sentence (it may still continue).
  bool accepting() const { return !stacks_.empty() && stacks_.front().empty(); }
  // Nothing but the end may follow.
  bool must_end() const { return stacks_.size() == 1 && stacks_.front().empty(); }
  const std::vector<stack>& stacks() const { return stacks_; }
  uint64_t hash() const;
  bool operator==(const matcher_state&) const = default;

 private:
  friend class matcher;
  std::vector<stack> stacks_;  // sorted, unique; every non-empty stack's top is a bytes element
};

// Walks one grammar; cheap to copy (holds a pointer). The grammar must outlive it and be checked.
class matcher {
 public:
  explicit matcher(const grammar& g) : g_(&g) {}
  matcher_state initial() const;
  // The state after byte `b` (dead when no stack accepts it).
  matcher_state accept(const matcher_state& s, uint8_t b) const;
  matcher_state accept(const matcher_state& s, std::string_view bytes) const;
  // Bytes some stack of `s` accepts next.
  byte_set next_bytes(const matcher_state& s) const;
  const grammar& g() const { return *g_; }

 private:
  // Normalises `st` (pops finished frames, expands references) into `out`.
  void settle(stack st, std::vector<stack>& out, int depth) const;
  static void canonical(std::vector<stack>& v);
  const grammar* g_;
};

// A random sentence (tests: random walks checked by an outside validator). Each byte is drawn
// uniformly among those the state accepts; after `soft_len` bytes the walk ends as soon as it
// may and otherwise prefers bytes that close what is open (quotes, brackets, short literals).
// Nothing when it has not ended after `max_len` bytes.
std::optional<std::string> random_sentence(const matcher& m, uint64_t seed, size_t soft_len, size_t max_len);

}  // namespace sy::grammar
