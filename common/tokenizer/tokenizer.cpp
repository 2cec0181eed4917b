// Byte-level BPE (GPT-2 family) and SentencePiece (Llama 2 / Mistral family) tokenizers that
// reproduce llama.cpp's llama_tokenize and llama_token_to_piece.
//
// Pipeline of encode():
//   1. special-token partition: the text is cut at occurrences of control / user-defined /
//      unknown token texts (control and unknown ones only when parsing specials), longest texts
//      first, each token over every remaining raw fragment (the order llama.cpp uses, so
//      overlapping candidates resolve the same way);
//   2. BPE: each raw fragment is made valid UTF-8 (invalid bytes -> U+FFFD, as llama.cpp does)
//      and split into pieces by the pre-tokenizer (common/tokenizer/pre_tokenizer.hpp: a regex list,
//      applied in sequence: every regex splits each piece of the previous stage into its matches
//      and the gaps between them); each piece is merged bottom-up by BPE rank starting from one
//      symbol per byte (a byte's symbol is the token whose text is the byte's GPT-2
//      bytes_to_unicode character);
//   2'. SentencePiece: a raw fragment at the start of the text or right after a special token
//      gets a leading space (add_space_prefix), spaces become U+2581, and the fragment is merged
//      by token score (spm_fragment).
//
// Files: this one (special-token split, encode, decode, accessors), tokenizer_bpe.cpp (2),
// tokenizer_spm.cpp (2'), tokenizer_load.cpp (building the vocabulary from the metadata that
// common/tokenizer/tokenizer_source.hpp reads), stream_decoder.cpp (token ids to text, incrementally);
// common/tokenizer/tokenizer_impl.hpp holds the state they share.
#include "common/tokenizer/tokenizer_impl.hpp"

#include <cctype>
#include <memory>
#include <utility>

namespace sy {

using namespace tokenizer_detail;

// ---------------------------------------------------------------------------------------------
// Special tokens, then the model's tokenizer on the text between them

void tokenizer::impl::split_special(std::string_view text, bool parse_special, std::vector<token_id>& out) const {
  // A fragment is either raw text [begin, begin + size) or a special token (id >= 0).
  struct fragment {
    token_id id;
    size_t begin, size;
  };
  std::vector<fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  std::vector<fragment> next;
  for (const token_id sid : special_) {
    if (!parse_special && kind_[sid] != kind_user_defined) continue;
    const std::string& st = text_[sid];
    if (st.empty() || text.find(st) == std::string_view::npos) continue;
    next.clear();
    for (const fragment& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      const size_t end = f.begin + f.size;
      while (pos < end) {
        const size_t hit = text.substr(0, end).find(st, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({-1, pos, hit - pos});
        next.push_back({sid, hit, st.size()});
        pos = hit + st.size();
        if (!rstrip_.empty() && rstrip_[sid])  // llama.cpp: the right remainder's leading whitespace
          while (pos < end && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
      }
      if (pos < end) next.push_back({-1, pos, end - pos});
    }
    frags.swap(next);
  }
  bool after_special = true;  // the start of the text counts as following a special token
  for (const fragment& f : frags) {
    if (f.id >= 0) {
      out.push_back(f.id);
      after_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.begin, f.size);
    if (spm_) {
      spm_fragment(raw, add_space_prefix_ && after_special, out);
    } else {
      bpe_fragment(raw, out);
    }
    after_special = false;
  }
}

// ---------------------------------------------------------------------------------------------
// tokenizer

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

std::vector<token_id> tokenizer::encode(std::string_view text, encode_options opt) const {
  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 4);
  if (opt.add_special && impl_->add_bos_) out.push_back(impl_->bos_);
  impl_->split_special(text, opt.parse_special, out);
  if (opt.add_special && impl_->add_eos_) out.push_back(impl_->eos_);
  return out;
}

std::string tokenizer::token_bytes(token_id id, bool render_special) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->bytes_.size()) return {};
  const uint8_t k = impl_->kind_[id];
  if (!render_special && (k == kind_control || k == kind_unknown)) return {};
  return impl_->bytes_[id];
}

std::string tokenizer::decode(std::span<const token_id> ids, bool render_special) const {
  std::string out;
  for (const token_id id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->bytes_.size()) continue;
    const uint8_t k = impl_->kind_[id];
    if (!render_special && (k == kind_control || k == kind_unknown)) continue;
    out += impl_->bytes_[id];
  }
  return out;
}

size_t tokenizer::vocab_size() const { return impl_->text_.size(); }
const std::string& tokenizer::model() const { return impl_->model_; }
bool tokenizer::add_eos() const { return impl_->add_eos_; }
bool tokenizer::add_space_prefix() const { return impl_->add_space_prefix_; }
token_id tokenizer::bos() const { return impl_->bos_; }
token_id tokenizer::eos() const { return impl_->eos_; }
bool tokenizer::add_bos() const { return impl_->add_bos_; }

bool tokenizer::is_eog(token_id id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->eog_.size() && impl_->eog_[id] != 0;
}

bool tokenizer::is_control(token_id id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->kind_.size() && impl_->kind_[id] == kind_control;
}

token_id tokenizer::find(std::string_view text) const {
  const auto it = impl_->id_of_.find(text);
  return it != impl_->id_of_.end() ? it->second : -1;
}

const std::string& tokenizer::pre_tokenizer() const { return impl_->pre_; }

}  // namespace sy
