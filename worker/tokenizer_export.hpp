// A Hugging Face tokenizer folder made from a GGUF model's tokenizer metadata, so that clients that
// count tokens with `transformers` (benchmark tools such as aiperf and guidellm, `--tokenizer DIR`)
// run offline against the cluster: `switchyard-worker export-tokenizer --model FILE --out DIR`.
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

namespace sy {

namespace gguf {
class file;
}
struct chat_template;

// Writes DIR/tokenizer.json, DIR/tokenizer_config.json and DIR/generation_config.json (DIR is
// created). `tmpl` is the template the worker serves (the model's, or --chat-template's); an
// unsupported one is left out of tokenizer_config.json. Throws std::runtime_error on unusable
// metadata or an unwritable folder.
void export_hf_tokenizer(const gguf::file& f, const chat_template& tmpl, int64_t max_context, const std::string& dir);

}  // namespace sy
