// Byte-level BPE (GPT-2 family) and SentencePiece (Llama 2 / Mistral family) tokenizers that
// reproduce llama.cpp's llama_tokenize and llama_token_to_piece.
//
// Pipeline of encode():
//   1. special-token partition: the text is cut at occurrences of control / user-defined /
//      unknown token texts (control and unknown ones only when parsing specials), longest texts
//      first, each token over every remaining raw fragment (the order llama.cpp uses, so
//      overlapping candidates resolve the same way);
//   2. BPE: each raw fragment is made valid UTF-8 (invalid bytes -> U+FFFD, as llama.cpp does)
//      and split into pieces by the pre-tokenizer (common/pre_tokenizer.hpp: a regex list,
//      applied in sequence: every regex splits each piece of the previous stage into its matches
//      and the gaps between them); each piece is merged bottom-up by BPE rank starting from one
//      symbol per byte (a byte's symbol is the token whose text is the byte's GPT-2
//      bytes_to_unicode character);
//   2'. SentencePiece: a raw fragment at the start of the text or right after a special token
//      gets a leading space (add_space_prefix), spaces become U+2581, and the fragment is merged
//      by token score (spm_fragment).
//
// The metadata a tokenizer is built from is read by common/tokenizer_source.hpp; build() turns it
// into the vocabulary, applying llama.cpp's text-based token rules.
#include "common/tokenizer.hpp"

#include "common/pre_tokenizer.hpp"
#include "common/protocol.hpp"
#include "common/tokenizer_source.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace sy {

using text::append_utf8;
using text::byte_map;
using text::bytes_unicode;
using text::k_replacement;
using text::unmap_bytes;
using text::utf8_read;
using text::utf8_sanitize;
using text::utf8_step;
using text::utf8_valid;

namespace {

// Token types as stored in tokenizer.ggml.token_type (llama.cpp's llama_token_type).
enum token_kind : uint8_t {
  kind_undefined = 0,
  kind_normal = 1,
  kind_unknown = 2,
  kind_control = 3,
  kind_user_defined = 4,
  kind_unused = 5,
  kind_byte = 6,
};

// ---------------------------------------------------------------------------------------------
// BPE

struct merge_rule {
  int32_t rank;     // position in tokenizer.ggml.merges; lower merges first
  token_id result;  // token of the concatenation
};

uint64_t pair_key(token_id a, token_id b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct string_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

struct tokenizer::impl {
  std::vector<std::string> text_;   // token text as stored (byte-mapped / U+2581-escaped for normal tokens)
  std::vector<std::string> bytes_;  // what the token decodes to (see token_bytes)
  std::vector<uint8_t> kind_;       // token_kind per id, after llama.cpp's text-based overrides
  std::vector<uint8_t> eog_;        // 1 for end-of-generation tokens
  std::vector<float> score_;        // SentencePiece: merge priority per id (higher first); else empty
  std::unordered_map<std::string, token_id, string_hash, std::equal_to<>> id_of_;
  std::unordered_map<uint64_t, merge_rule> merges_;   // BPE: pair_key(left, right) -> rule
  std::array<token_id, 256> byte_token_{};            // token of each single byte; -1 if none
  std::vector<token_id> special_;                     // control/user-defined/unknown ids, longest text first
  std::optional<text::pre_tokenizer> pre_tokenizer_;  // BPE only: cuts raw text into pieces
  std::string model_;                                 // tokenizer.ggml.model
  std::string pre_;
  bool spm_ = false;  // SentencePiece ("llama"), else byte-level BPE ("gpt2")
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  token_id bos_ = -1, eos_ = -1, unk_ = -1;

  void split_special(std::string_view text, bool parse_special, std::vector<token_id>& out) const;
  void bpe_fragment(std::string_view text, std::vector<token_id>& out) const;
  void bpe_piece(std::string_view piece, std::vector<token_id>& out) const;
  void spm_fragment(std::string_view text, bool space_prefix, std::vector<token_id>& out) const;
  // The byte tokens of a symbol that is no token (unk, or nothing, for a byte that has none).
  void push_bytes(std::string_view bytes, std::vector<token_id>& out) const;
  // Steps of build(), each needing text_ and id_of_: merges_ (BPE), byte_token_, and eog_
  // with kind_ adjusted by llama.cpp's text-based rules.
  void index_merges(std::span<const std::string_view> merges);
  void find_byte_tokens();
  void apply_token_rules(const tokenizer_source& s);
};

namespace {

// Scratch state of one BPE merge pass; symbols form a doubly linked list over the piece.
struct bpe_symbol {
  token_id id;
  int32_t prev, next;  // indices into the symbol vector, -1 at the ends
};

struct bpe_candidate {
  int32_t rank;
  int32_t left, right;         // symbol indices
  token_id left_id, right_id;  // the symbols' ids when queued: a changed symbol makes it stale
  token_id result;
  bool operator>(const bpe_candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};

}  // namespace

void tokenizer::impl::bpe_piece(std::string_view piece, std::vector<token_id>& out) const {
  if (pre_tokenizer_->ignore_merges()) {
    const byte_map& m = bytes_unicode();
    std::string mapped;
    for (const unsigned char b : piece) append_utf8(mapped, m.byte_to_cp[b]);
    if (const auto it = id_of_.find(mapped); it != id_of_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1) {
    const token_id id = byte_token_[static_cast<unsigned char>(piece[0])];
    if (id >= 0 || unk_ >= 0) out.push_back(id >= 0 ? id : unk_);
    return;
  }

  // Reused between calls on this thread; both are cleared before use.
  thread_local std::vector<bpe_symbol> symbols;
  thread_local std::vector<bpe_candidate> heap;  // min-heap on (rank, left)
  symbols.clear();
  heap.clear();

  const int32_t n = static_cast<int32_t>(piece.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols.push_back({byte_token_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1});
  }
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const token_id a = symbols[left].id, b = symbols[right].id;
    if (a < 0 || b < 0) return;
    const auto it = merges_.find(pair_key(a, b));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, right, a, b, it->second.result});
    std::push_heap(heap.begin(), heap.end(), std::greater<>{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const bpe_candidate c = heap.back();
    heap.pop_back();
    bpe_symbol& l = symbols[c.left];
    bpe_symbol& r = symbols[c.right];
    // Stale when either side was absorbed (id -2) or has grown since the pair was queued.
    if (l.id != c.left_id || r.id != c.right_id || l.next != c.right) continue;
    l.id = c.result;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = c.left;
    r.id = -2;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }

  for (int32_t i = 0; i >= 0 && i < n; i = symbols[i].next) {
    const token_id id = symbols[i].id;
    if (id >= 0) {
      out.push_back(id);
    } else if (unk_ >= 0) {
      out.push_back(unk_);  // a byte the vocabulary has no token for
    }
  }
}

void tokenizer::impl::bpe_fragment(std::string_view raw, std::vector<token_id>& out) const {
  if (raw.empty()) return;
  thread_local std::vector<text::pre_tokenizer::piece> pieces;  // reused between calls on this thread
  std::string sanitized;
  std::string_view text = raw;
  if (!utf8_valid(raw)) {  // the pre-tokenizer needs valid UTF-8
    sanitized = utf8_sanitize(raw);
    text = sanitized;
  }
  pre_tokenizer_->split(text, pieces);
  for (const auto p : pieces) bpe_piece(text.substr(p.begin, p.size), out);
}

// ---------------------------------------------------------------------------------------------
// SentencePiece (llama.cpp's llm_tokenizer_spm_session)

namespace {

constexpr std::string_view k_space_marker = "\xE2\x96\x81";  // U+2581, SentencePiece's escaped space

// Bytes of the UTF-8 sequence a lead byte announces, unchecked (continuation and invalid bytes
// count 1), as llama.cpp's unicode_len_utf8 reads them.
uint32_t utf8_lead_len(unsigned char b) {
  static constexpr uint8_t k_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return k_len[b >> 4];
}

// A run of the escaped text; symbols form a doubly linked list over the fragment.
struct spm_symbol {
  uint32_t begin, size;  // bytes; size 0 once merged into the symbol on its left
  int32_t prev, next;    // indices into the symbol vector, -1 at the ends
};

struct spm_candidate {
  float score;  // of the token the pair becomes
  int32_t left, right;
  uint32_t size;  // bytes of the pair when queued: a side that has grown since makes it stale
  // Max-heap order: the highest score, then the leftmost pair.
  bool operator<(const spm_candidate& o) const { return score != o.score ? score < o.score : left > o.left; }
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte of a "<0xAB>" token text, or -1.
int hex_byte(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return -1;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string spm_unescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, k_space_marker.size()) == k_space_marker) {
      out += ' ';
      i += k_space_marker.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

}  // namespace

void tokenizer::impl::push_bytes(std::string_view bytes, std::vector<token_id>& out) const {
  for (const unsigned char b : bytes) {
    const token_id id = byte_token_[b];
    if (id >= 0) {
      out.push_back(id);
    } else if (unk_ >= 0) {
      out.push_back(unk_);
    }
  }
}

// Spaces become U+2581 (plus one in front when `space_prefix`); symbols start as UTF-8
// characters; the adjacent pair whose concatenation is the highest-scoring token merges first
// (ties: the leftmost); a final symbol that is no token becomes its bytes' <0xXX> tokens. The
// text is used as given: llama.cpp does not repair invalid UTF-8 on this path.
void tokenizer::impl::spm_fragment(std::string_view raw, bool space_prefix, std::vector<token_id>& out) const {
  // Reused between calls on this thread; all are cleared before use.
  thread_local std::string text;
  thread_local std::vector<spm_symbol> symbols;
  thread_local std::vector<spm_candidate> heap;
  text.clear();
  symbols.clear();
  heap.clear();
  if (space_prefix) text += k_space_marker;
  for (const char c : raw) {
    if (c == ' ') {
      text += k_space_marker;
    } else {
      text += c;
    }
  }

  const auto n = static_cast<uint32_t>(text.size());
  for (uint32_t off = 0; off < n;) {
    const uint32_t len = std::min(utf8_lead_len(static_cast<unsigned char>(text[off])), n - off);
    const auto i = static_cast<int32_t>(symbols.size());
    symbols.push_back({off, len, i - 1, off + len < n ? i + 1 : -1});
    off += len;
  }
  const std::string_view all = text;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols[left].size + symbols[right].size;
    const auto it = id_of_.find(all.substr(symbols[left].begin, size));
    if (it == id_of_.end()) return;
    heap.push_back({score_[it->second], left, right, size});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) consider(i - 1, i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const spm_candidate c = heap.back();
    heap.pop_back();
    spm_symbol& l = symbols[c.left];
    spm_symbol& r = symbols[c.right];
    if (l.size == 0 || r.size == 0 || l.size + r.size != c.size) continue;
    l.size += r.size;
    r.size = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = all.substr(symbols[i].begin, symbols[i].size);
    if (const auto it = id_of_.find(piece); it != id_of_.end()) {
      out.push_back(it->second);
    } else {
      push_bytes(piece, out);
    }
  }
}

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
  }
  std::stable_sort(p->special_.begin(), p->special_.end(),
                   [&](token_id a, token_id b) { return p->text_[a].size() > p->text_[b].size(); });

  return tokenizer(std::move(p));
}

std::vector<token_id> tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 4);
  const bool special = add_bos;  // llama.cpp's add_special covers both BOS and EOS
  if (special && impl_->add_bos_) out.push_back(impl_->bos_);
  impl_->split_special(text, parse_special, out);
  if (special && impl_->add_eos_) out.push_back(impl_->eos_);
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

// ---------------------------------------------------------------------------------------------
// stream_decoder

namespace {

// Appends `in` to `out` with every invalid sequence replaced by U+FFFD (one per maximal
// invalid subpart). When `hold_tail`, a trailing truncated-but-valid prefix is not consumed;
// returns the number of bytes consumed.
size_t append_valid_utf8(std::string_view in, std::string& out, bool hold_tail) {
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  size_t i = 0;
  while (i < in.size()) {
    const utf8_step st = utf8_read(p + i, in.size() - i);
    if (st.kind == utf8_step::valid) {
      out.append(in.substr(i, st.len));
    } else if (st.kind == utf8_step::truncated && hold_tail) {
      return i;
    } else {
      out += k_replacement;
    }
    i += st.len;
  }
  return i;
}

}  // namespace

std::string stream_decoder::push(token_id id) {
  pending_ += tok_->token_bytes(id, render_special_);
  std::string out;
  const size_t used = append_valid_utf8(pending_, out, /*hold_tail=*/true);
  pending_.erase(0, used);
  return out;
}

std::string stream_decoder::flush() {
  std::string out;
  append_valid_utf8(pending_, out, /*hold_tail=*/false);
  pending_.clear();
  return out;
}

}  // namespace sy
