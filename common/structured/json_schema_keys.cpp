// Property keys for the JSON Schema compiler: the characters of a JSON string, and the key of an
// additional property, which is any string but the names the object lists (docs/structured-outputs.md).
//
// Without the exclusion a listed property skipped in its place could come back among the extra
// ones with any value (`{"city": "Oslo", "unit": "CAB"}` for `unit: {"enum": ["c", "f"]}`), and a
// listed one could be written twice. The key is a trie of the listed names, walked byte by byte:
// at each node it follows a name, or leaves every name with a character none of them has there
// (then anything may follow), or ends where no name ends. On the trie's path characters are
// written unescaped (`\u0075nit` spells `unit` too); it is left with an escape only where the
// escape cannot spell what a name has next: not `\u` of an ASCII letter, digit or punctuation, nor
// of anything where a name goes on with a non-ASCII character. Those keys are not written, a subset
// of the keys the schema allows.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/structured/json_schema_parts.hpp"

namespace sy::json_schema_parts {
namespace {

grammar::byte_set span(int lo, int hi) {
  grammar::byte_set s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return s;
}

// Leaving the trie at `rule` with an escape: one that cannot spell a character a name has next
// (`followed`: the next bytes of names on the path; `escaped`: a `"`, `\` or control some name has
// next, which only an escape writes).
void escapes(grammar::grammar& g, const grammar::byte_set& followed, const grammar::byte_set& escaped, uint32_t rule,
             uint32_t rest) {
  const grammar::element bs = g.byte('\\'), u = g.byte('u'), zero = g.byte('0');
  const grammar::element hex = g.bytes(span('0', '9') | span('a', 'f') | span('A', 'F'));
  auto chars = [](std::string_view cs) {
    grammar::byte_set out;
    for (const char c : cs) out.set(static_cast<uint8_t>(c));
    return out;
  };
  grammar::byte_set simple;  // \" \\ \/ \b \f \n \r \t, by what they stand for
  for (const auto& [c, decoded] : {std::pair<char, char>{'"', '"'},
                                   {'\\', '\\'},
                                   {'/', '/'},
                                   {'b', '\b'},
                                   {'f', '\f'},
                                   {'n', '\n'},
                                   {'r', '\r'},
                                   {'t', '\t'}})
    if (!followed[static_cast<uint8_t>(decoded)] && !escaped[static_cast<uint8_t>(decoded)])
      simple.set(static_cast<uint8_t>(c));
  if (simple.any()) g.add_alt(rule, {bs, g.bytes(simple), g.ref(rest)});
  if ((escaped & span(0x00, 0x1f)).none())
    g.add_alt(rule, {bs, u, zero, zero, g.bytes(chars("01")), hex, g.ref(rest)});  // U+0000-U+001F
  if ((followed & span(0x80, 0xff)).any()) return;
  // No name has a non-ASCII character next: \u of any of them (U+0080 and up, as in the `char` rule).
  g.add_alt(rule, {bs, u, zero, zero, g.bytes(chars("89abcdefABCDEF")), hex, g.ref(rest)});
  g.add_alt(rule, {bs, u, zero, g.bytes(chars("123456789abcdefABCDEF")), hex, hex, g.ref(rest)});
  g.add_alt(rule, {bs, u, g.bytes(chars("123456789abcABC")), hex, hex, hex, g.ref(rest)});
  g.add_alt(rule, {bs, u, g.bytes(chars("dD")), g.bytes(chars("01234567")), hex, hex, g.ref(rest)});
  g.add_alt(rule, {bs, u, g.bytes(chars("efEF")), hex, hex, hex, g.ref(rest)});
  g.add_alt(rule, {bs, u, g.bytes(chars("dD")), g.bytes(chars("89abAB")), hex, hex, bs, u, g.bytes(chars("dD")),
                   g.bytes(chars("cdefCDEF")), hex, hex, g.ref(rest)});
}

}  // namespace

const std::vector<utf8_shape>& unescaped_char_shapes() {
  static const std::vector<utf8_shape> shapes = [] {
    grammar::byte_set ascii = span(0x20, 0x7f);
    ascii.reset('"');
    ascii.reset('\\');
    const grammar::byte_set cont = span(0x80, 0xbf);
    // Well-formed UTF-8 only (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
    return std::vector<utf8_shape>{
        {ascii, {}},
        {span(0xc2, 0xdf), {cont}},
        {span(0xe0, 0xe0), {span(0xa0, 0xbf), cont}},
        {span(0xe1, 0xec) | span(0xee, 0xef), {cont, cont}},
        {span(0xed, 0xed), {span(0x80, 0x9f), cont}},
        {span(0xf0, 0xf0), {span(0x90, 0xbf), cont, cont}},
        {span(0xf1, 0xf3), {cont, cont, cont}},
        {span(0xf4, 0xf4), {span(0x80, 0x8f), cont, cont}},
    };
  }();
  return shapes;
}

grammar::element key_except(grammar::grammar& g, const std::vector<std::string>& names, grammar::element chr,
                            const std::string& path) {
  const std::vector<utf8_shape>& shapes = unescaped_char_shapes();
  struct node {
    std::map<uint8_t, size_t> next;
    bool name = false;          // a listed name ends here
    grammar::byte_set escaped;  // a name goes on with this byte, which only an escape writes
    size_t shape = 0;           // inside a multi-byte character: its shape,
    size_t done = 0;            // and its bytes so far (0: between two characters)
  };
  std::vector<node> trie(1);
  for (const std::string& name : names) {
    size_t at = 0;
    for (const char ch : name) {
      const auto b = static_cast<uint8_t>(ch);
      size_t shape = trie[at].shape, done = trie[at].done;
      if (done == 0) {
        // A byte written escaped (`"`, `\`, controls): the name leaves the unescaped path, and
        // the escapes that could spell it are not written here.
        shape = shapes.size();
        for (size_t i = 0; i < shapes.size(); ++i)
          if (shapes[i].lead[b]) shape = i;
        if (shape == shapes.size()) {
          trie[at].escaped.set(b);
          at = SIZE_MAX;
          break;
        }
      }
      done = done + 1 > shapes[shape].rest.size() ? 0 : done + 1;
      const auto it = trie[at].next.find(b);
      if (it != trie[at].next.end()) {
        at = it->second;
        continue;
      }
      trie[at].next.emplace(b, trie.size());
      at = trie.size();
      trie.push_back({{}, false, {}, shape, done});
    }
    if (at != SIZE_MAX) trie[at].name = true;
  }
  // After leaving the trie: any characters, then the closing quote.
  const uint32_t rest = g.alt_rule(path + "/key-rest", {{g.ref(g.star(path + "/key-chars", {chr})), g.byte('"')}});
  std::vector<uint32_t> rules(trie.size());
  for (size_t i = 0; i < trie.size(); ++i) rules[i] = g.new_rule(path + "/key" + std::to_string(i));
  for (size_t i = 0; i < trie.size(); ++i) {
    const node& n = trie[i];
    grammar::byte_set followed;
    for (const auto& [b, child] : n.next) {
      followed.set(b);
      g.add_alt(rules[i], {g.byte(b), g.ref(rules[child])});
    }
    // Leaving: a byte no name has here (a character's lead byte, or inside one the next byte it
    // allows), the rest of that character, then anything.
    auto leave = [&](const grammar::byte_set& allowed, const std::vector<grammar::byte_set>& after) {
      const grammar::byte_set first = allowed & ~followed;
      if (first.none()) return;
      grammar::sequence alt = {g.bytes(first)};
      for (const grammar::byte_set& c : after) alt.push_back(g.bytes(c));
      alt.push_back(g.ref(rest));
      g.add_alt(rules[i], std::move(alt));
    };
    if (n.done == 0) {
      if (!n.name) g.add_alt(rules[i], {g.byte('"')});  // a key no name ends with
      for (const utf8_shape& shape : shapes) leave(shape.lead, shape.rest);
      escapes(g, followed, n.escaped, rules[i], rest);
    } else {
      const std::vector<grammar::byte_set>& r = shapes[n.shape].rest;
      leave(r[n.done - 1], std::vector<grammar::byte_set>(r.begin() + static_cast<std::ptrdiff_t>(n.done), r.end()));
    }
  }
  return g.ref(g.alt_rule(path + "/key", {{g.byte('"'), g.ref(rules[0])}}));
}

}  // namespace sy::json_schema_parts
