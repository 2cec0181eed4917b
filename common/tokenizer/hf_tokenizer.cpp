#include "common/tokenizer/hf_tokenizer.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_map>

#include "common/tokenizer/chat_template.hpp"
#include "common/tokenizer/pre_tokenizer.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "common/tokenizer/tokenizer_source.hpp"
#include "common/wire/protocol.hpp"

namespace sy {
namespace {

using ordered_json = nlohmann::ordered_json;

// GGUF token types (llama.cpp's llama_token_type).
constexpr int32_t k_unknown = 2, k_control = 3, k_user_defined = 4;

int32_t type_of(const proto::tokenizer_spec& s, size_t id) { return s.token_types.empty() ? 1 : s.token_types[id]; }

ordered_json added_token(const std::string& content, size_t id, bool special, bool rstrip) {
  return ordered_json{{"id", id},         {"content", content},  {"single_word", false}, {"lstrip", false},
                      {"rstrip", rstrip}, {"normalized", false}, {"special", special}};
}

// The vocabulary as the JSON object Hugging Face's BPE model reads (a text's first id wins, as in
// the tokenizer).
ordered_json vocab_of(const proto::tokenizer_spec& s) {
  ordered_json v = ordered_json::object();
  for (size_t i = 0; i < s.tokens.size(); ++i)
    if (!v.contains(s.tokens[i])) v[s.tokens[i]] = i;
  return v;
}

ordered_json bpe_merges(const proto::tokenizer_spec& s) {
  ordered_json m = ordered_json::array();
  for (const std::string& rule : s.merges) {
    const size_t sp = rule.find(' ', 1);
    if (sp == std::string::npos) continue;
    m.push_back({rule.substr(0, sp), rule.substr(sp + 1)});
  }
  return m;
}

size_t utf8_len(unsigned char b) {
  return b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
}

// Merges equivalent to SentencePiece's BPE: a pair of adjacent pieces merges when their
// concatenation is a piece, the highest-scoring piece first. Every split of a (normal or
// user-defined) piece into two pieces is a merge, ranked by the piece's score, then by its id.
ordered_json spm_merges(const proto::tokenizer_spec& s) {
  std::unordered_map<std::string, size_t> id_of;
  for (size_t i = 0; i < s.tokens.size(); ++i) id_of.emplace(s.tokens[i], i);
  struct merge {
    float score;
    size_t id;
    size_t split;
  };
  std::vector<merge> found;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const int32_t t = type_of(s, i);
    if (t != 1 && t != k_user_defined) continue;
    const std::string& piece = s.tokens[i];
    for (size_t at = utf8_len(static_cast<unsigned char>(piece[0])); at < piece.size();
         at += utf8_len(static_cast<unsigned char>(piece[at]))) {
      const auto l = id_of.find(piece.substr(0, at)), r = id_of.find(piece.substr(at));
      if (l == id_of.end() || r == id_of.end()) continue;
      found.push_back({s.scores.empty() ? 0.f : s.scores[i], i, at});
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const merge& a, const merge& b) { return a.score != b.score ? a.score > b.score : a.id < b.id; });
  ordered_json m = ordered_json::array();
  for (const merge& x : found) m.push_back({s.tokens[x.id].substr(0, x.split), s.tokens[x.id].substr(x.split)});
  return m;
}

ordered_json bos_post_processor(const proto::tokenizer_spec& s) {
  if (!s.add_bos || s.bos_id < 0) return nullptr;
  const std::string& bos = s.tokens[static_cast<size_t>(s.bos_id)];
  const ordered_json bos_item = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  return ordered_json{{"type", "TemplateProcessing"},
                      {"single", {bos_item, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                      {"pair",
                       {bos_item,
                        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                        bos_item,
                        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
                      {"special_tokens", {{bos, {{"id", bos}, {"ids", {s.bos_id}}, {"tokens", {bos}}}}}}};
}

ordered_json tokenizer_json(const proto::tokenizer_spec& s) {
  ordered_json added = ordered_json::array();
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const int32_t t = type_of(s, i);
    if (t == k_control || t == k_unknown || t == k_user_defined)
      added.push_back(
          added_token(s.tokens[i], i, t != k_user_defined, rstrips_after(s.rstrip_specials, t, s.tokens[i])));
  }
  ordered_json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  if (s.model == "gpt2") {
    const auto pre = text::find_pre_tokenizer_spec(s.pre.empty() ? "default" : s.pre);
    if (!pre) throw std::runtime_error("Hugging Face tokenizer: unsupported tokenizer.ggml.pre '" + s.pre + "'");
    ordered_json steps = ordered_json::array();
    for (const std::string_view re : pre->regexes)
      steps.push_back(
          {{"type", "Split"}, {"pattern", {{"Regex", std::string(re)}}}, {"behavior", "Isolated"}, {"invert", false}});
    steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", steps}};
    j["post_processor"] = bos_post_processor(s);
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    j["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", pre->ignore_merges},
                  {"vocab", vocab_of(s)},
                  {"merges", bpe_merges(s)}};
  } else if (s.model == "llama") {
    const std::string space = "\xE2\x96\x81";  // U+2581
    ordered_json norm = ordered_json::array();
    if (s.add_space_prefix) norm.push_back({{"type", "Prepend"}, {"prepend", space}});
    norm.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}});
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", norm}};
    j["pre_tokenizer"] = nullptr;
    j["post_processor"] = bos_post_processor(s);
    ordered_json dec = ordered_json::array();
    dec.push_back({{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}});
    dec.push_back({{"type", "ByteFallback"}});
    dec.push_back({{"type", "Fuse"}});
    if (s.add_space_prefix) dec.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    j["decoder"] = {{"type", "Sequence"}, {"decoders", dec}};
    j["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", s.unk_id >= 0 ? ordered_json(s.tokens[static_cast<size_t>(s.unk_id)]) : ordered_json()},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", true},
                  {"byte_fallback", true},
                  {"ignore_merges", false},
                  {"vocab", vocab_of(s)},
                  {"merges", spm_merges(s)}};
  } else {
    throw std::runtime_error("Hugging Face tokenizer: unsupported tokenizer.ggml.model '" + s.model + "'");
  }
  return j;
}

// As written to disk: one space of indent (diffable, still small), invalid UTF-8 replaced.
std::string text_of(const ordered_json& j) {
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

const std::string* hf_tokenizer_files::find(std::string_view name) const {
  if (name == k_hf_tokenizer_file_names[0]) return &tokenizer_json;
  if (name == k_hf_tokenizer_file_names[1]) return &tokenizer_config_json;
  if (name == k_hf_tokenizer_file_names[2]) return &generation_config_json;
  return nullptr;
}

hf_tokenizer_files make_hf_tokenizer_files(const proto::tokenizer_spec& s, const tokenizer& tok,
                                           const chat_template& tmpl, int64_t max_context) {
  hf_tokenizer_files files;
  files.tokenizer_json = text_of(tokenizer_json(s));

  auto text = [&](int32_t id) { return id >= 0 ? ordered_json(s.tokens[static_cast<size_t>(id)]) : ordered_json(); };
  ordered_json decoder = ordered_json::object();
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const int32_t t = type_of(s, i);
    if (t == k_control || t == k_unknown || t == k_user_defined) {
      ordered_json a =
          added_token(s.tokens[i], i, t != k_user_defined, rstrips_after(s.rstrip_specials, t, s.tokens[i]));
      a.erase("id");
      decoder[std::to_string(i)] = a;
    }
  }
  ordered_json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                         {"add_bos_token", s.add_bos},
                         {"add_eos_token", s.add_eos},
                         {"bos_token", text(s.bos_id)},
                         {"eos_token", text(s.eos_id)},
                         {"unk_token", text(s.unk_id)},
                         {"pad_token", text(s.pad_id)},
                         {"model_max_length", max_context},
                         {"clean_up_tokenization_spaces", false},
                         {"added_tokens_decoder", decoder}};
  if (tmpl.supported()) config["chat_template"] = tmpl.to_jinja(s.add_bos && s.bos_id >= 0);
  files.tokenizer_config_json = text_of(config);

  ordered_json eog = ordered_json::array();
  for (size_t i = 0; i < s.tokens.size(); ++i)
    if (tok.is_eog(static_cast<token_id>(i))) eog.push_back(i);
  ordered_json gen = {{"bos_token_id", s.bos_id >= 0 ? ordered_json(s.bos_id) : ordered_json()},
                      {"eos_token_id", eog},
                      {"pad_token_id", s.pad_id >= 0 ? ordered_json(s.pad_id) : ordered_json()}};
  files.generation_config_json = text_of(gen);
  return files;
}

}  // namespace sy
