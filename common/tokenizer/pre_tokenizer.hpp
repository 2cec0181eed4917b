// The text machinery the tokenizers (common/tokenizer/tokenizer.hpp) share (UTF-8 itself: common/utf8.hpp):
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

#include "common/utf8.hpp"

namespace sy::text {

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
