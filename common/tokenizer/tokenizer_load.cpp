// Building a tokenizer: the vocabulary, merges or scores, byte tokens and llama.cpp's
// text-based token rules, from what common/tokenizer/tokenizer_source.hpp reads out of GGUF metadata or a
// worker's `welcome`.
#include "common/tokenizer/tokenizer_impl.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

#include "common/tokenizer/tokenizer_source.hpp"
#include "common/wire/protocol.hpp"

namespace sy {

using namespace tokenizer_detail;
using text::append_utf8;
using text::byte_map;
using text::bytes_unicode;
using text::unmap_bytes;

namespace {

// llama.cpp's text-based token rules (llama_vocab::impl::load). Fill-in-the-middle tokens the
// metadata does not declare are found by these texts and made CONTROL; the pad, repo and file
// separator ones end generation. (Where a vocabulary has two candidates for one role, both are
// taken; llama.cpp takes one, in hash-map order.)
constexpr std::string_view k_fim_pre_texts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",    "<｜fim▁begin｜>",
                                                "<PRE>",          "▁<PRE>",       "<|code_prefix|>", "<|prefix|>"};
constexpr std::string_view k_fim_suf_texts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",    "<｜fim▁hole｜>",
                                                "<SUF>",          "▁<SUF>",       "<|code_suffix|>", "<|suffix|>"};
constexpr std::string_view k_fim_mid_texts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",    "<｜fim▁end｜>",
                                                "<MID>",          "▁<MID>",       "<|code_middle|>", "<|middle|>"};
constexpr std::string_view k_fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr std::string_view k_fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
constexpr std::string_view k_fim_sep_texts[] = {"<|file_sep|>"};
// Turn and text terminators: end of generation and CONTROL whatever their declared type.
constexpr std::string_view k_eog_texts[] = {"<|eot_id|>",
                                            "<|im_end|>",
                                            "<|end|>",
                                            "<|return|>",
                                            "<|call|>",
                                            "<|flush|>",
                                            "<|calls|>",
                                            "<end_of_turn>",
                                            "<|endoftext|>",
                                            "</s>",
                                            "<|eom_id|>",
                                            "<EOT>",
                                            "_<EOT>",
                                            "[EOT]",
                                            "[EOS]",
                                            "<|end_of_text|>",
                                            "<end_of_utterance>",
                                            "<eos>",
                                            "<turn|>",
                                            "<|tool_response>",
                                            "<｜end▁of▁sentence｜>",
                                            "[e~["};
// Always rendered (gpt-oss): made USER_DEFINED.
constexpr std::string_view k_user_defined_texts[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};

}  // namespace

tokenizer tokenizer::from_gguf(const gguf::file& f) { return build(read_tokenizer_source(f)); }

tokenizer tokenizer::from_spec(const proto::tokenizer_spec& spec) { return build(read_tokenizer_source(spec)); }

proto::tokenizer_spec tokenizer::spec_from_gguf(const gguf::file& f) {
  return to_tokenizer_spec(read_tokenizer_source(f));
}

void tokenizer::impl::index_merges(std::span<const std::string_view> merges) {
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string_view m = merges[r];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string_view::npos) continue;
    const std::string_view a = m.substr(0, sp), b = m.substr(sp + 1);
    const auto ia = id_of_.find(a), ib = id_of_.find(b);
    std::string joined;
    joined.reserve(m.size() - 1);
    joined.append(a).append(b);
    const auto ij = id_of_.find(joined);
    // A rule whose parts or result are not tokens can never fire on token symbols; skip it.
    if (ia == id_of_.end() || ib == id_of_.end() || ij == id_of_.end()) continue;
    merges_.emplace(pair_key(ia->second, ib->second),
                    merge_rule{static_cast<int32_t>(r), ij->second});  // first rank wins
  }
}

// A byte's own token: the byte's GPT-2 character for BPE; for SentencePiece "<0xXX>", else the
// byte as a one-character token.
void tokenizer::impl::find_byte_tokens() {
  const byte_map& bm = bytes_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string key;
    if (spm_) {
      static constexpr char k_hex[] = "0123456789ABCDEF";
      key = {'<', '0', 'x', k_hex[b >> 4], k_hex[b & 15], '>'};
      if (!id_of_.contains(key)) key = std::string(1, static_cast<char>(b));
    } else {
      append_utf8(key, bm.byte_to_cp[b]);
    }
    const auto it = id_of_.find(key);
    byte_token_[b] = it != id_of_.end() ? it->second : -1;
  }
}

// End of generation and the kind overrides, in llama.cpp's order (llama_vocab::impl::load).
void tokenizer::impl::apply_token_rules(const tokenizer_source& s) {
  eog_.assign(text_.size(), 0);
  auto for_texts = [&](std::span<const std::string_view> texts, auto&& fn) {
    for (const std::string_view t : texts) {
      if (const auto it = id_of_.find(t); it != id_of_.end()) fn(it->second);
    }
  };
  struct fim_role {
    int64_t declared;  // id from the metadata, or -1: found by its texts
    std::span<const std::string_view> texts;
    bool ends_generation;
  };
  const fim_role fim_roles[] = {{s.fim_pre, k_fim_pre_texts, false}, {s.fim_suf, k_fim_suf_texts, false},
                                {s.fim_mid, k_fim_mid_texts, false}, {s.fim_pad, k_fim_pad_texts, true},
                                {s.fim_rep, k_fim_rep_texts, true},  {s.fim_sep, k_fim_sep_texts, true}};
  for (const fim_role& r : fim_roles) {
    if (r.declared >= 0) {
      if (r.ends_generation) eog_[r.declared] = 1;
      continue;
    }
    for_texts(r.texts, [&](token_id id) {
      kind_[id] = kind_control;
      if (r.ends_generation) eog_[id] = 1;
    });
  }
  for_texts(k_eog_texts, [&](token_id id) {
    kind_[id] = kind_control;
    eog_[id] = 1;
  });
  for_texts(k_user_defined_texts, [&](token_id id) { kind_[id] = kind_user_defined; });
  for (const int64_t id : {s.eos, s.eot, s.eom}) {
    if (id >= 0) eog_[id] = 1;
  }

  auto eog_text = [&](std::string_view t) -> token_id {
    const auto it = id_of_.find(t);
    return it != id_of_.end() && eog_[it->second] ? it->second : -1;
  };
  // Harmony-style vocabularies end a turn with <|return|> / <|call|>: there <|end|> is text.
  const bool has_call = eog_text("<|call|>") >= 0 || eog_text("<|calls|>") >= 0;
  if (const token_id end = eog_text("<|end|>");
      end >= 0 && has_call && (eog_text("<|return|>") >= 0 || eog_text("<|flush|>") >= 0)) {
    eog_[end] = 0;
    kind_[end] = kind_user_defined;
  }
  // Gemma 4 and PLaMo 2 use </s> as a normal token.
  if (const token_id es = eog_text("</s>");
      es >= 0 && (eog_text("<|tool_response>") >= 0 || eog_text("<|plamo:eos|>") >= 0)) {
    eog_[es] = 0;
    kind_[es] = kind_normal;
  }
}

bool rstrips_after(bool rstrip_specials, int64_t type, std::string_view text) {
  if (!rstrip_specials || text == "<unk>" || text == "<s>" || text == "<|endoftext|>") return false;
  return type == kind_unknown || type == kind_control || type == kind_user_defined || text == "</s>";
}

tokenizer tokenizer::build(const tokenizer_source& s) {
  auto p = std::make_unique<impl>();
  p->model_ = s.model;
  p->spm_ = s.model == "llama";
  if (!p->spm_ && s.model != "gpt2") {
    throw std::runtime_error("tokenizer: unsupported tokenizer.ggml.model '" + s.model +
                             "' (implemented: 'gpt2' byte-level BPE, 'llama' SentencePiece)");
  }
  // llama.cpp ignores tokenizer.ggml.pre for SentencePiece vocabularies.
  p->pre_ = s.pre.empty() ? "default" : s.pre;
  if (!p->spm_) {
    p->pre_tokenizer_ = text::pre_tokenizer::from_name(p->pre_);
    if (!p->pre_tokenizer_) {
      throw std::runtime_error("tokenizer: unsupported tokenizer.ggml.pre '" + p->pre_ + "'");
    }
  }

  const std::vector<std::string_view>& tokens = s.tokens;
  if (tokens.empty()) throw std::runtime_error("tokenizer: tokenizer.ggml.tokens is empty");
  const size_t n_vocab = tokens.size();
  p->text_.reserve(n_vocab);
  p->id_of_.reserve(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) {
    // llama.cpp renames empty entries so that every text is distinct and non-empty.
    p->text_.emplace_back(tokens[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : std::string(tokens[i]));
    p->id_of_.emplace(p->text_.back(), static_cast<token_id>(i));  // first id wins on duplicates
  }

  p->kind_.assign(n_vocab, kind_normal);
  if (!s.token_types.empty()) {
    for (size_t i = 0; i < n_vocab; ++i) {
      const int64_t t = s.token_types[i];
      p->kind_[i] = t >= kind_undefined && t <= kind_byte ? static_cast<uint8_t>(t) : uint8_t{kind_undefined};
    }
  }

  if (p->spm_) {
    p->score_.assign(n_vocab, 0.f);
    for (size_t i = 0; i < s.scores.size(); ++i) {
      if (std::isnan(s.scores[i])) {
        throw std::runtime_error("tokenizer: tokenizer.ggml.scores[" + std::to_string(i) + "] is not a number");
      }
      p->score_[i] = s.scores[i];
    }
  } else {
    if (!s.has_merges) throw std::runtime_error("tokenizer: missing required key tokenizer.ggml.merges");
    p->index_merges(s.merges);
  }

  p->find_byte_tokens();

  p->bos_ = static_cast<token_id>(s.bos);
  p->eos_ = static_cast<token_id>(s.eos);
  p->unk_ = static_cast<token_id>(s.unk);
  const tokenizer_defaults d = defaults_for(s.model, p->pre_);
  p->add_bos_ = s.add_bos.value_or(d.add_bos) && p->bos_ >= 0;
  p->add_eos_ = s.add_eos.value_or(false) && p->eos_ >= 0;
  p->add_space_prefix_ = s.add_space_prefix.value_or(d.add_space_prefix);

  p->apply_token_rules(s);

  p->bytes_.resize(n_vocab);
  if (s.rstrip_specials) p->rstrip_.assign(n_vocab, 0);
  for (size_t i = 0; i < n_vocab; ++i) {
    const std::string& t = p->text_[i];
    switch (p->kind_[i]) {
      case kind_normal:
        p->bytes_[i] = p->spm_ ? spm_unescape(t) : unmap_bytes(t);
        break;
      case kind_control:
      case kind_unknown:
      case kind_user_defined:
        p->bytes_[i] = t;
        break;
      case kind_byte:
        if (const int b = hex_byte(t); b >= 0) {  // "<0xAB>", SentencePiece style
          p->bytes_[i] = std::string(1, static_cast<char>(b));
        } else {
          p->bytes_[i] = p->spm_ ? t : unmap_bytes(t);
        }
        break;
      default:  // unused / undefined tokens render as nothing, as in llama.cpp
        break;
    }
    if (p->kind_[i] == kind_control || p->kind_[i] == kind_user_defined || p->kind_[i] == kind_unknown) {
      p->special_.push_back(static_cast<token_id>(i));
    }
    if (s.rstrip_specials) p->rstrip_[i] = rstrips_after(true, p->kind_[i], p->text_[i]);
  }
  std::stable_sort(p->special_.begin(), p->special_.end(),
                   [&](token_id a, token_id b) { return p->text_[a].size() > p->text_[b].size(); });

  return tokenizer(std::move(p));
}

}  // namespace sy
