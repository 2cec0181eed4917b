#include "router/dispatch/coalescer.hpp"

#include "router/dispatch/answers.hpp"

namespace sy::router {

std::optional<uint64_t> coalescer::generating(const std::string& key) const {
  const auto k = by_key_.find(key);
  if (k == by_key_.end()) return std::nullopt;
  return k->second;
}

void coalescer::lead(const active_request& a) {
  if (!a.r->cache_key.empty()) by_key_[a.r->cache_key] = a.r->id;
}

void coalescer::join(active_request& a, std::shared_ptr<routed_request> r) {
  listener l;
  l.r = std::move(r);
  l.started.assign(a.choices.size(), false);
  if (l.stream()) {
    auto headers = answer_headers(*l.r);
    headers.emplace_back("X-Cache", "coalesced");
    l.r->ex->start_stream(200, std::move(headers));
    // Join the live stream: first what the generation has produced so far, written as the
    // client reads it (http_exchange::send_events), then the rest as it comes.
    std::vector<std::string> so_far;
    for (uint32_t c = 0; c < a.choices.size(); ++c) {
      const choice_state& cs = a.choices[c];
      const finish_reason finish = cs.finish_reason;  // none while unfinished
      const auto chunk = [&](std::string_view text, finish_reason fin) {
        so_far.push_back(
            format_chunk(l.r->meta, static_cast<int32_t>(c), text, !l.started[c], fin, {}, nullptr, cs.stop));
        l.started[c] = true;
      };
      for (size_t i = 0; i < cs.deltas.size(); ++i)
        chunk(cs.deltas[i], i + 1 == cs.deltas.size() ? finish : finish_reason::none);
      if (cs.finished() && cs.deltas.empty()) chunk("", finish);
    }
    l.r->ex->send_events(std::move(so_far));
  }
  coalesced_++;
  listens_to_[l.r->id] = a.r->id;
  a.listeners.push_back(std::move(l));
}

std::optional<uint64_t> coalescer::leave(uint64_t id) {
  const auto f = listens_to_.find(id);
  if (f == listens_to_.end()) return std::nullopt;
  const uint64_t to = f->second;
  listens_to_.erase(f);
  return to;
}

std::optional<uint64_t> coalescer::listening_to(uint64_t id) const {
  const auto f = listens_to_.find(id);
  if (f == listens_to_.end()) return std::nullopt;
  return f->second;
}

void coalescer::forget(const active_request& a) {
  const uint64_t id = a.r->id;
  if (!a.r->cache_key.empty()) {
    const auto k = by_key_.find(a.r->cache_key);
    if (k != by_key_.end() && k->second == id) by_key_.erase(k);
  }
  for (const listener& l : a.listeners)
    if (l.r->id != id) listens_to_.erase(l.r->id);
}

}  // namespace sy::router
