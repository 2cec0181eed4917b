// The cluster queue, one priority_queue per model. A worker serves one model, so a model whose
// workers are all busy must not hold back requests for another model whose workers are free:
// each model's queue is pumped on its own (dispatcher::pump). Admission and metrics see totals
// over every model. Not thread-safe: owned by the dispatcher.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "router/dispatch/priority_queue.hpp"

namespace sy::router {

class model_queues {
 public:
  explicit model_queues(queue_config cfg) : cfg_(cfg) {}

  void push(const std::string& model, queue_entry e) { of(model).push(e); }
  void push_front(const std::string& model, queue_entry e) { of(model).push_front(e); }
  bool remove(const std::string& model, uint64_t id) {
    auto it = queues_.find(model);
    return it != queues_.end() && it->second.remove(id);
  }

  size_t size() const {
    size_t n = 0;
    for (const auto& [m, q] : queues_) n += q.size();
    return n;
  }
  int64_t tokens() const {
    int64_t n = 0;
    for (const auto& [m, q] : queues_) n += q.tokens();
    return n;
  }
  size_t size(priority_class c) const {
    size_t n = 0;
    for (const auto& [m, q] : queues_) n += q.size(c);
    return n;
  }
  // Ids whose deadline has passed, every model's.
  std::vector<uint64_t> expired(double now_s) const {
    std::vector<uint64_t> ids;
    for (const auto& [m, q] : queues_)
      for (const uint64_t id : q.expired(now_s)) ids.push_back(id);
    return ids;
  }
  // Ids whose queue deadline has passed, every model's.
  std::vector<uint64_t> waited_too_long(double now_s) const {
    std::vector<uint64_t> ids;
    for (const auto& [m, q] : queues_)
      for (const uint64_t id : q.waited_too_long(now_s)) ids.push_back(id);
    return ids;
  }
  // Model id -> its queue (queues stay once created: a model's set is small).
  std::map<std::string, priority_queue>& by_model() { return queues_; }
  const std::map<std::string, priority_queue>& by_model() const { return queues_; }

 private:
  priority_queue& of(const std::string& model) { return queues_.try_emplace(model, cfg_).first->second; }

  queue_config cfg_;
  std::map<std::string, priority_queue> queues_;
};

}  // namespace sy::router
