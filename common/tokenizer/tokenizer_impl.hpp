// The inside of sy::tokenizer (common/tokenizer/tokenizer.hpp), shared by the files that each hold one of
// its roles: tokenizer.cpp (encode: special tokens, then the model's tokenizer; decode),
// tokenizer_bpe.cpp (byte-level BPE), tokenizer_spm.cpp (SentencePiece) and tokenizer_load.cpp
// (the vocabulary built from metadata). Private to those files: nothing else includes it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/tokenizer/pre_tokenizer.hpp"
#include "common/tokenizer/tokenizer.hpp"

namespace sy {

namespace tokenizer_detail {

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

// BPE merges: tokenizer.ggml.merges indexed by the pair of tokens they join.
struct merge_rule {
  int32_t rank;     // position in tokenizer.ggml.merges; lower merges first
  token_id result;  // token of the concatenation
};

inline uint64_t pair_key(token_id a, token_id b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct string_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// SentencePiece token texts (tokenizer_spm.cpp): the byte of a "<0xAB>" token text, or -1; a
// normal token's text with U+2581 turned back into spaces.
int hex_byte(std::string_view t);
std::string spm_unescape(std::string_view text);

}  // namespace tokenizer_detail

struct tokenizer::impl {
  std::vector<std::string> text_;   // token text as stored (byte-mapped / U+2581-escaped for normal tokens)
  std::vector<std::string> bytes_;  // what the token decodes to (see token_bytes)
  std::vector<uint8_t> kind_;       // token_kind per id, after llama.cpp's text-based overrides
  std::vector<uint8_t> eog_;        // 1 for end-of-generation tokens
  std::vector<uint8_t> rstrip_;     // 1: whitespace right after the token is dropped (rstrips_after)
  std::vector<float> score_;        // SentencePiece: merge priority per id (higher first); else empty
  std::unordered_map<std::string, token_id, tokenizer_detail::string_hash, std::equal_to<>> id_of_;
  std::unordered_map<uint64_t, tokenizer_detail::merge_rule> merges_;  // BPE: pair_key(left, right) -> rule
  std::array<token_id, 256> byte_token_{};                             // token of each single byte; -1 if none
  std::vector<token_id> special_;                     // control/user-defined/unknown ids, longest text first
  std::optional<text::pre_tokenizer> pre_tokenizer_;  // BPE only: cuts raw text into pieces
  std::string model_;                                 // tokenizer.ggml.model
  std::string pre_;
  bool spm_ = false;  // SentencePiece ("llama"), else byte-level BPE ("gpt2")
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  token_id bos_ = -1, eos_ = -1, unk_ = -1;

  void split_special(std::string_view text, bool parse_special, std::vector<token_id>& out) const;
  void bpe_fragment(std::string_view text, std::vector<token_id>& out) const;
  void bpe_piece(std::string_view piece, std::vector<token_id>& out) const;
  void spm_fragment(std::string_view text, bool space_prefix, std::vector<token_id>& out) const;
  // The byte tokens of a symbol that is no token (unk, or nothing, for a byte that has none).
  void push_bytes(std::string_view bytes, std::vector<token_id>& out) const;
  // Steps of build(), each needing text_ and id_of_: merges_ (BPE), byte_token_, and eog_
  // with kind_ adjusted by llama.cpp's text-based rules.
  void index_merges(std::span<const std::string_view> merges);
  void find_byte_tokens();
  void apply_token_rules(const tokenizer_source& s);
};

}  // namespace sy
