// Token masks for constrained decoding: which tokens of the vocabulary keep a grammar's matcher
// alive from a given state (common/structured/grammar.hpp). The sampler drops every other token.
//
// The vocabulary's tokens are sorted by their bytes once (`vocab_bytes`). A mask walks that list
// advancing the matcher byte by byte; neighbours share prefixes, so the state after the shared
// prefix is reused, and when a prefix kills every stack all tokens that start with it are skipped
// at once. End-of-generation tokens are allowed exactly when the input so far is a complete
// sentence; control tokens and tokens without bytes never are (they would not move the grammar).
//
// Masks depend only on (grammar, state), and a JSON grammar revisits few states (inside a string
// every character leaves the state as it was), so each compiled grammar keeps a bounded cache of
// its masks: after the first documents, a step costs a hash lookup per sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/structured/grammar.hpp"
#include "common/tokenizer/tokenizer.hpp"

namespace sy {

// One bit per token id.
struct token_mask {
  std::vector<uint64_t> bits;
  size_t n_allowed = 0;
  bool allows(token_id t) const {
    const auto i = static_cast<size_t>(t);
    return (bits[i >> 6] >> (i & 63)) & 1;
  }
};

// A vocabulary as the masks read it (built once per model).
class vocab_bytes {
 public:
  explicit vocab_bytes(const tokenizer& vocab);
  size_t n_vocab() const { return n_vocab_; }

 private:
  friend class grammar_masks;
  struct entry {
    std::string bytes;
    token_id id;
  };
  size_t n_vocab_ = 0;
  std::vector<entry> sorted_;  // tokens with bytes, by bytes
  std::vector<token_id> eog_;  // end-of-generation tokens
};

// A compiled grammar with its mask cache; shared by every request that uses the same grammar
// (thread-safe: the cache is guarded, the grammar immutable).
class grammar_masks {
 public:
  grammar_masks(grammar::grammar g, std::shared_ptr<const vocab_bytes> vocab);
  const grammar::matcher& matcher() const { return m_; }
  std::shared_ptr<const token_mask> mask(const grammar::matcher_state& s);
  size_t cache_hits() const { return hits_; }
  size_t cache_misses() const { return misses_; }

  static constexpr size_t k_cache_entries = 4096;

 private:
  token_mask compute(const grammar::matcher_state& s) const;

  grammar::grammar g_;
  grammar::matcher m_;
  std::shared_ptr<const vocab_bytes> vocab_;
  std::mutex mu_;
  std::unordered_map<uint64_t, std::vector<std::pair<grammar::matcher_state, std::shared_ptr<const token_mask>>>>
      cache_;
  size_t n_cached_ = 0, hits_ = 0, misses_ = 0;
};

}  // namespace sy
