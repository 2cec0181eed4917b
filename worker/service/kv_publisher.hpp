// The worker's side of the routers' prefix views (docs/kv-events.md): after every engine step
// the KV pool's block events (registered / evicted hashes) go, netted and split under the wire
// limits, to every router whose hello asked for them (proto::kv_events); a router that just
// said hello, or asks with kv_resync after a gap, gets a snapshot of every cached hash.
//
// Sequence numbers are per router link and contiguous across snapshots and events, so a router
// sees any loss on the way (a frame given up by the link) as a gap and asks for a snapshot.
// When the pool's event log overflowed (events lost before they were taken), every subscriber
// gets a snapshot instead of the events.
//
// Owned by the engine's thread (worker_service); no sockets: it returns the messages to send.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/wire/protocol.hpp"
#include "worker/engine/kv_block_pool.hpp"

namespace sy {

// The net effect of an ordered event log: each hash once, in `stored` if its last event stored
// it, else in `evicted` (order of first appearance).
void net_kv_events(std::span<const kv_block_event> log, std::vector<uint64_t>& stored, std::vector<uint64_t>& evicted);

struct kv_publisher_counters {
  uint64_t stored = 0;     // hashes sent as stored (snapshots excluded)
  uint64_t evicted = 0;    // hashes sent as evicted
  uint64_t snapshots = 0;  // snapshots sent (one per router per hello, resync or overflow)
  uint64_t resyncs = 0;    // kv_resync requests answered
  uint64_t overflows = 0;  // steps whose events were lost to the pool's log bound
};

class kv_publisher {
 public:
  using addressed = std::pair<std::string, proto::kv_events>;  // [peer identity, message]

  // Turns the pool's event recording on (bounded by its block count).
  kv_publisher(kv_block_pool& pool, std::string model_id);

  // A router's hello asked for events: a snapshot for it (sent after its welcome).
  void subscribe(const std::string& peer, std::vector<addressed>& out);
  void unsubscribe(const std::string& peer) { subs_.erase(peer); }
  // The seq of the last message sent to `peer` (0: none, or not subscribed), for its heartbeats.
  uint64_t last_seq(const std::string& peer) const {
    const auto it = subs_.find(peer);
    return it == subs_.end() ? 0 : it->second - 1;
  }
  // A router's kv_resync: a snapshot for it; ignored from a router that never subscribed.
  void resync(const std::string& peer, std::vector<addressed>& out);
  // After a step: its events to every subscriber (nothing when the step changed no block).
  void publish(std::vector<addressed>& out);

  size_t n_subscribers() const { return subs_.size(); }
  const kv_publisher_counters& counters() const { return counters_; }

 private:
  void snapshot(const std::string& peer, uint64_t& next_seq, std::vector<addressed>& out);

  kv_block_pool& pool_;
  std::string model_id_;
  std::map<std::string, uint64_t> subs_;  // peer identity -> next seq on its link
  std::vector<kv_block_event> log_;       // scratch: one step's events
  std::vector<uint64_t> stored_, evicted_;
  kv_publisher_counters counters_;
};

}  // namespace sy
