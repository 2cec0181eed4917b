#include "worker/service/constraint_cache.hpp"

#include "common/structured/json_schema.hpp"

namespace sy {

std::variant<std::shared_ptr<grammar_masks>, std::string> constraint_cache::get(const proto::wire_constraint& c) {
  if (c.kind.empty()) return std::shared_ptr<grammar_masks>{};
  const std::string key = c.kind + '\n' + c.schema;
  if (const auto it = by_key_.find(key); it != by_key_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  grammar::grammar g;
  try {
    g = c.kind == "json_object" ? json_object_grammar() : compile_json_schema(c.schema);
  } catch (const json_schema_error& e) {
    return std::string(e.what());
  }
  if (!bytes_) bytes_ = std::make_shared<const vocab_bytes>(vocab_);
  auto gm = std::make_shared<grammar_masks>(std::move(g), bytes_);
  lru_.emplace_front(key, gm);
  by_key_[key] = lru_.begin();
  if (lru_.size() > k_max_entries) {  // requests still using the oldest keep their copy
    by_key_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return gm;
}

}  // namespace sy
