#include "router/dispatch/priority_queue.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <tuple>

namespace sy::router {

namespace {
constexpr double k_inf = std::numeric_limits<double>::infinity();
}

bool priority_queue::order_key::operator<(const order_key& o) const {
  return std::tie(tier, front_rank, deadline, enqueued_s, seq) <
         std::tie(o.tier, o.front_rank, o.deadline, o.enqueued_s, o.seq);
}

bool priority_queue::age_key::operator<(const age_key& o) const {
  return std::tie(enqueued_s, seq) < std::tie(o.enqueued_s, o.seq);
}

priority_queue::priority_queue(queue_config cfg) : cfg_(cfg) {}

size_t priority_queue::eff(size_t cls, double enqueued_s, double now_s) const {
  if (!(cfg_.aging_s > 0) || !(now_s > enqueued_s)) return cls;
  const double steps = std::floor((now_s - enqueued_s) / cfg_.aging_s);
  if (steps >= static_cast<double>(cls)) return 0;
  return cls - static_cast<size_t>(steps);
}

priority_class priority_queue::effective_class(priority_class c, double enqueued_s, double now_s) const {
  return static_cast<priority_class>(eff(static_cast<size_t>(c), enqueued_s, now_s));
}

void priority_queue::push(queue_entry e) { insert(e, false); }

void priority_queue::push_front(queue_entry e) {
  e.queue_deadline_s = 0;  // it was dispatched before: its wait in the queue is over
  insert(e, true);
}

void priority_queue::insert(queue_entry e, bool front) {
  assert(!entries_.contains(e.id) && "id already queued");
  assert(e.tokens >= 0);
  if (entries_.contains(e.id)) return;

  node n;
  n.entry = e;
  n.cls = static_cast<size_t>(class_of(e.priority));
  n.key.seq = next_seq_++;
  n.key.id = e.id;
  n.key.enqueued_s = e.enqueued_s;
  n.key.deadline = e.deadline_s > 0 ? e.deadline_s : k_inf;
  if (front) {
    n.key.tier = 0;
    n.key.front_rank = -(++next_front_);
  }

  lane& l = lanes_[n.cls][e.tenant];
  l.by_order.insert(n.key);
  l.by_age.insert(age_key{e.enqueued_s, n.key.seq, e.id});
  if (e.deadline_s > 0) deadlines_.emplace(e.deadline_s, e.id);
  if (e.queue_deadline_s > 0) queue_deadlines_.emplace(e.queue_deadline_s, e.id);
  size_by_class_[n.cls]++;
  tokens_ += e.tokens;
  entries_.emplace(e.id, n);
}

void priority_queue::erase(std::unordered_map<uint64_t, node>::iterator it) {
  const node& n = it->second;
  auto lane_it = lanes_[n.cls].find(n.entry.tenant);
  assert(lane_it != lanes_[n.cls].end());
  lane& l = lane_it->second;
  l.by_order.erase(n.key);
  l.by_age.erase(age_key{n.entry.enqueued_s, n.key.seq, n.entry.id});
  if (l.by_order.empty()) lanes_[n.cls].erase(lane_it);
  if (n.entry.deadline_s > 0) deadlines_.erase({n.entry.deadline_s, n.entry.id});
  if (n.entry.queue_deadline_s > 0) queue_deadlines_.erase({n.entry.queue_deadline_s, n.entry.id});
  size_by_class_[n.cls]--;
  tokens_ -= n.entry.tokens;
  entries_.erase(it);

  if (entries_.empty()) {
    // End of a busy period: nobody carries credit or debt into the next one.
    for (size_t c = 0; c < k_n_priority_classes; ++c) {
      vtime_[c].clear();
      active_[c].clear();
      last_served_vtime_[c] = 0;
    }
  }
}

std::optional<priority_queue::choice> priority_queue::select(double now_s) const {
  if (entries_.empty()) return std::nullopt;

  // 1. The best effective class: each lane's oldest entry is its most promoted one.
  size_t best_class = k_n_priority_classes;
  for (size_t c = 0; c < k_n_priority_classes && best_class > 0; ++c) {
    for (const auto& [t, l] : lanes_[c]) {
      best_class = std::min(best_class, eff(c, l.by_age.begin()->enqueued_s, now_s));
    }
  }
  assert(best_class < k_n_priority_classes);
  const size_t e = best_class;

  // 2. Each tenant's candidate in that class: the head of its own lane of class e, or the oldest
  // entry of a worse class's lane when aging has promoted it to e.
  std::map<size_t, order_key> head;  // tenant -> best candidate key
  for (size_t c = e; c < k_n_priority_classes; ++c) {
    for (const auto& [t, l] : lanes_[c]) {
      const order_key* k = nullptr;
      if (c == e) {
        k = &*l.by_order.begin();
      } else {
        const age_key& oldest = *l.by_age.begin();
        if (eff(c, oldest.enqueued_s, now_s) != e) continue;
        k = &entries_.at(oldest.id).key;
      }
      auto [it, inserted] = head.emplace(t, *k);
      if (!inserted && *k < it->second) it->second = *k;
    }
  }
  assert(!head.empty());

  // 3. Fair share: the smallest virtual time wins; tenants not active at the last selection in
  // this class are raised to the smallest virtual time among those still active.
  const auto& vt = vtime_[e];
  const auto& prev = active_[e];
  auto own = [&](size_t t) {
    auto it = vt.find(t);
    return it == vt.end() ? 0.0 : it->second;
  };
  auto was_active = [&](size_t t) { return std::find(prev.begin(), prev.end(), t) != prev.end(); };

  choice ch;
  ch.eff_class = e;
  double floor_v = k_inf;
  for (const auto& [t, k] : head) {
    if (was_active(t)) floor_v = std::min(floor_v, own(t));
  }
  if (floor_v == k_inf) floor_v = last_served_vtime_[e];
  ch.floor_vtime = floor_v;

  double best_v = k_inf;
  const order_key* best_key = nullptr;
  for (const auto& [t, k] : head) {
    ch.candidates.push_back(t);
    const double v = was_active(t) ? own(t) : std::max(own(t), floor_v);
    if (best_key == nullptr || v < best_v) {
      best_v = v;
      best_key = &k;
      ch.tenant = t;
    }
  }
  ch.id = best_key->id;
  return ch;
}

const queue_entry* priority_queue::peek(double now_s) const {
  std::optional<choice> ch = select(now_s);
  if (!ch) return nullptr;
  return &entries_.at(ch->id).entry;
}

std::optional<queue_entry> priority_queue::pop(double now_s) {
  std::optional<choice> ch = select(now_s);
  if (!ch) return std::nullopt;
  const size_t e = ch->eff_class;
  auto& vt = vtime_[e];
  auto& prev = active_[e];
  for (size_t t : ch->candidates) {
    if (std::find(prev.begin(), prev.end(), t) == prev.end()) {
      double& v = vt[t];
      v = std::max(v, ch->floor_vtime);
    }
  }
  prev = ch->candidates;

  auto it = entries_.find(ch->id);
  assert(it != entries_.end());
  queue_entry out = it->second.entry;
  double& v = vt[ch->tenant];
  last_served_vtime_[e] = v;
  v += static_cast<double>(std::max<int64_t>(1, out.tokens));
  erase(it);
  return out;
}

bool priority_queue::remove(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  erase(it);
  return true;
}

const queue_entry* priority_queue::find(uint64_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second.entry;
}

std::vector<uint64_t> priority_queue::expired(double now_s) const {
  std::vector<uint64_t> ids;
  for (const auto& [deadline, id] : deadlines_) {
    if (!(deadline < now_s)) break;
    ids.push_back(id);
  }
  return ids;
}

std::vector<uint64_t> priority_queue::waited_too_long(double now_s) const {
  std::vector<uint64_t> ids;
  for (const auto& [deadline, id] : queue_deadlines_) {
    if (!(deadline < now_s)) break;
    ids.push_back(id);
  }
  return ids;
}

}  // namespace sy::router
