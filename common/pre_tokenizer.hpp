// The text machinery the tokenizers (common/tokenizer.hpp) share: UTF-8 checking and repair,
// GPT-2's byte <-> unicode map, and the byte-level BPE pre-tokenizer, which cuts text into the
// pieces that BPE merges within, by llama.cpp's regex list for a `tokenizer.ggml.pre` value.
//
// The regexes run on PCRE2 (UTF + UCP, JIT when available); only pre_tokenizer.cpp sees pcre2.h.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sy::text {

// ---------------------------------------------------------------------------------------------
// UTF-8

// Outcome of reading one UTF-8 sequence at a position.
struct utf8_step {
  enum kind_t { valid, invalid, truncated } kind;
  size_t len;  // bytes consumed: the sequence, or the maximal invalid subpart (>= 1)
};

// Reads the sequence at s[0, n), n >= 1. Strict RFC 3629 decoding (no overlongs, no surrogates,
// nothing above U+10FFFF) — the same rule PCRE2 applies in UTF mode. `truncated` means the bytes
// up to the end are a valid prefix.
utf8_step utf8_read(const unsigned char* s, size_t n);

// U+FFFD REPLACEMENT CHARACTER, UTF-8 encoded: what invalid input becomes.
inline constexpr std::string_view k_replacement = "\xEF\xBF\xBD";

// Whether all of `s` reads as valid by utf8_read's rule.
bool utf8_valid(std::string_view s);

// What llama.cpp's lenient decoder makes of `s`: a byte that cannot start a sequence, or a
// sequence cut short, becomes one U+FFFD per bad byte; overlong forms are re-encoded canonically.
// Code points PCRE2 cannot hold (surrogates, above U+10FFFF) also become U+FFFD. The result is
// valid UTF-8.
std::string utf8_sanitize(std::string_view s);

// Appends the UTF-8 encoding of `cp`, which must be below U+10000 (the byte map's range).
void append_utf8(std::string& out, uint32_t cp);

// ---------------------------------------------------------------------------------------------
// GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order. A byte-level BPE token's text is its bytes, each written as its mapped
// character. Every mapped code point is below k_max_mapped_cp.

inline constexpr uint32_t k_max_mapped_cp = 0x144;

struct byte_map {
  std::array<uint16_t, 256> byte_to_cp{};
  std::array<int16_t, k_max_mapped_cp> cp_to_byte{};  // -1: not a mapped code point

  byte_map();
};

// The map, built once on first use; immutable.
const byte_map& bytes_unicode();

// Reverses the byte mapping of a normal token's text. Characters outside the map (which a
// well-formed vocabulary does not have) are kept as they are.
std::string unmap_bytes(std::string_view text);

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer

// llama.cpp's settings for one group of tokenizer.ggml.pre values.
struct pre_tokenizer_spec {
  // Applied in sequence: every regex splits each piece of the previous stage into its matches and
  // the gaps between them. Views of static storage; \s and \S mean Unicode White_Space.
  std::vector<std::string_view> regexes;
  bool ignore_merges = false;  // a piece that is itself a token is emitted whole
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token
};

// The settings for a tokenizer.ggml.pre value (llama.cpp's grouping), or nullopt when that
// pre-tokenizer is not supported.
std::optional<pre_tokenizer_spec> find_pre_tokenizer_spec(std::string_view pre);

// Cuts text into the pieces byte-level BPE merges within. Owns its compiled patterns; immutable
// after construction, and split() may run on any number of threads at once (each thread matches
// with match data of its own).
class pre_tokenizer {
 public:
  // A [begin, begin + size) byte range of the text given to split().
  struct piece {
    size_t begin;
    size_t size;
  };

  // The pre-tokenizer for a tokenizer.ggml.pre value, or nullopt when it is not supported.
  static std::optional<pre_tokenizer> from_name(std::string_view pre);
  // Compiles spec.regexes. Throws std::runtime_error naming a pattern PCRE2 rejects.
  explicit pre_tokenizer(const pre_tokenizer_spec& spec);

  pre_tokenizer(pre_tokenizer&&) noexcept;
  pre_tokenizer& operator=(pre_tokenizer&&) noexcept;
  ~pre_tokenizer();

  // Replaces `pieces` with the pieces of `text`, in order; together they cover it exactly. `text`
  // must be valid UTF-8 (utf8_valid; utf8_sanitize makes it so): it is matched without PCRE2's
  // UTF check.
  void split(std::string_view text, std::vector<piece>& pieces) const;
  // See pre_tokenizer_spec::ignore_merges.
  bool ignore_merges() const { return ignore_merges_; }

 private:
  struct patterns;  // the compiled PCRE2 codes, in spec order
  std::unique_ptr<const patterns> patterns_;
  bool ignore_merges_ = false;
};

}  // namespace sy::text
