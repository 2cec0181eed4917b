// SentencePiece (Llama 2 / Mistral family), as llama.cpp's llm_tokenizer_spm_session: spaces
// escaped as U+2581, symbols merged by token score, unknown symbols spelled as byte tokens.
#include "common/tokenizer/tokenizer_impl.hpp"

#include <queue>

namespace sy {

using namespace tokenizer_detail;
using text::utf8_lead_len;

namespace {

constexpr std::string_view k_space_marker = "\xE2\x96\x81";  // U+2581, SentencePiece's escaped space

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

}  // namespace

int tokenizer_detail::hex_byte(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return -1;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string tokenizer_detail::spm_unescape(std::string_view text) {
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

}  // namespace sy
