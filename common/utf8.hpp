// UTF-8 reading, checking and repair, declared once for the whole tree: the tokenizers (exact
// llama.cpp behaviour on bad bytes), the streaming decoder (never half a character out) and the
// router's JSON output (every string valid UTF-8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sy::text {

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

// Bytes of the UTF-8 sequence a lead byte announces, unchecked (continuation and invalid bytes
// count 1), as llama.cpp's unicode_len_utf8 reads them.
uint32_t utf8_lead_len(unsigned char b);

// Appends `in` to `out` with each maximal ill-formed subpart (a lead byte and the continuation
// bytes that fit it, or one stray byte) replaced by one U+FFFD — the Unicode-recommended
// practice that nlohmann's "replace" handler and Python's errors="replace" follow too. When
// `hold_tail`, a trailing truncated-but-valid prefix is not consumed (a streaming decoder keeps
// it for the next bytes). Returns the number of bytes of `in` consumed.
size_t append_valid_utf8(std::string_view in, std::string& out, bool hold_tail);

// `s` as valid UTF-8 by append_valid_utf8's rule.
std::string valid_utf8(std::string_view s);

}  // namespace sy::text
