#include "worker/engine/token_mask.hpp"

#include <algorithm>
#include <cstring>

namespace sy {

vocab_bytes::vocab_bytes(const tokenizer& vocab) : n_vocab_(vocab.vocab_size()) {
  for (size_t i = 0; i < n_vocab_; ++i) {
    const auto id = static_cast<token_id>(i);
    if (vocab.is_eog(id)) eog_.push_back(id);
    if (vocab.is_control(id)) continue;
    std::string b = vocab.token_bytes(id);
    if (!b.empty()) sorted_.push_back({std::move(b), id});
  }
  std::sort(sorted_.begin(), sorted_.end(), [](const entry& a, const entry& b) { return a.bytes < b.bytes; });
}

grammar_masks::grammar_masks(grammar::grammar g, std::shared_ptr<const vocab_bytes> vocab)
    : g_(std::move(g)), m_(g_), vocab_(std::move(vocab)) {}

std::shared_ptr<const token_mask> grammar_masks::mask(const grammar::matcher_state& s) {
  const uint64_t h = s.hash();
  {
    std::lock_guard lock(mu_);
    if (const auto it = cache_.find(h); it != cache_.end())
      for (const auto& [state, m] : it->second)
        if (state == s) {
          ++hits_;
          return m;
        }
    ++misses_;
  }
  auto m = std::make_shared<const token_mask>(compute(s));
  std::lock_guard lock(mu_);
  if (n_cached_ >= k_cache_entries) {  // bounded: start over rather than track recency
    cache_.clear();
    n_cached_ = 0;
  }
  cache_[h].emplace_back(s, m);
  ++n_cached_;
  return m;
}

token_mask grammar_masks::compute(const grammar::matcher_state& s) const {
  token_mask out;
  out.bits.assign((vocab_->n_vocab_ + 63) / 64, 0);
  auto allow = [&](token_id t) {
    const auto i = static_cast<size_t>(t);
    out.bits[i >> 6] |= uint64_t{1} << (i & 63);
    ++out.n_allowed;
  };
  if (s.accepting())
    for (token_id t : vocab_->eog_) allow(t);
  if (s.must_end() || s.dead()) return out;

  const auto& toks = vocab_->sorted_;
  // The walk's states, interned, and the transitions between them: most tokens move between a
  // handful of states (inside a string every character returns to the same one), so after the
  // first few tokens nearly every byte is one hash lookup instead of a matcher step.
  std::vector<grammar::matcher_state> interned;
  std::unordered_map<uint64_t, std::vector<int32_t>> by_hash;
  std::unordered_map<uint64_t, int32_t> next_of;  // (state << 8 | byte) -> state, -1 dead
  auto intern = [&](grammar::matcher_state&& st) {
    auto& bucket = by_hash[st.hash()];
    for (int32_t k : bucket)
      if (interned[static_cast<size_t>(k)] == st) return k;
    interned.push_back(std::move(st));
    bucket.push_back(static_cast<int32_t>(interned.size() - 1));
    return bucket.back();
  };
  auto step = [&](int32_t from, uint8_t byte) {
    const uint64_t key = (static_cast<uint64_t>(from) << 8) | byte;
    if (const auto it = next_of.find(key); it != next_of.end()) return it->second;
    grammar::matcher_state next = m_.accept(interned[static_cast<size_t>(from)], byte);
    const int32_t id = next.dead() ? -1 : intern(std::move(next));
    next_of.emplace(key, id);
    return id;
  };
  // path[d]: the state after the first d bytes of the current token (shared with the previous
  // token's prefix).
  std::vector<int32_t> path{intern(grammar::matcher_state(s))};
  const std::string* prev = nullptr;
  size_t i = 0;
  while (i < toks.size()) {
    const std::string& b = toks[i].bytes;
    size_t l = 0;
    if (prev != nullptr) {
      const size_t cap = std::min({prev->size(), b.size(), path.size() - 1});
      while (l < cap && (*prev)[l] == b[l]) ++l;
    }
    path.resize(l + 1);
    size_t dead_at = b.size();
    for (size_t d = l; d < b.size(); ++d) {
      const int32_t next = step(path[d], static_cast<uint8_t>(b[d]));
      if (next < 0) {
        dead_at = d;
        break;
      }
      path.push_back(next);
    }
    prev = &b;
    if (dead_at == b.size()) {
      allow(toks[i].id);
      ++i;
      continue;
    }
    // Every following token that starts with b[0..dead_at] dies at the same byte.
    size_t j = i + 1;
    while (j < toks.size() && toks[j].bytes.size() > dead_at &&
           std::memcmp(toks[j].bytes.data(), b.data(), dead_at + 1) == 0)
      ++j;
    i = j;
  }
  return out;
}

}  // namespace sy
