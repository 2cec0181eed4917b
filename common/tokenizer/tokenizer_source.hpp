// What a tokenizer is built from (common/tokenizer/tokenizer.hpp), read from either container it comes in:
// a GGUF file's tokenizer.ggml.* metadata on the worker, or the proto::tokenizer_spec the worker
// sends a router in `welcome`. Reading checks shapes and ids and throws std::runtime_error naming
// the key or field; whether the tokenizer model and pre-tokenizer are supported is for the
// tokenizer to decide.
#pragma once

#include <cstdint>
#include <optional>
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

// Ids are -1 when absent. The string views view the container read, which must outlive the source.
struct tokenizer_source {
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre; empty: "default"
  std::vector<std::string_view> tokens;
  std::vector<int64_t> token_types;  // empty: all normal
  std::vector<float> scores;         // empty: all 0
  bool has_merges = false;
  std::vector<std::string_view> merges;
  int64_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;
  int64_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  std::optional<bool> add_bos, add_eos, add_space_prefix;  // unset: the tokenizer model's default
  // llama.cpp's Phi-3 rule, by general.name ("phi-3" or "phi3" in it, any case): whitespace right
  // after a special token is dropped when the text is split (the tokens' rstrip attribute).
  bool rstrip_specials = false;
};

// Whether whitespace after token `text` of GGUF type `type` is dropped, given rstrip_specials:
// every control, user-defined and unknown token and "</s>", except "<unk>", "<s>" and
// "<|endoftext|>" (llama.cpp's list).
bool rstrips_after(bool rstrip_specials, int64_t type, std::string_view text);

// Defaults of keys a model may leave out, as llama.cpp sets them per tokenizer model.
struct tokenizer_defaults {
  bool add_bos = false;           // tokenizer.ggml.add_bos_token
  bool add_space_prefix = false;  // tokenizer.ggml.add_space_prefix
};

// The defaults for a tokenizer.ggml.model and tokenizer.ggml.pre (empty: "default"); all false
// for a model or pre-tokenizer that is not supported.
tokenizer_defaults defaults_for(std::string_view model, std::string_view pre);

// From GGUF metadata. Per-token arrays may be longer than the vocabulary (the rest is ignored);
// an id outside the vocabulary is an error for BOS, EOS, UNK, EOT and EOM, and ignored for the
// others, as in llama.cpp.
tokenizer_source read_tokenizer_source(const gguf::file& f);
// From a worker's spec: per-token arrays are empty or one per token, every id is -1 or a token.
tokenizer_source read_tokenizer_source(const proto::tokenizer_spec& spec);
// The spec fields (all but chat_template) with the tokenizer model's defaults applied.
proto::tokenizer_spec to_tokenizer_spec(const tokenizer_source& s);

}  // namespace sy
