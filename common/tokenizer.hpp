// Byte-level BPE tokenizer built from GGUF metadata (tokenizer.ggml.model = "gpt2").
//
// Immutable after construction and safe to share between threads. The pre-tokenizer is chosen
// by `tokenizer.ggml.pre` and runs on PCRE2 (UTF + UCP, JIT when available).
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

using token_id = int32_t;

class tokenizer {
 public:
  // Throws std::runtime_error naming the key when the metadata is unusable
  // (unsupported tokenizer model or pre-tokenizer, missing tokens/merges).
  static tokenizer from_gguf(const gguf::file& f);
  // From what a worker sends a router in `welcome` (same checks, same result as from_gguf on
  // the model file the worker serves).
  static tokenizer from_spec(const proto::tokenizer_spec& spec);

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  // `parse_special`: text like "<|im_start|>" becomes its special token id; otherwise it is
  // tokenized as plain text. `add_bos`: prepend BOS when the model asks for it
  // (tokenizer.ggml.add_bos_token) — llama.cpp's `add_special`.
  std::vector<token_id> encode(std::string_view text, bool add_bos = true, bool parse_special = true) const;
  // Concatenated bytes of the tokens (may end in the middle of a UTF-8 character).
  // Control tokens (BOS/EOS, <|im_start|>, ...) are rendered as their text only when
  // `render_special` is set.
  std::string decode(std::span<const token_id> ids, bool render_special = false) const;
  // Raw bytes of one token.
  std::string token_bytes(token_id id, bool render_special = false) const;

  size_t vocab_size() const;
  token_id bos() const;
  token_id eos() const;
  // Whether encode(text, add_bos = true) prepends BOS (metadata, or the pre-tokenizer's default).
  bool add_bos() const;
  // End-of-generation: EOS and the chat turn terminators (<|im_end|>, <|endoftext|>, ...).
  bool is_eog(token_id id) const;
  bool is_control(token_id id) const;
  // The id of a token whose text is exactly `text`, or -1.
  token_id find(std::string_view text) const;
  const std::string& pre_tokenizer() const;

 private:
  struct impl;
  struct source;
  static tokenizer build(const source& s);
  explicit tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// Turns a stream of token ids into text that never ends in half a UTF-8 character:
// incomplete trailing bytes are held back until the next token completes them.
class stream_decoder {
 public:
  explicit stream_decoder(const tokenizer& tok, bool render_special = false)
      : tok_(&tok), render_special_(render_special) {}
  // Text that became complete with this token (possibly empty).
  std::string push(token_id id);
  // Whatever is still held back (invalid sequences come out as U+FFFD).
  std::string flush();

 private:
  const tokenizer* tok_;
  bool render_special_;
  std::string pending_;
};

}  // namespace sy
