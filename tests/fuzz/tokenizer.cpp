// Fuzzes the tokenizers (common/tokenizer/tokenizer.hpp) and what is made from a vocabulary
// (common/tokenizer/hf_tokenizer.hpp). Two small vocabularies are built here once — byte-level BPE
// ("gpt2", SmolLM's pre-tokenizer) and SentencePiece ("llama", byte fallback) — and the first
// byte of an input picks what the rest is:
//   0, 1: text encoded by the BPE / SentencePiece vocabulary (with and without special tokens),
//         then decoded; byte-level BPE gives back exactly the valid UTF-8 text it was given;
//   2:    token ids (little-endian int32, any value) decoded at once and one by one through a
//         stream_decoder, whose output must be valid UTF-8;
//   3:    a vocabulary from a worker (a welcome's tokenizer_spec: lines of the rest become tokens
//         and merges, bytes pick the model, pre-tokenizer, token types and special ids), built as
//         the router builds it, used, and written as Hugging Face's tokenizer.json.
// Nothing may crash; a vocabulary may be refused only by an exception.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/chat_template.hpp"
#include "common/tokenizer/hf_tokenizer.hpp"
#include "common/tokenizer/stream_decoder.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "common/wire/protocol.hpp"
#include "tests/unit/tiny_vocab.hpp"

namespace proto = sy::proto;

namespace {

constexpr int32_t k_normal = 1, k_control = 3, k_byte = 6;

// GPT-2's byte-to-character map, as the router tests' tiny vocabulary has it.
using sy::test::tiny_vocab_detail::byte_char;

void add_token(proto::tokenizer_spec& s, std::string text, int32_t type, float score = 0.f) {
  s.tokens.push_back(std::move(text));
  s.token_types.push_back(type);
  s.scores.push_back(score);
}

proto::tokenizer_spec bpe_spec() {
  proto::tokenizer_spec s;
  s.model = "gpt2";
  s.pre = "smollm";
  add_token(s, "<|endoftext|>", k_control);
  add_token(s, "<|im_start|>", k_control);
  add_token(s, "<|im_end|>", k_control);
  for (int b = 0; b < 256; ++b) add_token(s, byte_char(uint8_t(b)), k_normal);
  const std::string sp = byte_char(' ');
  const char* pairs[][2] = {{"h", "e"}, {"l", "l"},  {"he", "ll"}, {"hell", "o"},
                            {"o", "r"}, {"w", "or"}, {"wor", "ld"}};
  add_token(s, "ld", k_normal);
  for (const auto& p : pairs) {
    s.merges.push_back(std::string(p[0]) + " " + p[1]);
    if (std::string(p[0]) + p[1] != "ld") add_token(s, std::string(p[0]) + p[1], k_normal);
  }
  s.merges.push_back(sp + " w");
  add_token(s, sp + "w", k_normal);
  s.bos_id = s.eos_id = 0;
  return s;
}

proto::tokenizer_spec spm_spec() {
  proto::tokenizer_spec s;
  s.model = "llama";
  s.pre = "default";
  add_token(s, "<unk>", 2);
  add_token(s, "<s>", k_control);
  add_token(s, "</s>", k_control);
  char hex[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    add_token(s, hex, k_byte);
  }
  const std::string sp = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  const std::string pieces[] = {sp,  sp + "the", sp + "a", "he", "llo", sp + "hello", "o",       "w",
                                "r", "l",        "d",      "e",  "h",   "t",          "\xC3\xA9"};
  float score = -1.f;
  for (const std::string& p : pieces) add_token(s, p, k_normal, score -= 0.5f);
  s.unk_id = 0;
  s.bos_id = 1;
  s.eos_id = 2;
  s.add_bos = true;
  s.add_space_prefix = true;
  return s;
}

const sy::tokenizer& bpe() {
  static const sy::tokenizer t = sy::tokenizer::from_spec(bpe_spec());
  return t;
}
const sy::tokenizer& spm() {
  static const sy::tokenizer t = sy::tokenizer::from_spec(spm_spec());
  return t;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = uint8_t(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto cc = uint8_t(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

void encode_decode(const sy::tokenizer& tok, std::string_view text, bool exact) {
  for (const bool special : {false, true}) {
    const std::vector<sy::token_id> ids = tok.encode(text, {.add_special = special, .parse_special = special});
    for (const sy::token_id id : ids)
      if (id < 0 || size_t(id) >= tok.vocab_size()) std::abort();
    const std::string back = tok.decode(ids, special);
    if (exact && !special && valid_utf8(text) && back != text) std::abort();
  }
}

void decode_ids(std::string_view bytes) {
  std::vector<sy::token_id> ids(bytes.size() / 4);
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  for (const sy::tokenizer* tok : {&bpe(), &spm()}) {
    (void)tok->decode(ids, true);
    sy::stream_decoder d(*tok);
    std::string streamed;
    for (const sy::token_id id : ids) streamed += d.push(id);
    streamed += d.flush();
    if (!valid_utf8(streamed)) std::abort();
  }
}

// A worker's vocabulary: the first bytes pick the shape, the lines after them are the tokens.
void from_worker(std::string_view rest) {
  if (rest.size() < 4) return;
  static const char* const pres[] = {"default", "gpt2", "smollm", "llama3", "qwen2", "unknown"};
  proto::tokenizer_spec s;
  const auto b = [&](size_t i) { return uint8_t(rest[i]); };
  s.model = b(0) & 1 ? "gpt2" : "llama";
  s.pre = pres[(b(0) >> 1) % 6];
  s.add_bos = b(0) & 0x10;
  s.add_eos = b(0) & 0x20;
  s.add_space_prefix = b(0) & 0x40;
  s.bos_id = int8_t(b(1));
  s.eos_id = int8_t(b(2));
  s.unk_id = int8_t(b(3));
  size_t types = 4;  // token types are read from the front, one byte per token, until used up
  std::string_view lines = rest.substr(4);
  while (!lines.empty()) {
    const size_t nl = lines.find('\n');
    const std::string_view line = lines.substr(0, nl);
    if (line.find(' ') != std::string_view::npos && s.model == "gpt2") {
      s.merges.emplace_back(line);
    } else {
      s.tokens.emplace_back(line);
      s.token_types.push_back(types < rest.size() ? int8_t(b(types++)) % 8 : k_normal);
      s.scores.push_back(-float(s.tokens.size()));
    }
    if (nl == std::string_view::npos) break;
    lines.remove_prefix(nl + 1);
  }
  try {
    const sy::tokenizer tok = sy::tokenizer::from_spec(s);
    encode_decode(tok, rest, false);
    try {
      (void)sy::make_hf_tokenizer_files(s, tok, sy::chat_template::parse("chatml"), 2048);
    } catch (const std::exception&) {  // a vocabulary Hugging Face's format cannot express: not served
    }
  } catch (const std::runtime_error&) {  // refused: the router ignores that worker
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      encode_decode(bpe(), rest, true);
      break;
    case 1:
      encode_decode(spm(), rest, false);
      break;
    case 2:
      decode_ids(rest);
      break;
    default:
      from_worker(rest);
      break;
  }
  return 0;
}
