// Byte-level BPE (GPT-2 family), as llama.cpp's llm_tokenizer_bpe: each raw fragment made valid
// UTF-8, cut into pieces by the pre-tokenizer, each piece merged bottom-up by merge rank.
#include "common/tokenizer/tokenizer_impl.hpp"

#include <queue>

namespace sy {

using namespace tokenizer_detail;
using text::append_utf8;
using text::byte_map;
using text::bytes_unicode;
using text::utf8_sanitize;
using text::utf8_valid;

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

}  // namespace sy
