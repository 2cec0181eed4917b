// Streaming decode (see stream_decoder.hpp).
#include "common/tokenizer/stream_decoder.hpp"

#include "common/utf8.hpp"

namespace sy {

std::string stream_decoder::push(token_id id) {
  pending_ += tok_->token_bytes(id, render_special_);
  std::string out;
  const size_t used = text::append_valid_utf8(pending_, out, /*hold_tail=*/true);
  pending_.erase(0, used);
  return out;
}

std::string stream_decoder::flush() {
  std::string out;
  text::append_valid_utf8(pending_, out, /*hold_tail=*/false);
  pending_.clear();
  return out;
}

}  // namespace sy
