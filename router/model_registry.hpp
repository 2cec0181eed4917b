// The models the cluster serves, learnt from workers' welcome messages: id, context length,
// and the tokenizer + chat template a router needs to turn requests into token ids (routers
// carry no model files). Written by the dispatcher thread, read by the HTTP threads: entries
// are immutable and shared, the map is guarded by a mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/chat_template.hpp"
#include "common/tokenizer.hpp"

namespace sy::router {

struct model_entry {
  std::string id;
  uint32_t context_length = 0;  // smallest among the workers serving it
  int64_t created = 0;          // unix seconds, when the router first saw it
  tokenizer tok;
  chat_template tmpl;
};

class model_registry {
 public:
  std::shared_ptr<const model_entry> find(const std::string& id) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = models_.find(id);
    return it == models_.end() ? nullptr : it->second;
  }
  std::vector<std::shared_ptr<const model_entry>> all() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::shared_ptr<const model_entry>> out;
    for (const auto& [id, m] : models_) out.push_back(m);
    return out;
  }
  void put(std::shared_ptr<const model_entry> m) {
    std::lock_guard<std::mutex> lk(mu_);
    models_[m->id] = std::move(m);
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const model_entry>> models_;
};

}  // namespace sy::router
