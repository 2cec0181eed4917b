// The worker's compiled constraints (structured outputs): a request's proto::wire_constraint ->
// the grammar and its mask cache (worker/engine/token_mask.hpp), shared by every request that sends the
// same one, so the masks computed for one document serve the next. Bounded (least recently used
// out); owned by the worker service, on the engine's thread.
#pragma once

#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <variant>

#include "common/wire/protocol.hpp"
#include "worker/engine/token_mask.hpp"

namespace sy {

class constraint_cache {
 public:
  static constexpr size_t k_max_entries = 64;

  explicit constraint_cache(const tokenizer& vocab) : vocab_(vocab) {}
  // Null for no constraint; the compiled grammar; or why the schema is refused (invalid_request).
  std::variant<std::shared_ptr<grammar_masks>, std::string> get(const proto::wire_constraint& c);
  size_t size() const { return by_key_.size(); }

 private:
  const tokenizer& vocab_;
  std::shared_ptr<const vocab_bytes> bytes_;                               // built on first use
  std::list<std::pair<std::string, std::shared_ptr<grammar_masks>>> lru_;  // front: most recent
  std::unordered_map<std::string, decltype(lru_)::iterator> by_key_;
};

}  // namespace sy
