// The models the cluster serves, learnt from workers' welcome messages: id, context length,
// and the tokenizer + chat template a router needs to turn requests into token ids (routers
// carry no model files). Written by the dispatcher thread, read by the HTTP threads: entries
// are immutable and shared, the maps are guarded by a mutex.
//
// Served names: a model answers to its id (the model file's name) and to aliases — the
// workers' --served-model-name (sent in welcome) and the router's --served-model-name
// NAME=MODEL. A name is taken once: an alias that is already a model id or another model's
// alias is refused, so a name never moves between models while requests use it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/tokenizer/chat_template.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "common/wire/protocol.hpp"

namespace sy::router {

// A context length that later welcomes may narrow, the one field of a model entry that changes
// after it is published: an atomic, copyable so that entries stay plain aggregates.
class narrowing_length {
 public:
  narrowing_length(uint32_t v = 0) : v_(v) {}
  narrowing_length(const narrowing_length& o) : v_(o.v_.load()) {}
  operator uint32_t() const { return v_.load(); }
  // Keeps the smaller of the current value and `v`.
  void narrow(uint32_t v) const {
    uint32_t seen = v_.load();
    while (v < seen && !v_.compare_exchange_weak(seen, v)) {
    }
  }

 private:
  mutable std::atomic<uint32_t> v_;
};

struct model_entry {
  std::string id;
  // The smallest among the workers serving it: later welcomes may narrow it (the one field of
  // an entry that changes; model_registry::narrow_context).
  narrowing_length context_length = 0;
  int64_t created = 0;  // unix seconds, when the router first saw it
  tokenizer tok;
  chat_template tmpl;
  // As the first worker sent it: what the Hugging Face tokenizer files are made from.
  proto::tokenizer_spec spec;

  // The token ids of a chat as the model sees it (its template, then its tokenizer with BOS as
  // it adds it): what /v1/chat/completions sends and /tokenize reports. `tools`: the functions
  // offered, `thinking` the template switch (chat_template::apply; nullopt: its default). Throws on text the
  // tokenizer cannot take.
  std::vector<int32_t> chat_prompt(const std::vector<chat_message>& messages, bool add_generation_prompt,
                                   const std::vector<chat_tool>& tools = {},
                                   std::optional<bool> thinking = std::nullopt) const {
    return tok.encode(tmpl.apply(messages, add_generation_prompt, tools, thinking));
  }
};

class model_registry {
 public:
  // By id or alias; nullptr for an unknown name, or an alias whose model no worker serves yet.
  std::shared_ptr<const model_entry> find(const std::string& name) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = models_.find(name);
    if (it != models_.end()) return it->second;
    const auto a = aliases_.find(name);
    if (a == aliases_.end()) return nullptr;
    it = models_.find(a->second);
    return it == models_.end() ? nullptr : it->second;
  }
  // Every name clients may use (ids and aliases of known models, sorted), with its model.
  std::vector<std::pair<std::string, std::shared_ptr<const model_entry>>> names() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::map<std::string, std::shared_ptr<const model_entry>> out(models_.begin(), models_.end());
    for (const auto& [name, id] : aliases_)
      if (auto it = models_.find(id); it != models_.end()) out.emplace(name, it->second);
    return {out.begin(), out.end()};
  }
  // `name` answers for model `id` (known or not yet). False, changing nothing, when the name is
  // a model id or another model's alias already; true when it is new or already `id`'s.
  bool alias(const std::string& name, const std::string& id) {
    std::lock_guard<std::mutex> lk(mu_);
    if (name == id) return true;
    if (models_.count(name) != 0) return false;
    const auto [it, added] = aliases_.emplace(name, id);
    return added || it->second == id;
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
  // Another worker serves `id` with `context_length` tokens per sequence: the entry keeps the
  // smallest (0, unknown, is ignored), so a request that passes the length check fits any
  // worker it may be sent to.
  void narrow_context(const std::string& id, uint32_t context_length) {
    std::shared_ptr<const model_entry> m = find(id);
    if (m && context_length != 0) m->context_length.narrow(context_length);
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const model_entry>> models_;  // by id
  std::map<std::string, std::string> aliases_;                        // name -> model id
};

}  // namespace sy::router
