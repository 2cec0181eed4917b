// Reading a tokenizer's metadata from a GGUF file or a tokenizer_spec (see tokenizer_source.hpp).
#include "common/tokenizer/tokenizer_source.hpp"

#include <cctype>

#include "common/gguf.hpp"
#include "common/tokenizer/pre_tokenizer.hpp"
#include "common/wire/protocol.hpp"

#include <stdexcept>

namespace sy {

tokenizer_defaults defaults_for(std::string_view model, std::string_view pre) {
  if (model == "llama") return {true, true};
  if (model == "gpt2") {
    if (const auto spec = text::find_pre_tokenizer_spec(pre.empty() ? "default" : pre)) return {spec->add_bos, false};
  }
  return {};
}

tokenizer_source read_tokenizer_source(const gguf::file& f) {
  tokenizer_source s;
  s.model = f.get_string("tokenizer.ggml.model");
  if (f.find("tokenizer.ggml.pre")) s.pre = f.get_string("tokenizer.ggml.pre");
  s.tokens = f.get_strings("tokenizer.ggml.tokens");
  const size_t n_vocab = s.tokens.size();
  // Per-token arrays may be longer than the vocabulary (the rest is ignored), as in llama.cpp.
  auto per_token = [&](std::string_view key) -> const gguf::value* {
    const gguf::value* v = f.find(key);
    if (v != nullptr && (v->type != gguf::value_type::array || v->items.size() < n_vocab)) {
      throw std::runtime_error("tokenizer: " + std::string(key) + " must be an array of " + std::to_string(n_vocab) +
                               " numbers, one per token");
    }
    return v;
  };
  if (const gguf::value* v = per_token("tokenizer.ggml.token_type")) {
    for (size_t i = 0; i < n_vocab; ++i) s.token_types.push_back(v->items[i].as_int());
  }
  if (const gguf::value* v = per_token("tokenizer.ggml.scores")) {
    for (size_t i = 0; i < n_vocab; ++i) s.scores.push_back(static_cast<float>(v->items[i].as_float()));
  }
  s.has_merges = f.find("tokenizer.ggml.merges") != nullptr;
  if (s.has_merges) s.merges = f.get_strings("tokenizer.ggml.merges");
  // An id outside the vocabulary is an error for the ids encode and generation rely on; the
  // others are ignored, as llama.cpp ignores every one of them.
  auto id_key = [&](std::string_view key, bool required_valid, int64_t fallback = -1) -> int64_t {
    const uint64_t v = f.get_uint_or(key, UINT64_MAX);
    if (v == UINT64_MAX) return fallback;
    if (v >= n_vocab && required_valid) {
      throw std::runtime_error("tokenizer: " + std::string(key) + " = " + std::to_string(v) +
                               " is outside the vocabulary of " + std::to_string(n_vocab));
    }
    return v < n_vocab ? static_cast<int64_t>(v) : fallback;
  };
  s.bos = id_key("tokenizer.ggml.bos_token_id", true);
  s.eos = id_key("tokenizer.ggml.eos_token_id", true);
  s.unk = id_key("tokenizer.ggml.unknown_token_id", true);
  s.eot = id_key("tokenizer.ggml.eot_token_id", true);
  s.eom = id_key("tokenizer.ggml.eom_token_id", true);
  s.pad = id_key("tokenizer.ggml.padding_token_id", false);
  // The deprecated prefix/suffix/middle keys win over the fim_* ones, as llama.cpp reads them last.
  s.fim_pre = id_key("tokenizer.ggml.prefix_token_id", false, id_key("tokenizer.ggml.fim_pre_token_id", false));
  s.fim_suf = id_key("tokenizer.ggml.suffix_token_id", false, id_key("tokenizer.ggml.fim_suf_token_id", false));
  s.fim_mid = id_key("tokenizer.ggml.middle_token_id", false, id_key("tokenizer.ggml.fim_mid_token_id", false));
  s.fim_pad = id_key("tokenizer.ggml.fim_pad_token_id", false);
  s.fim_rep = id_key("tokenizer.ggml.fim_rep_token_id", false);
  s.fim_sep = id_key("tokenizer.ggml.fim_sep_token_id", false);
  if (f.find("tokenizer.ggml.add_bos_token")) s.add_bos = f.get_bool("tokenizer.ggml.add_bos_token");
  if (f.find("tokenizer.ggml.add_eos_token")) s.add_eos = f.get_bool("tokenizer.ggml.add_eos_token");
  if (f.find("tokenizer.ggml.add_space_prefix")) s.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix");
  if (const auto* n = f.find("general.name"); n && n->type == gguf::value_type::string) {
    std::string name(n->str);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    s.rstrip_specials = name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;
  }
  return s;
}

tokenizer_source read_tokenizer_source(const proto::tokenizer_spec& spec) {
  tokenizer_source s;
  s.model = spec.model;
  s.pre = spec.pre;
  s.tokens.assign(spec.tokens.begin(), spec.tokens.end());
  auto per_token = [&](const char* what, size_t n) {
    if (n != 0 && n != s.tokens.size()) {
      throw std::runtime_error(std::string("tokenizer: ") + what + " has " + std::to_string(n) + " entries for " +
                               std::to_string(s.tokens.size()) + " tokens");
    }
  };
  per_token("token_types", spec.token_types.size());
  per_token("scores", spec.scores.size());
  s.token_types.assign(spec.token_types.begin(), spec.token_types.end());
  s.scores = spec.scores;
  s.has_merges = !spec.merges.empty();
  s.merges.assign(spec.merges.begin(), spec.merges.end());
  auto id = [&](const char* what, int32_t v) -> int64_t {
    if (v < 0) return -1;
    if (static_cast<size_t>(v) >= s.tokens.size())
      throw std::runtime_error(std::string("tokenizer: ") + what + " id " + std::to_string(v) +
                               " is outside the vocabulary");
    return v;
  };
  s.bos = id("bos", spec.bos_id);
  s.eos = id("eos", spec.eos_id);
  s.unk = id("unk", spec.unk_id);
  s.pad = id("pad", spec.pad_id);
  s.eot = id("eot", spec.eot_id);
  s.eom = id("eom", spec.eom_id);
  s.fim_pre = id("fim_pre", spec.fim_pre_id);
  s.fim_suf = id("fim_suf", spec.fim_suf_id);
  s.fim_mid = id("fim_mid", spec.fim_mid_id);
  s.fim_pad = id("fim_pad", spec.fim_pad_id);
  s.fim_rep = id("fim_rep", spec.fim_rep_id);
  s.fim_sep = id("fim_sep", spec.fim_sep_id);
  s.add_bos = spec.add_bos;
  s.add_eos = spec.add_eos;
  s.add_space_prefix = spec.add_space_prefix;
  s.rstrip_specials = spec.rstrip_specials;
  return s;
}

proto::tokenizer_spec to_tokenizer_spec(const tokenizer_source& s) {
  proto::tokenizer_spec t;
  t.model = s.model;
  t.pre = s.pre;
  t.tokens.assign(s.tokens.begin(), s.tokens.end());
  for (const int64_t type : s.token_types) t.token_types.push_back(static_cast<int32_t>(type));
  t.scores = s.scores;
  t.merges.assign(s.merges.begin(), s.merges.end());
  t.bos_id = static_cast<int32_t>(s.bos);
  t.eos_id = static_cast<int32_t>(s.eos);
  t.unk_id = static_cast<int32_t>(s.unk);
  t.pad_id = static_cast<int32_t>(s.pad);
  t.eot_id = static_cast<int32_t>(s.eot);
  t.eom_id = static_cast<int32_t>(s.eom);
  t.fim_pre_id = static_cast<int32_t>(s.fim_pre);
  t.fim_suf_id = static_cast<int32_t>(s.fim_suf);
  t.fim_mid_id = static_cast<int32_t>(s.fim_mid);
  t.fim_pad_id = static_cast<int32_t>(s.fim_pad);
  t.fim_rep_id = static_cast<int32_t>(s.fim_rep);
  t.fim_sep_id = static_cast<int32_t>(s.fim_sep);
  const tokenizer_defaults d = defaults_for(s.model, s.pre);
  t.add_bos = s.add_bos.value_or(d.add_bos);
  t.add_eos = s.add_eos.value_or(false);
  t.add_space_prefix = s.add_space_prefix.value_or(d.add_space_prefix);
  t.rstrip_specials = s.rstrip_specials;
  return t;
}

}  // namespace sy
