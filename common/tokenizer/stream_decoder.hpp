// Token ids to text, incrementally (streamed completions): the text never ends in half a UTF-8
// character.
#pragma once

#include <string>

#include "common/tokenizer/tokenizer.hpp"

namespace sy {

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
