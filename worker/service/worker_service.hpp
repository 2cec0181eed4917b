// The worker's protocol logic over the engine: decodes frames from routers, answers hello with
// welcome, turns submit/cancel/drain into engine calls, and engine events into tokens messages;
// heartbeats to every router that said hello. No sockets and no actors: the engine actor is a
// thin shell that feeds frames in and ships `out_frame`s out (so this is unit-testable).
//
// Request ids are per router: a router's "r1" and another router's "r1" are different requests;
// a router reusing a live id gets duplicate_request. Owned by one thread (the engine actor's).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/wire/protocol.hpp"
#include "worker/engine/engine.hpp"
#include "worker/service/constraint_cache.hpp"
#include "worker/service/kv_publisher.hpp"

namespace sy {

// One outgoing message: [peer identity][type][body].
struct out_frame {
  std::string peer;
  std::string type;
  std::string body;
};

struct service_config {
  std::string worker_id = "worker";
  std::string model_id = "model";
  // --served-model-name: more names routers accept for model_id (sent in welcome).
  std::vector<std::string> served_model_names;
  // --chat-template: what routers render chats with instead of the model's own template, as
  // chat_template::parse() takes it (a format name or Jinja source); empty: the model's.
  std::string chat_template;
  // Tests only (--fault-inject drop-frames:N, worker/cli/fault_injection.hpp): the first N tokens
  // frames that are not a request's last are not sent, as if lost on the link (their sequence
  // numbers are used up, so the router sees the gap).
  uint32_t drop_first_frames = 0;
  // Tests only (--fault-inject mute-first:N): the first N requests submitted send their first
  // tokens frame and nothing after it (no final frame either) while the engine runs them to the
  // end and the worker heartbeats on: a request lost inside a live worker.
  uint32_t mute_first_requests = 0;
};

// Counters for /metrics (monotonic unless noted).
struct service_counters {
  uint64_t frames_in = 0;
  uint64_t bad_messages = 0;  // undecodable or unexpected frames
  uint64_t errors_sent = 0;
  uint64_t submits = 0;
  uint64_t rejected = 0;  // submits answered with an error
  uint64_t cancels = 0;
  uint64_t embeds = 0;                         // embed messages (rejected ones counted in `rejected` too)
  uint64_t embeds_answered = 0;                // embeddings messages sent
  uint64_t finished[k_n_finish_reasons] = {};  // by finish_reason (index = enum value)
  uint64_t generated_tokens = 0;
  uint64_t prompt_tokens = 0;         // of finished requests
  uint64_t cached_prompt_tokens = 0;  // of finished requests
  uint64_t peers_gone = 0;
  uint64_t step_failures = 0;   // steps that threw; their requests ended with internal_error
  uint64_t frames_dropped = 0;  // by fault injection (drop_first_frames)
  uint64_t requests_muted = 0;  // by fault injection (mute_first_requests)
  kv_publisher_counters kv;     // block events to routers' prefix views
  uint64_t kv_subscribers = 0;  // gauge: routers receiving them
};

proto::tokenizer_spec tokenizer_spec_from(const gguf::file& f);

class worker_service {
 public:
  worker_service(engine& eng, service_config config);

  // `now_ms`: the worker's steady clock in ms (the engine's deadlines are on it; a submit's
  // budget_ms becomes now_ms + budget_ms on receipt).
  void on_frame(const std::string& peer, const std::string& type, const std::string& body, int64_t now_ms,
                std::vector<out_frame>& out);
  // Runs one engine step when there is work; returns whether work remains.
  bool step(int64_t now_ms, std::vector<out_frame>& out);
  void heartbeat(int64_t now_ms, std::vector<out_frame>& out);
  // The socket reports a router unreachable: its requests are cancelled.
  void on_peer_gone(const std::string& peer);
  void drain() { draining_ = true; }
  bool draining() const { return draining_; }
  bool has_work() const { return eng_.has_work(); }
  bool publishes_kv_events() const { return kv_ != nullptr; }

  const service_counters& counters() const { return counters_; }
  const engine& eng() const { return eng_; }
  size_t n_peers() const { return peers_.size(); }

 private:
  struct owner {
    std::string peer;
    std::string request_id;
    bool stream = true;
    proto::tokens pending;     // non-streaming: accumulated until the end
    uint32_t frames_sent = 0;  // tokens messages sent for it: the next one's seq is one more
    bool muted = false;        // fault injection: nothing is sent after its first tokens frame
    std::string trace;         // " trace <32 hex>" from the submit's traceparent, or "": for log lines
  };
  // `failure`: the failed step it reports (proto::error::failure), 0 for none.
  void send_error(const std::string& peer, const std::string& request_id, error_code code, const std::string& message,
                  std::vector<out_frame>& out, uint64_t failure = 0);
  void handle_submit(const std::string& peer, const proto::submit& m, int64_t now_ms, std::vector<out_frame>& out);
  void handle_embed(const std::string& peer, const proto::embed& m, std::vector<out_frame>& out);
  // Ends every live request with an internal_error frame and cancels it in the engine.
  void fail_all(const std::string& message, std::vector<out_frame>& out);
  // The kv publisher's messages, encoded into `out` (before a step's tokens: a router that sees
  // a request end has seen the blocks its prompt left in the cache).
  void send_kv(std::vector<kv_publisher::addressed>& msgs, std::vector<out_frame>& out);
  template <class T>
  void send(const std::string& peer, const T& m, std::vector<out_frame>& out);
  // Whether fault injection drops the tokens frame about to be sent (drop_first_frames).
  bool drop_injected();

  engine& eng_;
  service_config config_;
  proto::welcome welcome_;                         // built once; carries the tokenizer
  std::map<std::string, std::string> peers_;       // identity -> router_id (said hello)
  std::unordered_map<std::string, owner> owners_;  // engine id -> who asked
  bool draining_ = false;
  service_counters counters_;
  std::vector<request_event> events_;
  std::vector<embedding_event> embedded_;
  constraint_cache constraints_;      // compiled structured-output grammars, by request
  std::unique_ptr<kv_publisher> kv_;  // null when prefix caching is off (nothing to mirror)
  std::vector<kv_publisher::addressed> kv_out_;
};

}  // namespace sy
