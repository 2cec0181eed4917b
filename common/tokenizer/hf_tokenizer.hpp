// A Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json, generation_config.json)
// made from a model's tokenizer as GGUF describes it, so that clients that count tokens with
// `transformers` (benchmark tools such as aiperf and guidellm, `--tokenizer DIR`) run offline
// against the cluster. One definition, two users: `switchyard-worker export-tokenizer` writes the
// files from the model file; the router serves them (GET /v1/models/{id}/tokenizer/{file}) from
// the tokenizer spec workers send in `welcome`.
//
// tokenizer.json reproduces Switchyard's (and llama.cpp's) tokenization: byte-level BPE as a
// `Split` per pre-tokenizer regex (the same regexes, in the same order) then `ByteLevel`, the
// GGUF's vocabulary and merges (`ignore_merges` for Llama 3); SentencePiece vocabularies as a BPE
// model with byte fallback over merges derived from the piece scores (every split of a piece into
// two pieces, ranked by the piece's score), with the leading-space normalizer. Special tokens are
// `added_tokens`. tokenizer_config.json carries the special tokens and a Jinja chat template that
// renders what the router renders (chat_template::to_jinja); generation_config.json the BOS and
// every end-of-generation id.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sy {

namespace proto {
struct tokenizer_spec;
}
class tokenizer;
struct chat_template;

struct hf_tokenizer_files {
  std::string tokenizer_json;  // each a complete JSON document, newline-terminated
  std::string tokenizer_config_json;
  std::string generation_config_json;

  // The contents of `name` ("tokenizer.json", ...), or nullptr for any other name.
  const std::string* find(std::string_view name) const;
};

inline constexpr std::string_view k_hf_tokenizer_file_names[] = {"tokenizer.json", "tokenizer_config.json",
                                                                 "generation_config.json"};

// `spec` and `tok` describe the same tokenizer (tok = tokenizer::from_spec(spec)); `tmpl` is the
// template served (the model's, or --chat-template's): an unsupported one is left out of
// tokenizer_config.json. `max_context` becomes model_max_length. Throws std::runtime_error on a
// tokenizer model or pre-tokenizer it cannot express.
hf_tokenizer_files make_hf_tokenizer_files(const proto::tokenizer_spec& spec, const tokenizer& tok,
                                           const chat_template& tmpl, int64_t max_context);

}  // namespace sy
