// Tokenizers built from GGUF metadata: byte-level BPE (tokenizer.ggml.model = "gpt2"; Llama 3,
// Qwen2, SmolLM, GPT-2) and SentencePiece (tokenizer.ggml.model = "llama"; Llama 2, Mistral),
// producing llama.cpp's token ids and text.
//
// Immutable after construction and safe to share between threads. The BPE pre-tokenizer is
// chosen by `tokenizer.ggml.pre` and runs on PCRE2 (UTF + UCP, JIT when available).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sy::gguf {
class file;
}
namespace sy::proto {
struct tokenizer_spec;
}

namespace sy {

struct tokenizer_source;

using token_id = int32_t;

// How encode() treats a text. Callers name what they set: tok.encode(t, {.add_special = false}).
struct encode_options {
  // Prepend BOS, and append EOS, when the model asks for them (tokenizer.ggml.add_bos_token /
  // add_eos_token) — llama.cpp's `add_special`. Off for text that continues a sequence.
  bool add_special = true;
  // Text like "<|im_start|>" becomes its special token id; off: it is tokenized as plain text
  // (user-defined tokens are matched either way). Off for untrusted text meant literally.
  bool parse_special = true;
};

class tokenizer {
 public:
  // Throws std::runtime_error naming the key when the metadata is unusable
  // (unsupported tokenizer model or pre-tokenizer, missing tokens/merges).
  static tokenizer from_gguf(const gguf::file& f);
  // From what a worker sends a router in `welcome` (same checks, same result as from_gguf on
  // the model file the worker serves).
  static tokenizer from_spec(const proto::tokenizer_spec& spec);
  // The tokenizer fields of that spec (all but chat_template), read from the model file with
  // the tokenizer model's defaults applied: from_spec(spec_from_gguf(f)) equals from_gguf(f).
  // Throws like from_gguf on unreadable metadata; does not check that the model is supported.
  static proto::tokenizer_spec spec_from_gguf(const gguf::file& f);

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  std::vector<token_id> encode(std::string_view text, encode_options opt = {}) const;
  // Concatenated bytes of the tokens (may end in the middle of a UTF-8 character): llama.cpp's
  // llama_token_to_piece of each token. Control tokens (BOS/EOS, <|im_start|>, ...) are
  // rendered as their text only when `render_special` is set. A SentencePiece token's leading
  // space is kept: unlike llama_detokenize, nothing is stripped from the first token, so a
  // completion decodes the same on its own as after its prompt.
  std::string decode(std::span<const token_id> ids, bool render_special = false) const;
  // Raw bytes of one token.
  std::string token_bytes(token_id id, bool render_special = false) const;

  size_t vocab_size() const;
  // tokenizer.ggml.model: "gpt2" or "llama".
  const std::string& model() const;
  token_id bos() const;
  token_id eos() const;
  // Whether encode(text, {.add_special = true}) prepends BOS (metadata, or the tokenizer model's default:
  // true for SentencePiece and the Llama 3 pre-tokenizer).
  bool add_bos() const;
  // Whether encode(text, {.add_special = true}) appends EOS (tokenizer.ggml.add_eos_token).
  bool add_eos() const;
  // SentencePiece: whether a space is prepended to text at the start and after a special token.
  bool add_space_prefix() const;
  // End-of-generation, as llama.cpp decides it: EOS, EOT, EOM, FIM pad/repo/separator and the
  // chat turn terminators found by their text (<|eot_id|>, <|im_end|>, <|endoftext|>, ...).
  bool is_eog(token_id id) const;
  bool is_control(token_id id) const;
  // The id of a token whose text is exactly `text`, or -1.
  token_id find(std::string_view text) const;
  const std::string& pre_tokenizer() const;

 private:
  struct impl;
  static tokenizer build(const tokenizer_source& s);
  explicit tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace sy
