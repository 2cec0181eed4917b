// A tiny byte-level BPE tokenizer built in memory, as a worker's welcome carries one
// (proto::tokenizer_spec), for router tests that need a tokenizer but no model: the router builds
// its model entry from whatever spec a worker sends (tokenizer::from_spec, chat_template::parse),
// so these tests run on a fresh clone, before the model file is downloaded (docs/testing.md,
// "Models the tests need").
//
// It has SmolLM2's shape: tokenizer model "gpt2" with the "smollm" pre-tokenizer, the three
// control tokens <|endoftext|> (0, unknown), <|im_start|> (1, BOS) and <|im_end|> (2, EOS and
// padding), then one token per byte (GPT-2's byte-to-character map), so every text encodes, then
// a few merges for the words the tests send ("The quick brown fox", "Hello", "Hi") so that BPE
// merging is exercised too; its chat template is ChatML. Its ids are its own: a test that needs
// an id or a count takes it from encode(), never from a number written down.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "common/wire/protocol.hpp"

namespace sy::test {

namespace tiny_vocab_detail {

constexpr int32_t k_normal = 1, k_control = 3;  // GGUF token types

inline void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else {  // the map's characters are below U+0800
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
}

inline bool printable(uint32_t b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

// GPT-2's byte-to-character map: printable bytes stand for themselves, the rest for U+0100 on
// (the space is U+0120, "Ġ").
inline std::string byte_char(uint8_t b) {
  uint32_t cp = b;
  if (!printable(b)) {
    uint32_t n = 0;
    for (uint32_t c = 0; c < b; ++c)
      if (!printable(c)) ++n;
    cp = 0x100 + n;
  }
  std::string s;
  append_utf8(s, cp);
  return s;
}

inline void add_token(proto::tokenizer_spec& s, std::string text, int32_t type) {
  s.tokens.push_back(std::move(text));
  s.token_types.push_back(type);
}

// The merge "left right" (next in priority) and its result as a token.
inline void add_merge(proto::tokenizer_spec& s, const std::string& left, const std::string& right) {
  s.merges.push_back(left + " " + right);
  add_token(s, left + right, k_normal);
}

inline proto::tokenizer_spec build() {
  proto::tokenizer_spec s;
  s.model = "gpt2";
  s.pre = "smollm";
  add_token(s, "<|endoftext|>", k_control);
  add_token(s, "<|im_start|>", k_control);
  add_token(s, "<|im_end|>", k_control);
  for (int b = 0; b < 256; ++b) add_token(s, byte_char(uint8_t(b)), k_normal);
  const std::string sp = byte_char(' ');
  // Each result is a new token; a merge may use the results of merges listed before it.
  const std::pair<std::string, std::string> merges[] = {
      {"T", "h"},       {"Th", "e"}, {"q", "u"},       {"c", "k"},   {"i", "ck"},        {sp, "qu"}, {sp + "qu", "ick"},
      {"r", "o"},       {sp, "b"},   {sp + "b", "ro"}, {"w", "n"},   {sp + "bro", "wn"}, {sp, "f"},  {"o", "x"},
      {sp + "f", "ox"}, {"l", "l"},  {"H", "e"},       {"He", "ll"}, {"Hell", "o"},      {"H", "i"}};
  for (const auto& [left, right] : merges) add_merge(s, left, right);
  s.unk_id = 0;
  s.bos_id = 1;
  s.eos_id = 2;
  s.pad_id = 2;
  s.add_bos = false;  // the "smollm" pre-tokenizer's default, as the worker sends it
  s.chat_template = "chatml";
  return s;
}

}  // namespace tiny_vocab_detail

// The tiny vocabulary, built once.
inline const proto::tokenizer_spec& tiny_vocab() {
  static const proto::tokenizer_spec spec = tiny_vocab_detail::build();
  return spec;
}

}  // namespace sy::test
