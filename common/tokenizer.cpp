// Byte-level BPE (GPT-2 family) with llama.cpp-compatible pre-tokenization.
//
// Pipeline of encode():
//   1. special-token partition: the text is cut at occurrences of control / user-defined token
//      texts, longest texts first, each token over every remaining raw fragment (the order
//      llama.cpp uses, so overlapping candidates resolve the same way);
//   2. each raw fragment is made valid UTF-8 (invalid bytes -> U+FFFD, as llama.cpp does) and
//      split into pieces by the pre-tokenizer regex list, applied in sequence: every regex
//      splits each piece of the previous stage into its matches and the gaps between them;
//   3. each piece is merged bottom-up by BPE rank starting from one symbol per byte (a byte's
//      symbol is the token whose text is the byte's GPT-2 bytes_to_unicode character).
#include "common/tokenizer.hpp"

#include "common/gguf.hpp"
#include "common/protocol.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_map>

namespace sy {

namespace {

// Token types as stored in tokenizer.ggml.token_type (llama.cpp's llama_token_type).
enum token_kind : uint8_t {
  kind_undefined = 0,
  kind_normal = 1,
  kind_unknown = 2,
  kind_control = 3,
  kind_user_defined = 4,
  kind_unused = 5,
  kind_byte = 6,
};

// ---------------------------------------------------------------------------------------------
// UTF-8

// Outcome of reading one UTF-8 sequence at a position.
struct utf8_step {
  enum kind_t { valid, invalid, truncated } kind;
  size_t len;  // bytes consumed: the sequence, or the maximal invalid subpart (>= 1)
};

// Strict RFC 3629 decoding (no overlongs, no surrogates, nothing above U+10FFFF) — the same rule
// PCRE2 applies in UTF mode. `truncated` means the bytes up to the end are a valid prefix.
utf8_step utf8_read(const unsigned char* s, size_t n) {
  const unsigned char b0 = s[0];
  if (b0 < 0x80) return {utf8_step::valid, 1};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {utf8_step::invalid, 1};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) return {utf8_step::truncated, i};
    const unsigned char lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
    if (s[i] < lo_i || s[i] > hi_i) return {utf8_step::invalid, i};
  }
  return {utf8_step::valid, need};
}

constexpr std::string_view k_replacement = "\xEF\xBF\xBD";  // U+FFFD

bool utf8_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const utf8_step st = utf8_read(p + i, s.size() - i);
    if (st.kind != utf8_step::valid) return false;
    i += st.len;
  }
  return true;
}

// What llama.cpp's lenient decoder makes of `s`: a byte that cannot start a sequence, or a
// sequence cut short, becomes one U+FFFD per bad byte; overlong forms are re-encoded canonically.
// Code points PCRE2 cannot hold (surrogates, above U+10FFFF) also become U+FFFD.
std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b0 = p[i];
    size_t len = b0 < 0x80 ? 1 : (b0 & 0xE0) == 0xC0 ? 2 : (b0 & 0xF0) == 0xE0 ? 3 : (b0 & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (!ok) {
      out += k_replacement;
      ++i;
      continue;
    }
    uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1Fu) : len == 3 ? (b0 & 0x0Fu) : (b0 & 0x07u);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3Fu);
    i += len;
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      out += k_replacement;
    } else if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---------------------------------------------------------------------------------------------
// GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order. Every mapped code point is below k_max_mapped_cp.

constexpr uint32_t k_max_mapped_cp = 0x144;

struct byte_map {
  std::array<uint16_t, 256> byte_to_cp{};
  std::array<int16_t, k_max_mapped_cp> cp_to_byte{};  // -1: not a mapped code point

  byte_map() {
    cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = static_cast<uint16_t>(printable ? b : next++);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const byte_map& bytes_unicode() {
  static const byte_map m;
  return m;
}

// Reverses the byte mapping of a normal token's text. Characters outside the map (which a
// well-formed vocabulary does not have) are kept as they are.
std::string unmap_bytes(std::string_view text) {
  const byte_map& m = bytes_unicode();
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const utf8_step st = utf8_read(p + i, text.size() - i);
    if (st.kind != utf8_step::valid) {
      out += text[i++];
      continue;
    }
    uint32_t cp = p[i];
    if (st.len == 2) cp = ((p[i] & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
    if (st.len <= 2 && cp < k_max_mapped_cp && m.cp_to_byte[cp] >= 0) {
      out += static_cast<char>(m.cp_to_byte[cp]);
    } else {
      out.append(text.substr(i, st.len));
    }
    i += st.len;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer regexes

// Unicode White_Space, the set llama.cpp means by \s. PCRE2's UCP \s lacks U+0085, so every \s
// and \S in the patterns below is rewritten to this explicit class.
constexpr std::string_view k_white_space =
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string expand_white_space(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += k_white_space;
        } else {
          out += '[';
          out += k_white_space;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += k_white_space;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
    } else if (c == ']' && in_class) {
      in_class = false;
    }
    out += c;
  }
  return out;
}

constexpr std::string_view k_re_gpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view k_re_llama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view k_re_qwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct pre_spec {
  std::vector<std::string_view> regexes;
  bool ignore_merges = false;  // a piece that is itself a token is emitted whole
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token
};

// The regex list for a tokenizer.ggml.pre value (llama.cpp's grouping), or nullopt.
std::optional<pre_spec> pre_tokenizer_spec(std::string_view pre) {
  auto is = [&](std::initializer_list<std::string_view> names) {
    return std::find(names.begin(), names.end(), pre) != names.end();
  };
  if (is({"default"})) {
    return pre_spec{{"[\\p{P}\\$\\+<=>\\^~\\|]+", k_re_gpt2, "\\p{N}+", "[0-9][0-9][0-9]"}};
  }
  if (is({"gpt-2", "gpt2", "mpt", "olmo", "jais", "phi-2"})) return pre_spec{{k_re_gpt2}};
  if (is({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})) {
    return pre_spec{{"\\p{N}", k_re_gpt2}};
  }
  if (is({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"})) {
    return pre_spec{{k_re_llama3}, true, true};
  }
  if (is({"qwen2", "stablelm2", "deepseek-r1-qwen"})) return pre_spec{{k_re_qwen2}};
  return std::nullopt;
}

struct pcre2_code_deleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using pcre2_code_ptr = std::unique_ptr<pcre2_code, pcre2_code_deleter>;

struct pcre2_match_data_deleter {
  void operator()(pcre2_match_data* d) const { pcre2_match_data_free(d); }
};

// One match-data block per thread, shared by all tokenizers: compiled patterns are read-only
// and may be matched from any number of threads at once.
pcre2_match_data* thread_match_data() {
  thread_local std::unique_ptr<pcre2_match_data, pcre2_match_data_deleter> md(pcre2_match_data_create(16, nullptr));
  return md.get();
}

pcre2_code_ptr compile_regex(std::string_view pattern) {
  const std::string expanded = expand_white_space(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(expanded.data()), expanded.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw std::runtime_error("tokenizer: cannot compile pre-tokenizer regex '" + std::string(pattern) + "' at " +
                             std::to_string(err_off) + ": " + reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: interpreted matching otherwise
  return pcre2_code_ptr(code);
}

// A [begin, begin + size) byte range of the (sanitized) text.
struct span_t {
  size_t begin;
  size_t size;
};

// Splits every piece in `in` into matches of `code` and the gaps between them, appending to `out`.
// Each piece is matched as its own subject, so lookaheads stop at the piece's end.
void regex_split(const pcre2_code* code, std::string_view text, const std::vector<span_t>& in,
                 std::vector<span_t>& out) {
  pcre2_match_data* md = thread_match_data();
  const auto* base = reinterpret_cast<PCRE2_SPTR>(text.data());
  for (const span_t piece : in) {
    PCRE2_SPTR subject = base + piece.begin;
    size_t pos = 0;   // where the next search starts
    size_t kept = 0;  // end of what has been emitted
    while (pos < piece.size) {
      int rc = pcre2_match(code, subject, piece.size, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {  // e.g. JIT stack exhausted: interpret
        rc = pcre2_match(code, subject, piece.size, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
      }
      if (rc < 0) break;  // no further match (or a hard error): the rest is one gap
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t m_begin = ov[0], m_end = ov[1];
      if (m_begin > kept) out.push_back({piece.begin + kept, m_begin - kept});
      if (m_end > m_begin) {
        out.push_back({piece.begin + m_begin, m_end - m_begin});
        kept = pos = m_end;
      } else {
        // Empty match: none of the supported patterns produce one; step over a character.
        pos = m_end + 1;
        while (pos < piece.size && (subject[pos] & 0xC0) == 0x80) ++pos;
      }
    }
    if (kept < piece.size) out.push_back({piece.begin + kept, piece.size - kept});
  }
}

// ---------------------------------------------------------------------------------------------
// BPE

struct merge_rule {
  int32_t rank;     // position in tokenizer.ggml.merges; lower merges first
  token_id result;  // token of the concatenation
};

uint64_t pair_key(token_id a, token_id b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct string_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

struct tokenizer::impl {
  std::vector<std::string> text_;   // token text as stored (byte-mapped for normal tokens)
  std::vector<std::string> bytes_;  // what the token decodes to (see token_bytes)
  std::vector<uint8_t> kind_;       // token_kind per id
  std::vector<uint8_t> eog_;        // 1 for end-of-generation tokens
  std::unordered_map<std::string, token_id, string_hash, std::equal_to<>> id_of_;
  std::unordered_map<uint64_t, merge_rule> merges_;  // pair_key(left, right) -> rule
  std::array<token_id, 256> byte_token_{};           // token of each single byte; -1 if none
  std::vector<token_id> special_;                    // control/user-defined/unknown ids, longest text first
  std::vector<pcre2_code_ptr> regexes_;
  std::string pre_;
  bool ignore_merges_ = false;
  bool add_bos_ = false;
  bool add_eos_ = false;
  token_id bos_ = -1, eos_ = -1, unk_ = -1;

  void split_special(std::string_view text, bool parse_special, std::vector<token_id>& out) const;
  void encode_fragment(std::string_view text, std::vector<token_id>& out) const;
  void bpe_piece(std::string_view piece, std::vector<token_id>& out) const;
};

namespace {

// Scratch state of one BPE merge pass; symbols form a doubly linked list over the piece.
struct bpe_symbol {
  token_id id;
  int32_t prev, next;  // indices into the symbol vector, -1 at the ends
};

struct bpe_candidate {
  int32_t rank;
  int32_t left, right;         // symbol indices
  token_id left_id, right_id;  // the symbols' ids when queued: a changed symbol makes it stale
  token_id result;
  bool operator>(const bpe_candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};

}  // namespace

void tokenizer::impl::bpe_piece(std::string_view piece, std::vector<token_id>& out) const {
  if (ignore_merges_) {
    const byte_map& m = bytes_unicode();
    std::string mapped;
    for (const unsigned char b : piece) append_utf8(mapped, m.byte_to_cp[b]);
    if (const auto it = id_of_.find(mapped); it != id_of_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1) {
    const token_id id = byte_token_[static_cast<unsigned char>(piece[0])];
    if (id >= 0 || unk_ >= 0) out.push_back(id >= 0 ? id : unk_);
    return;
  }

  // Reused between calls on this thread; both are cleared before use.
  thread_local std::vector<bpe_symbol> symbols;
  thread_local std::vector<bpe_candidate> heap;  // min-heap on (rank, left)
  symbols.clear();
  heap.clear();

  const int32_t n = static_cast<int32_t>(piece.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols.push_back({byte_token_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1});
  }
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const token_id a = symbols[left].id, b = symbols[right].id;
    if (a < 0 || b < 0) return;
    const auto it = merges_.find(pair_key(a, b));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, right, a, b, it->second.result});
    std::push_heap(heap.begin(), heap.end(), std::greater<>{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const bpe_candidate c = heap.back();
    heap.pop_back();
    bpe_symbol& l = symbols[c.left];
    bpe_symbol& r = symbols[c.right];
    // Stale when either side was absorbed (id -2) or has grown since the pair was queued.
    if (l.id != c.left_id || r.id != c.right_id || l.next != c.right) continue;
    l.id = c.result;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = c.left;
    r.id = -2;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }

  for (int32_t i = 0; i >= 0 && i < n; i = symbols[i].next) {
    const token_id id = symbols[i].id;
    if (id >= 0) {
      out.push_back(id);
    } else if (unk_ >= 0) {
      out.push_back(unk_);  // a byte the vocabulary has no token for
    }
  }
}

void tokenizer::impl::encode_fragment(std::string_view raw, std::vector<token_id>& out) const {
  if (raw.empty()) return;
  std::string sanitized;
  std::string_view text = raw;
  if (!utf8_valid(raw)) {
    sanitized = utf8_sanitize(raw);
    text = sanitized;
  }
  thread_local std::vector<span_t> pieces, next;
  pieces.assign(1, span_t{0, text.size()});
  for (const auto& re : regexes_) {
    next.clear();
    regex_split(re.get(), text, pieces, next);
    pieces.swap(next);
  }
  for (const span_t p : pieces) bpe_piece(text.substr(p.begin, p.size), out);
}

void tokenizer::impl::split_special(std::string_view text, bool parse_special, std::vector<token_id>& out) const {
  // A fragment is either raw text [begin, begin + size) or a special token (id >= 0).
  struct fragment {
    token_id id;
    size_t begin, size;
  };
  std::vector<fragment> frags{{-1, 0, text.size()}};
  std::vector<fragment> next;
  for (const token_id sid : special_) {
    if (!parse_special && kind_[sid] != kind_user_defined) continue;
    const std::string& st = text_[sid];
    if (st.empty() || text.find(st) == std::string_view::npos) continue;
    next.clear();
    for (const fragment& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      const size_t end = f.begin + f.size;
      while (pos < end) {
        const size_t hit = text.substr(0, end).find(st, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({-1, pos, hit - pos});
        next.push_back({sid, hit, st.size()});
        pos = hit + st.size();
      }
      if (pos < end) next.push_back({-1, pos, end - pos});
    }
    frags.swap(next);
  }
  for (const fragment& f : frags) {
    if (f.id >= 0) {
      out.push_back(f.id);
    } else {
      encode_fragment(text.substr(f.begin, f.size), out);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// tokenizer

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

// What a tokenizer is built from, whichever container it came in (a GGUF file, or the
// tokenizer_spec a worker sends a router). Ids are -1 when absent.
struct tokenizer::source {
  std::string model;
  std::string pre;  // empty: "default"
  std::vector<std::string_view> tokens;
  const std::vector<int64_t>* token_types = nullptr;  // null: all normal
  bool has_merges = false;
  std::vector<std::string_view> merges;
  int64_t bos = -1, eos = -1, unk = -1, eot = -1, eom = -1;
  std::optional<bool> add_bos, add_eos;  // unset: the pre-tokenizer's default / false
};

tokenizer tokenizer::from_gguf(const gguf::file& f) {
  source s;
  s.model = f.get_string("tokenizer.ggml.model");
  if (f.find("tokenizer.ggml.pre")) s.pre = f.get_string("tokenizer.ggml.pre");
  s.tokens = f.get_strings("tokenizer.ggml.tokens");
  std::vector<int64_t> types;
  if (const gguf::value* v = f.find("tokenizer.ggml.token_type")) {
    if (v->type != gguf::value_type::array || v->items.size() != s.tokens.size()) {
      throw std::runtime_error("tokenizer: tokenizer.ggml.token_type must be an array of " +
                               std::to_string(s.tokens.size()) + " integers");
    }
    for (const auto& x : v->items) types.push_back(x.as_int());
    s.token_types = &types;
  }
  s.has_merges = f.find("tokenizer.ggml.merges") != nullptr;
  if (s.has_merges) s.merges = f.get_strings("tokenizer.ggml.merges");
  auto id_key = [&](std::string_view key) -> int64_t {
    const uint64_t v = f.get_uint_or(key, UINT64_MAX);
    if (v == UINT64_MAX) return -1;
    if (v >= s.tokens.size()) {
      throw std::runtime_error("tokenizer: " + std::string(key) + " = " + std::to_string(v) +
                               " is outside the vocabulary of " + std::to_string(s.tokens.size()));
    }
    return static_cast<int64_t>(v);
  };
  s.bos = id_key("tokenizer.ggml.bos_token_id");
  s.eos = id_key("tokenizer.ggml.eos_token_id");
  s.unk = id_key("tokenizer.ggml.unknown_token_id");
  s.eot = id_key("tokenizer.ggml.eot_token_id");
  s.eom = id_key("tokenizer.ggml.eom_token_id");
  if (f.find("tokenizer.ggml.add_bos_token")) s.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", false);
  if (f.find("tokenizer.ggml.add_eos_token")) s.add_eos = f.get_bool_or("tokenizer.ggml.add_eos_token", false);
  return build(s);
}

tokenizer tokenizer::from_spec(const proto::tokenizer_spec& spec) {
  source s;
  s.model = spec.model;
  s.pre = spec.pre;
  s.tokens.assign(spec.tokens.begin(), spec.tokens.end());
  std::vector<int64_t> types(spec.token_types.begin(), spec.token_types.end());
  if (!types.empty()) {
    if (types.size() != s.tokens.size()) {
      throw std::runtime_error("tokenizer: token_types has " + std::to_string(types.size()) + " entries for " +
                               std::to_string(s.tokens.size()) + " tokens");
    }
    s.token_types = &types;
  }
  s.has_merges = !spec.merges.empty();
  s.merges.assign(spec.merges.begin(), spec.merges.end());
  auto id = [&](const char* what, int32_t v) -> int64_t {
    if (v < 0) return -1;
    if (static_cast<size_t>(v) >= s.tokens.size())
      throw std::runtime_error(std::string("tokenizer: ") + what + " id " + std::to_string(v) +
                               " is outside the vocabulary");
    return v;
  };
  s.bos = id("bos", spec.bos_id);
  s.eos = id("eos", spec.eos_id);
  s.unk = id("unk", spec.unk_id);
  s.add_bos = spec.add_bos;
  return build(s);
}

tokenizer tokenizer::build(const source& s) {
  auto p = std::make_unique<impl>();
  if (s.model != "gpt2") {
    throw std::runtime_error("tokenizer: unsupported tokenizer.ggml.model '" + s.model +
                             "' (only byte-level BPE 'gpt2' is implemented)");
  }
  p->pre_ = s.pre.empty() ? "default" : s.pre;
  const auto spec = pre_tokenizer_spec(p->pre_);
  if (!spec) {
    throw std::runtime_error("tokenizer: unsupported tokenizer.ggml.pre '" + p->pre_ + "'");
  }
  for (const std::string_view re : spec->regexes) p->regexes_.push_back(compile_regex(re));
  p->ignore_merges_ = spec->ignore_merges;

  const std::vector<std::string_view>& tokens = s.tokens;
  if (tokens.empty()) throw std::runtime_error("tokenizer: tokenizer.ggml.tokens is empty");
  const size_t n_vocab = tokens.size();
  p->text_.reserve(n_vocab);
  p->id_of_.reserve(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) {
    p->text_.emplace_back(tokens[i]);
    p->id_of_.emplace(p->text_.back(), static_cast<token_id>(i));  // first id wins on duplicates
  }

  p->kind_.assign(n_vocab, kind_normal);
  if (s.token_types) {
    for (size_t i = 0; i < n_vocab; ++i) {
      const int64_t t = (*s.token_types)[i];
      p->kind_[i] = t >= kind_undefined && t <= kind_byte ? static_cast<uint8_t>(t) : uint8_t{kind_undefined};
    }
  }

  if (!s.has_merges) {
    throw std::runtime_error("tokenizer: missing required key tokenizer.ggml.merges");
  }
  const std::vector<std::string_view>& merges = s.merges;
  p->merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string_view m = merges[r];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string_view::npos) continue;
    const std::string_view a = m.substr(0, sp), b = m.substr(sp + 1);
    const auto ia = p->id_of_.find(a), ib = p->id_of_.find(b);
    std::string joined;
    joined.reserve(m.size() - 1);
    joined.append(a).append(b);
    const auto ij = p->id_of_.find(joined);
    // A rule whose parts or result are not tokens can never fire on token symbols; skip it.
    if (ia == p->id_of_.end() || ib == p->id_of_.end() || ij == p->id_of_.end()) continue;
    p->merges_.emplace(pair_key(ia->second, ib->second),
                       merge_rule{static_cast<int32_t>(r), ij->second});  // first rank wins
  }

  const byte_map& bm = bytes_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, bm.byte_to_cp[b]);
    const auto it = p->id_of_.find(ch);
    p->byte_token_[b] = it != p->id_of_.end() ? it->second : -1;
  }

  p->bos_ = static_cast<token_id>(s.bos);
  p->eos_ = static_cast<token_id>(s.eos);
  p->unk_ = static_cast<token_id>(s.unk);
  const token_id eot = static_cast<token_id>(s.eot);
  const token_id eom = static_cast<token_id>(s.eom);
  p->add_bos_ = s.add_bos.value_or(spec->add_bos) && p->bos_ >= 0;
  p->add_eos_ = s.add_eos.value_or(false) && p->eos_ >= 0;

  // End of generation: the declared ids plus the usual turn terminators. Like llama.cpp, a
  // terminator that is not typed CONTROL is treated as one, so it never renders as text.
  p->eog_.assign(n_vocab, 0);
  for (const token_id id : {p->eos_, eot, eom}) {
    if (id >= 0) p->eog_[id] = 1;
  }
  for (const std::string_view t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                   "<|eom_id|>", "<EOT>", "<|end_of_text|>"}) {
    const auto it = p->id_of_.find(t);
    if (it == p->id_of_.end()) continue;
    p->eog_[it->second] = 1;
    p->kind_[it->second] = kind_control;
  }

  p->bytes_.resize(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) {
    switch (p->kind_[i]) {
      case kind_normal:
        p->bytes_[i] = unmap_bytes(p->text_[i]);
        break;
      case kind_control:
      case kind_unknown:
      case kind_user_defined:
        p->bytes_[i] = p->text_[i];
        break;
      case kind_byte: {
        const std::string& t = p->text_[i];  // "<0xAB>" in SentencePiece style, else mapped
        if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>') {
          p->bytes_[i] = std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
        } else {
          p->bytes_[i] = unmap_bytes(t);
        }
        break;
      }
      default:  // unused / undefined tokens render as nothing, as in llama.cpp
        break;
    }
    if (p->kind_[i] == kind_control || p->kind_[i] == kind_user_defined || p->kind_[i] == kind_unknown) {
      p->special_.push_back(static_cast<token_id>(i));
    }
  }
  std::stable_sort(p->special_.begin(), p->special_.end(),
                   [&](token_id a, token_id b) { return p->text_[a].size() > p->text_[b].size(); });

  return tokenizer(std::move(p));
}

std::vector<token_id> tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 4);
  const bool special = add_bos;  // llama.cpp's add_special covers both BOS and EOS
  if (special && impl_->add_bos_) out.push_back(impl_->bos_);
  impl_->split_special(text, parse_special, out);
  if (special && impl_->add_eos_) out.push_back(impl_->eos_);
  return out;
}

std::string tokenizer::token_bytes(token_id id, bool render_special) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->bytes_.size()) return {};
  const uint8_t k = impl_->kind_[id];
  if (!render_special && (k == kind_control || k == kind_unknown)) return {};
  return impl_->bytes_[id];
}

std::string tokenizer::decode(std::span<const token_id> ids, bool render_special) const {
  std::string out;
  for (const token_id id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->bytes_.size()) continue;
    const uint8_t k = impl_->kind_[id];
    if (!render_special && (k == kind_control || k == kind_unknown)) continue;
    out += impl_->bytes_[id];
  }
  return out;
}

size_t tokenizer::vocab_size() const { return impl_->text_.size(); }
token_id tokenizer::bos() const { return impl_->bos_; }
token_id tokenizer::eos() const { return impl_->eos_; }
bool tokenizer::add_bos() const { return impl_->add_bos_; }

bool tokenizer::is_eog(token_id id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->eog_.size() && impl_->eog_[id] != 0;
}

bool tokenizer::is_control(token_id id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->kind_.size() && impl_->kind_[id] == kind_control;
}

token_id tokenizer::find(std::string_view text) const {
  const auto it = impl_->id_of_.find(text);
  return it != impl_->id_of_.end() ? it->second : -1;
}

const std::string& tokenizer::pre_tokenizer() const { return impl_->pre_; }

// ---------------------------------------------------------------------------------------------
// stream_decoder

namespace {

// Appends `in` to `out` with every invalid sequence replaced by U+FFFD (one per maximal
// invalid subpart). When `hold_tail`, a trailing truncated-but-valid prefix is not consumed;
// returns the number of bytes consumed.
size_t append_valid_utf8(std::string_view in, std::string& out, bool hold_tail) {
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  size_t i = 0;
  while (i < in.size()) {
    const utf8_step st = utf8_read(p + i, in.size() - i);
    if (st.kind == utf8_step::valid) {
      out.append(in.substr(i, st.len));
    } else if (st.kind == utf8_step::truncated && hold_tail) {
      return i;
    } else {
      out += k_replacement;
    }
    i += st.len;
  }
  return i;
}

}  // namespace

std::string stream_decoder::push(token_id id) {
  pending_ += tok_->token_bytes(id, render_special_);
  std::string out;
  const size_t used = append_valid_utf8(pending_, out, /*hold_tail=*/true);
  pending_.erase(0, used);
  return out;
}

std::string stream_decoder::flush() {
  std::string out;
  append_valid_utf8(pending_, out, /*hold_tail=*/false);
  pending_.clear();
  return out;
}

}  // namespace sy
