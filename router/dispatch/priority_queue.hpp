// The router's cluster queue: requests admitted but not yet dispatched to a worker
// (docs/architecture.md, "The path of a request"). Bookkeeping only: ids, tenants, priorities,
// times, token counts.
//
// Dispatch order (pop):
//  1. Effective class: the entry's class (class_of(priority)) promoted one step towards
//     interactive for each full aging_s it has waited since enqueued_s, so nothing starves.
//     The best effective class present goes first.
//  2. Fair share between tenants within that effective class (weighted fair queuing by tokens):
//     each tenant has a virtual time per class, advanced by max(1, tokens) of each entry popped
//     for it in that class; the tenant with eligible entries and the smallest virtual time goes
//     first (ties: lowest tenant index). A tenant becoming active again in a class starts at
//     max(its own virtual time, the smallest virtual time of the tenants already active there),
//     so idling banks no credit. When the queue empties, all virtual times reset to 0.
//  3. Within one tenant: push_front entries first (the most recent push_front first, like a
//     deque), then earliest deadline first, then entries without a deadline in enqueue order
//     (enqueued_s, then push order). Entries of a worse original class promoted by aging into
//     this class compete by the same key; from each worse class the tenant's oldest entry is
//     the candidate.
//
// Cost: pop/peek are O(classes x tenants with queued entries x log n); push/remove O(log n).
// Time is always passed in (`now_s`, seconds on a steady clock); nothing here reads a clock.
// Not thread-safe: owned by the router's dispatcher thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "router/dispatch/tenants.hpp"

namespace sy::router {

struct queue_entry {
  uint64_t id = 0;        // unique among queued entries
  size_t tenant = 0;      // tenant index (tenant::index)
  int32_t priority = 0;   // class = class_of(priority)
  double enqueued_s = 0;  // when it first entered the queue (kept on requeue)
  double deadline_s = 0;  // absolute, steady clock; 0: none
  int64_t tokens = 0;     // prompt + max_tokens (for caps and fair share)
  // Absolute: past it the entry has waited too long to be dispatched (the queue timeout; it does
  // not change the order). 0: none. push_front entries (requests coming back) carry none.
  double queue_deadline_s = 0;
};

struct queue_config {
  double aging_s = 10.0;  // each aging_s waited promotes an entry one class; <= 0: no aging
};

class priority_queue {
 public:
  explicit priority_queue(queue_config cfg = {});

  // Pushing an id already queued is a bug (asserted).
  void push(queue_entry e);
  // A request coming back (its worker died before it started): goes ahead of the others in its
  // tenant's queue of its class.
  void push_front(queue_entry e);

  // The next entry to dispatch (see the order above), removed; nullopt when empty.
  std::optional<queue_entry> pop(double now_s);
  // What pop(now_s) would return, without removing it; nullptr when empty. Valid until the
  // next mutation.
  const queue_entry* peek(double now_s) const;
  // Cancelled while queued; false if absent.
  bool remove(uint64_t id);
  // The queued entry with this id; nullptr if absent. Valid until the next mutation.
  const queue_entry* find(uint64_t id) const;

  size_t size() const { return entries_.size(); }
  int64_t tokens() const { return tokens_; }
  size_t size(priority_class c) const { return size_by_class_[static_cast<size_t>(c)]; }  // original class
  bool empty() const { return entries_.empty(); }

  // Ids whose deadline has passed (deadline_s > 0 and now_s > deadline_s), earliest deadline
  // first. The caller removes them and answers their clients.
  std::vector<uint64_t> expired(double now_s) const;
  // Ids whose queue deadline has passed (queue_deadline_s > 0 and now_s > queue_deadline_s),
  // earliest first. The caller removes them and answers their clients.
  std::vector<uint64_t> waited_too_long(double now_s) const;

  // Effective class of an entry of original class `c` enqueued at `enqueued_s`, at `now_s`.
  priority_class effective_class(priority_class c, double enqueued_s, double now_s) const;

 private:
  // Position within one (class, tenant) lane; smaller goes first.
  struct order_key {
    uint8_t tier = 1;        // 0: push_front, 1: push
    int64_t front_rank = 0;  // push_front: minus its push_front sequence (latest first)
    double deadline = 0;     // +inf when none
    double enqueued_s = 0;
    uint64_t seq = 0;  // push sequence (unique)
    uint64_t id = 0;
    bool operator<(const order_key& o) const;
  };
  struct age_key {
    double enqueued_s = 0;
    uint64_t seq = 0;
    uint64_t id = 0;
    bool operator<(const age_key& o) const;
  };
  // One tenant's entries of one original class.
  struct lane {
    std::set<order_key> by_order;
    std::set<age_key> by_age;
  };
  struct node {
    queue_entry entry;
    order_key key;
    size_t cls = 0;  // original class
  };
  // The outcome of the selection shared by pop and peek.
  struct choice {
    uint64_t id = 0;
    size_t eff_class = 0;
    size_t tenant = 0;
    double floor_vtime = 0;          // virtual time newly active tenants are raised to
    std::vector<size_t> candidates;  // tenants with entries eligible in eff_class
  };

  void insert(queue_entry e, bool front);
  void erase(std::unordered_map<uint64_t, node>::iterator it);
  std::optional<choice> select(double now_s) const;
  size_t eff(size_t cls, double enqueued_s, double now_s) const;

  queue_config cfg_;
  std::unordered_map<uint64_t, node> entries_;                      // id -> entry and its position
  std::array<std::map<size_t, lane>, k_n_priority_classes> lanes_;  // [class][tenant]; no empty lanes
  std::set<std::pair<double, uint64_t>> deadlines_;                 // (deadline_s, id) of entries with one
  std::set<std::pair<double, uint64_t>> queue_deadlines_;           // (queue_deadline_s, id) likewise
  std::array<size_t, k_n_priority_classes> size_by_class_{};
  int64_t tokens_ = 0;
  uint64_t next_seq_ = 0;
  int64_t next_front_ = 0;

  // Fair share, per effective class: each tenant's virtual time, the tenants found eligible at
  // the last selection in that class ("active"), and the virtual time last served there.
  std::array<std::unordered_map<size_t, double>, k_n_priority_classes> vtime_;
  std::array<std::vector<size_t>, k_n_priority_classes> active_;
  std::array<double, k_n_priority_classes> last_served_vtime_{};
};

}  // namespace sy::router
