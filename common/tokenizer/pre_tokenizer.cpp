// GPT-2's byte map and the PCRE2-backed pre-tokenizer (see pre_tokenizer.hpp).
#include "common/tokenizer/pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <utility>

namespace sy::text {

// ---------------------------------------------------------------------------------------------
// GPT-2 bytes_to_unicode

byte_map::byte_map() {
  cp_to_byte.fill(-1);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    byte_to_cp[b] = static_cast<uint16_t>(printable ? b : next++);
    cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
  }
}

const byte_map& bytes_unicode() {
  static const byte_map m;
  return m;
}

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
// Pre-tokenizer

namespace {

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
// o200k (GPT-4o), as llama.cpp runs it: its lookahead form of the tokenizer.json regex, where a
// letter run is "letters that are not a-z" then "letters that are not A-Z" (or one or more of the
// first then any of the second), so only ASCII letters have a case and every other letter counts
// as both; combining marks are not letters. Groups made non-capturing (same matches).
constexpr std::string_view k_re_gpt4o =
    "[^\\r\\n\\p{L}\\p{N}]?(?:(?=\\p{L})[^a-z])*(?:(?=\\p{L})[^A-Z])+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "[^\\r\\n\\p{L}\\p{N}]?(?:(?=\\p{L})[^a-z])+(?:(?=\\p{L})[^A-Z])*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

}  // namespace

std::optional<pre_tokenizer_spec> find_pre_tokenizer_spec(std::string_view pre) {
  auto is = [&](std::initializer_list<std::string_view> names) {
    return std::find(names.begin(), names.end(), pre) != names.end();
  };
  if (is({"default"})) {
    return pre_tokenizer_spec{{"[\\p{P}\\$\\+<=>\\^~\\|]+", k_re_gpt2, "\\p{N}+", "[0-9][0-9][0-9]"}};
  }
  if (is({"gpt-2", "gpt2", "mpt", "olmo", "jais", "phi-2"})) return pre_tokenizer_spec{{k_re_gpt2}};
  if (is({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})) {
    return pre_tokenizer_spec{{"\\p{N}", k_re_gpt2}};
  }
  if (is({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"})) {
    return pre_tokenizer_spec{{k_re_llama3}, true, true};
  }
  if (is({"qwen2", "stablelm2", "deepseek-r1-qwen"})) return pre_tokenizer_spec{{k_re_qwen2}};
  if (is({"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"})) return pre_tokenizer_spec{{k_re_gpt4o}};
  return std::nullopt;
}

namespace {

struct pcre2_code_deleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using pcre2_code_ptr = std::unique_ptr<pcre2_code, pcre2_code_deleter>;

struct pcre2_match_data_deleter {
  void operator()(pcre2_match_data* d) const { pcre2_match_data_free(d); }
};

// One match-data block per thread, shared by all pre-tokenizers: compiled patterns are read-only
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

// Splits every piece in `in` into matches of `code` and the gaps between them, appending to `out`.
// Each piece is matched as its own subject, so lookaheads stop at the piece's end.
void regex_split(const pcre2_code* code, std::string_view text, const std::vector<pre_tokenizer::piece>& in,
                 std::vector<pre_tokenizer::piece>& out) {
  pcre2_match_data* md = thread_match_data();
  const auto* base = reinterpret_cast<PCRE2_SPTR>(text.data());
  for (const pre_tokenizer::piece in_piece : in) {
    PCRE2_SPTR subject = base + in_piece.begin;
    size_t pos = 0;   // where the next search starts
    size_t kept = 0;  // end of what has been emitted
    while (pos < in_piece.size) {
      int rc = pcre2_match(code, subject, in_piece.size, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {  // e.g. JIT stack exhausted: interpret
        rc = pcre2_match(code, subject, in_piece.size, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
      }
      if (rc < 0) break;  // no further match (or a hard error): the rest is one gap
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t m_begin = ov[0], m_end = ov[1];
      if (m_begin > kept) out.push_back({in_piece.begin + kept, m_begin - kept});
      if (m_end > m_begin) {
        out.push_back({in_piece.begin + m_begin, m_end - m_begin});
        kept = pos = m_end;
      } else {
        // Empty match: none of the supported patterns produce one; step over a character.
        pos = m_end + 1;
        while (pos < in_piece.size && (subject[pos] & 0xC0) == 0x80) ++pos;
      }
    }
    if (kept < in_piece.size) out.push_back({in_piece.begin + kept, in_piece.size - kept});
  }
}

}  // namespace

struct pre_tokenizer::patterns {
  std::vector<pcre2_code_ptr> codes;  // one per spec regex, in order
};

std::optional<pre_tokenizer> pre_tokenizer::from_name(std::string_view pre) {
  const auto spec = find_pre_tokenizer_spec(pre);
  if (!spec) return std::nullopt;
  return pre_tokenizer(*spec);
}

pre_tokenizer::pre_tokenizer(const pre_tokenizer_spec& spec) : ignore_merges_(spec.ignore_merges) {
  auto p = std::make_unique<patterns>();
  for (const std::string_view re : spec.regexes) p->codes.push_back(compile_regex(re));
  patterns_ = std::move(p);
}

pre_tokenizer::pre_tokenizer(pre_tokenizer&&) noexcept = default;
pre_tokenizer& pre_tokenizer::operator=(pre_tokenizer&&) noexcept = default;
pre_tokenizer::~pre_tokenizer() = default;

void pre_tokenizer::split(std::string_view text, std::vector<piece>& pieces) const {
  thread_local std::vector<piece> next;  // the other buffer of each stage; reused on this thread
  pieces.assign(1, piece{0, text.size()});
  for (const pcre2_code_ptr& code : patterns_->codes) {
    next.clear();
    regex_split(code.get(), text, pieces, next);
    pieces.swap(next);
  }
}

}  // namespace sy::text
