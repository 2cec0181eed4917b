// `switchyard-worker export-tokenizer --model FILE --out DIR`: the Hugging Face tokenizer folder of
// a GGUF model (common/tokenizer/hf_tokenizer.hpp says what it holds and how it matches Switchyard's
// tokenization), written to disk; the router serves the same files from what workers send it.
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
