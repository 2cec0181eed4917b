// The router <-> worker wire protocol, declared once (docs/architecture.md, "The router-worker
// link"; docs/engineering.md, "Declared once").
//
// Every ZeroMQ message is a multipart [type frame, body frame]:
//   type frame  the message name, e.g. "submit" — readable in packet captures;
//   body frame  a msgpack MAP keyed by field name (see protocol.cpp).
// The ROUTER socket's identity frame is added and stripped by the socket owner, not here.
//
// Compatibility: unknown keys are ignored and missing keys keep the struct defaults, so a field
// can be added without a version bump. Anything that changes the meaning of an existing field
// bumps k_protocol_version; hello/welcome carry it and a peer speaking another version is
// refused (check_version).
//
// Decoding treats the body as untrusted: decode() never throws and never crashes; every
// problem (unknown type, over-size body, malformed msgpack, wrong value types, limits below
// exceeded) comes back as a decode_error whose message names the field. msgpack itself is an
// implementation detail of protocol.cpp; this header stays free of it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/error_code.hpp"
#include "common/finish_reason.hpp"
#include "common/sampling_params.hpp"

namespace sy::proto {

inline constexpr uint32_t k_protocol_version = 1;

// Order matches the alternatives of `message` below.
enum class msg_type : uint8_t {
  hello,
  welcome,
  heartbeat,
  submit,
  cancel,
  tokens,
  error,
  drain,
  kv_events,
  kv_resync,
  embed,
  embeddings
};
inline constexpr size_t k_n_msg_types = 12;

// The type frame: "hello", "welcome", ... ("unknown" for an out-of-range value).
std::string_view name(msg_type t);
// Inverse of name(); std::nullopt for anything else (exact, case-sensitive match).
std::optional<msg_type> parse_msg_type(std::string_view type_frame);

// ---- Limits, checked by decode() -------------------------------------------------------------

// Body frame size, per type: welcome carries the tokenizer (~1 MB for a 49k vocabulary),
// submit a prompt (128k tokens x 5 bytes = 640 KB), embed its inputs (as much as a submit),
// embeddings the vectors (5 bytes a float: 2048 inputs of 1536 floats), everything else is small.
inline constexpr size_t k_max_welcome_body_bytes = 16u << 20;
inline constexpr size_t k_max_submit_body_bytes = 4u << 20;
inline constexpr size_t k_max_embeddings_body_bytes = 16u << 20;
inline constexpr size_t k_max_other_body_bytes = 256u << 10;
size_t max_body_bytes(msg_type t);
// The largest frame a link socket accepts (ZMQ_MAXMSGSIZE), per direction: the largest body the
// peer may send, plus room. libzmq drops a connection announcing a bigger frame before it
// allocates it, so no peer can make the other hold more than this per frame.
inline constexpr size_t k_max_frame_to_worker = k_max_submit_body_bytes + (64u << 10);
inline constexpr size_t k_max_frame_to_router = k_max_welcome_body_bytes + (64u << 10);

inline constexpr size_t k_max_id_bytes = 128;  // request_id, router_id, worker_id
inline constexpr size_t k_max_model_id_bytes = 256;
inline constexpr size_t k_max_prompt_tokens = 1u << 19;   // submit.prompt
using sy::k_max_stop_bytes;                               // each stop string
using sy::k_max_stop_strings;                             // submit.sampling.stop
using sy::k_max_top_logprobs;                             // submit.sampling.logprobs
inline constexpr size_t k_max_tokens_per_message = 1024;  // tokens.token_ids (senders split)
inline constexpr size_t k_max_text_delta_bytes = 128u << 10;
inline constexpr size_t k_max_error_code_bytes = 64;
inline constexpr size_t k_max_error_message_bytes = 4096;
inline constexpr size_t k_max_reason_bytes = 1024;  // drain.reason
inline constexpr size_t k_max_vocab = 1u << 20;     // tokenizer tokens, token_types, scores, merges
inline constexpr size_t k_max_token_bytes = 4096;   // one vocabulary entry or merge
inline constexpr size_t k_max_chat_template_bytes = 1u << 20;
inline constexpr size_t k_max_name_bytes = 64;          // tokenizer model / pre names
inline constexpr size_t k_max_kv_hashes = 8192;         // kv_events.stored and .evicted, each (senders split)
inline constexpr size_t k_max_served_model_names = 16;  // welcome.served_model_names
inline constexpr size_t k_max_embed_inputs = 2048;      // embed.inputs, embeddings.data

// ---- Messages ----------------------------------------------------------------------------------
// Plain structs; every field has a default, and a field missing from a body keeps it.
// Counts are in tokens / blocks / requests as named; times are milliseconds.

// The tokenizer as GGUF describes it (tokenizer.ggml.*), so a router can tokenize and apply the
// chat template without the model file.
// Ids are -1 when the model has none; the booleans are the effective values (the tokenizer
// model's defaults applied), so a missing key reads as what older workers meant.
struct tokenizer_spec {
  std::string model;                 // tokenizer.ggml.model: "gpt2" (BPE) or "llama" (SentencePiece)
  std::string pre;                   // tokenizer.ggml.pre, e.g. "smollm"
  std::vector<std::string> tokens;   // byte strings, indexed by token id
  std::vector<int32_t> token_types;  // empty or one per token (GGUF token type enum)
  std::vector<float> scores;         // empty or one per token (SentencePiece merge priority)
  std::vector<std::string> merges;   // "left right", highest priority first
  int32_t bos_id = -1;               // -1: absent
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  int32_t eot_id = -1;  // end of turn (tokenizer.ggml.eot_token_id)
  int32_t eom_id = -1;  // end of message (tokenizer.ggml.eom_token_id)
  // Fill-in-the-middle ids as the metadata declares them (pad, repo and file separator end
  // generation; undeclared ones are found by their text, as llama.cpp does).
  int32_t fim_pre_id = -1;
  int32_t fim_suf_id = -1;
  int32_t fim_mid_id = -1;
  int32_t fim_pad_id = -1;
  int32_t fim_rep_id = -1;
  int32_t fim_sep_id = -1;
  bool add_bos = false;           // encode(add_bos = true) prepends BOS
  bool add_eos = false;           // ... and appends EOS
  bool add_space_prefix = false;  // SentencePiece: a space before text at the start / after a special token
  bool rstrip_specials = false;   // whitespace after special tokens is dropped (Phi-3; rstrips_after)
  std::string chat_template;      // what chat_template::parse reads: the model's Jinja source, or the
                                  // operator's --chat-template (a name, a file's text); empty: none

  bool operator==(const tokenizer_spec&) const = default;
};

// router -> worker, first message on a connection.
struct hello {
  static constexpr msg_type k_type = msg_type::hello;
  uint32_t version = k_protocol_version;  // required on the wire
  std::string router_id;                  // <= k_max_id_bytes
  bool kv_events = false;                 // send me kv_events (optional: older workers ignore it)

  bool operator==(const hello&) const = default;
};

// worker -> router, answer to hello.
struct welcome {
  static constexpr msg_type k_type = msg_type::welcome;
  uint32_t version = k_protocol_version;  // required on the wire
  std::string worker_id;                  // <= k_max_id_bytes
  std::string model_id;                   // <= k_max_model_id_bytes
  uint32_t context_length = 0;            // tokens per sequence (prompt + completion)
  uint32_t kv_capacity_tokens = 0;        // tokens the whole KV cache holds
  uint32_t kv_block_size = 0;             // tokens per KV block
  uint32_t max_running = 0;               // sequences per step, at most
  tokenizer_spec tokenizer;
  bool kv_events = false;     // this worker sends kv_events to routers that ask (its prefix caching is on)
  uint64_t kv_hash_salt = 0;  // the salt of its block hashes (common/kv_hash.hpp kv_chain_hash)
  // --served-model-name: more names clients may use for model_id (e.g. the Hugging Face repo id);
  // <= k_max_served_model_names, each non-empty and <= k_max_model_id_bytes. Routers list them in
  // /v1/models (root = model_id) and route requests naming them to model_id's workers.
  std::vector<std::string> served_model_names;

  bool operator==(const welcome&) const = default;
};

// worker -> router, periodically; a worker that misses heartbeats is declared dead.
struct heartbeat {
  static constexpr msg_type k_type = msg_type::heartbeat;
  uint32_t running = 0;         // requests in the running batch
  uint32_t waiting = 0;         // requests queued, not yet scheduled
  uint32_t free_kv_blocks = 0;  // free + evictable cached blocks; <= total_kv_blocks
  uint32_t total_kv_blocks = 0;
  double step_time_ms = 0.0;  // recent mean duration of one engine step
  uint64_t steps = 0;         // engine steps since start
  bool draining = false;      // accepts no new submits
  uint64_t unix_ms = 0;       // worker wall clock when sent, ms since the Unix epoch
  uint64_t kv_seq = 0;        // seq of the last kv_events sent to this router (0: none), so a
                              // router notices a lost last message within a heartbeat
  // The sliding-window layers' own pool (worker/model/kv_window.hpp), like the two above; 0 and 0 for a
  // worker without one, and from a worker older than these keys (missing keys keep the defaults;
  // an older router ignores them). Every sequence takes blocks of both pools.
  uint32_t free_window_kv_blocks = 0;  // <= total_window_kv_blocks
  uint32_t total_window_kv_blocks = 0;

  bool operator==(const heartbeat&) const = default;
};

// The KV blocks a worker can still give a new sequence, as its heartbeat tells: the free blocks
// of its binding pool, the smaller of the main pool's and (where it has one) the window pool's.
// Both pools have the same block size.
inline uint32_t free_kv_blocks_binding(const heartbeat& hb) {
  return hb.total_window_kv_blocks > 0 ? std::min(hb.free_kv_blocks, hb.free_window_kv_blocks) : hb.free_kv_blocks;
}

// The request's sampling parameters, as the router parsed them and the engine samples with them:
// the one struct of common/sampling_params.hpp, encoded through its visit_fields() list and
// checked by its validate() (a field out of range is an invalid_field "sampling.<name>").
using wire_sampling = sampling_params;

// Constrained decoding (structured outputs, tool calls): the output must be a document of this
// grammar. The worker compiles it (common/structured/json_schema.hpp; a schema it refuses fails the request
// with invalid_request) and masks the vocabulary at every step (worker/engine/token_mask.hpp).
inline constexpr size_t k_max_schema_bytes = 64 * 1024;
struct wire_constraint {
  std::string kind;    // "" (none), "json_object" or "json_schema"
  std::string schema;  // kind "json_schema": the JSON Schema, as JSON text (<= k_max_schema_bytes)

  bool operator==(const wire_constraint&) const = default;
};

// router -> worker.
struct submit {
  static constexpr msg_type k_type = msg_type::submit;
  std::string request_id;       // non-empty, <= k_max_id_bytes; unique per router
  std::vector<int32_t> prompt;  // token ids (>= 0; the worker checks the vocabulary)
  wire_sampling sampling;
  int32_t priority = 0;  // lower = more urgent
  // The time the request may take, in ms from when the worker receives it (the worker turns it
  // into a deadline on its own steady clock: the two hosts' wall clocks need not agree); 0: none.
  uint32_t budget_ms = 0;
  bool stream = true;  // send tokens as they come (else one final tokens message)
  // A stream continued on this worker after its first one was lost: the prompt's last
  // n_generated tokens are output the client already has. They are recomputed as output (the
  // numerics and the sampler's state are as if generated here), count toward max_tokens and
  // completion_tokens, and their text is not sent again. 0: a new request.
  uint32_t n_generated = 0;
  wire_constraint constraint;  // none by default
  // The prompt's prefix-cache namespace (common/kv_hash.hpp kv_cache_root): its blocks are
  // shared only with requests that carry the same value. 0: the shared namespace.
  uint64_t cache_root = 0;
  // The request's W3C trace context as the router's server span (docs/router.md, "Tracing"):
  // `00-<trace id>-<span id>-<flags>`; empty: not traced. The worker logs its trace id.
  std::string traceparent;

  bool operator==(const submit&) const = default;
};

// router -> worker: stop generating `request_id` and free its blocks (answered by a final
// tokens message with finish_reason "cancelled").
struct cancel {
  static constexpr msg_type k_type = msg_type::cancel;
  std::string request_id;  // non-empty, <= k_max_id_bytes

  bool operator==(const cancel&) const = default;
};

struct token_usage {
  uint32_t prompt_tokens = 0;
  uint32_t cached_prompt_tokens = 0;  // of prompt_tokens, served from the prefix cache
  uint32_t completion_tokens = 0;

  bool operator==(const token_usage&) const = default;
};

struct top_logprob {
  int32_t token = 0;
  float logprob = 0.f;  // natural log

  bool operator==(const top_logprob&) const = default;
};

struct token_logprob {
  int32_t token = 0;
  float logprob = 0.f;
  std::vector<top_logprob> top;  // <= k_max_top_logprobs, most likely first

  bool operator==(const token_logprob&) const = default;
};

// worker -> router: new tokens of one request; the message with a non-empty finish_reason is
// the request's last. Senders keep a body under max_body_bytes(msg_type::tokens) by splitting.
struct tokens {
  static constexpr msg_type k_type = msg_type::tokens;
  std::string request_id;          // non-empty, <= k_max_id_bytes
  std::vector<int32_t> token_ids;  // <= k_max_tokens_per_message
  std::string text;                // UTF-8 delta for token_ids (never half a character)
  // On the wire as name(finish_reason): "" while running.
  sy::finish_reason finish_reason = sy::finish_reason::none;
  token_usage usage;                    // totals so far
  std::vector<token_logprob> logprobs;  // empty, or one per token_ids entry
  // The frame's place in its request's stream: 1 for the first tokens message of a request_id,
  // one more for each after. A receiver that sees a number skipped knows a frame was lost on
  // the link (a backlog overflowed) and that the text has a hole. 0: not numbered (an older peer).
  uint32_t seq = 0;
  // A request's last frame, finish_reason "stop" on a stop string: that string, exactly as the
  // submit's sampling.stop gave it (the Anthropic API names it). Empty: it ended otherwise (the
  // end of the turn, a grammar's end), or an older worker that does not say.
  std::string stop;

  bool operator==(const tokens&) const = default;
};

// Error codes carried by `error`: common/error_code.hpp (proto::error_code::overloaded, ...).
using error_code = sy::error_code;

// Either direction. With a request_id it ends that request; without one it is about the
// connection (a refused hello, an undecodable message).
struct error {
  static constexpr msg_type k_type = msg_type::error;
  std::string request_id;               // may be empty; <= k_max_id_bytes
  error_code code = error_code::other;  // on the wire: name(), <= k_max_error_code_bytes; a name
                                        // this build does not know reads as other
  std::string message;                  // human readable, <= k_max_error_message_bytes
  // The worker's failure this error reports: every request of one failed step gets an error
  // with the same number (the worker's count of failed steps), so that a router counts one
  // failure of the worker, not one per request in the step. 0: an error of this request alone.
  uint64_t failure = 0;

  bool operator==(const error&) const = default;
};

// router (or operator) -> worker: finish what is running, accept nothing new.
struct drain {
  static constexpr msg_type k_type = msg_type::drain;
  std::string reason;  // optional, <= k_max_reason_bytes

  bool operator==(const drain&) const = default;
};

// worker -> router, only to a router whose hello asked (hello.kv_events): how the worker's prefix
// cache changed, so every router keeps the exact set of block hashes each worker holds. One
// message per engine step that changed it; a snapshot is `reset` plus every cached hash (split
// over several messages: the first resets, the rest add). Within one message a hash appears at
// most once, and evicted is applied before stored.
struct kv_events {
  static constexpr msg_type k_type = msg_type::kv_events;
  uint64_t seq = 0;               // >= 1; per link: the previous kv_events' seq + 1 (a gap: lost)
  bool reset = false;             // forget every block of this worker, then apply this message
  std::string model_id;           // the model whose blocks these are (the worker's), <= k_max_model_id_bytes
  std::vector<uint64_t> stored;   // hashes now cached, <= k_max_kv_hashes, each != 0
  std::vector<uint64_t> evicted;  // hashes no longer cached, <= k_max_kv_hashes, each != 0

  bool operator==(const kv_events&) const = default;
};

// router -> worker: "my view of your cache missed kv_events" (a gap in seq); answered with a
// snapshot. Ignored when the router did not ask for kv_events in its hello.
struct kv_resync {
  static constexpr msg_type k_type = msg_type::kv_resync;
  std::string reason;  // optional, <= k_max_reason_bytes

  bool operator==(const kv_resync&) const = default;
};

// router -> worker: the embeddings of `inputs` (POST /v1/embeddings; docs/router.md,
// "Embeddings API"). A worker serves them when started with --embeddings; one without answers an
// `error` with code embeddings_not_supported. The worker runs each input's prompt through the
// forward pass (no sampling), pools the final normed hidden states (its --pooling) and
// L2-normalizes them; the KV blocks it used are freed and never enter the prefix cache. Answered
// by one `embeddings` message, or an `error`; a `cancel` of the same request_id drops it.
struct embed {
  static constexpr msg_type k_type = msg_type::embed;
  std::string request_id;                    // non-empty, <= k_max_id_bytes; unique per router
  std::vector<std::vector<int32_t>> inputs;  // 1..k_max_embed_inputs, each non-empty; <=
                                             // k_max_prompt_tokens ids in all
  uint32_t dimensions = 0;                   // the client's `dimensions`: 0 (any) or the model's size
  int32_t priority = 0;                      // lower = more urgent
  uint32_t budget_ms = 0;                    // as submit.budget_ms

  bool operator==(const embed&) const = default;
};

// worker -> router: the answer to `embed`, one vector per input in order, each of the model's
// hidden size and of unit length.
struct embeddings {
  static constexpr msg_type k_type = msg_type::embeddings;
  std::string request_id;                // non-empty, <= k_max_id_bytes
  std::vector<std::vector<float>> data;  // <= k_max_embed_inputs, all of one length
  uint32_t prompt_tokens = 0;            // tokens run through the model, all inputs

  bool operator==(const embeddings&) const = default;
};

using message = std::variant<hello, welcome, heartbeat, submit, cancel, tokens, error, drain, kv_events, kv_resync,
                             embed, embeddings>;

template <class T>
inline constexpr msg_type type_of = T::k_type;

inline msg_type type_of_message(const message& m) { return static_cast<msg_type>(m.index()); }

// ---- Encoding ----------------------------------------------------------------------------------
// The body frame; the type frame is name(type_of<T>). Does not validate: a sender that breaks
// the limits above gets its message refused by the peer's decode().
std::string encode(const hello& m);
std::string encode(const welcome& m);
std::string encode(const heartbeat& m);
std::string encode(const submit& m);
std::string encode(const cancel& m);
std::string encode(const tokens& m);
std::string encode(const error& m);
std::string encode(const drain& m);
std::string encode(const kv_events& m);
std::string encode(const kv_resync& m);
std::string encode(const embed& m);
std::string encode(const embeddings& m);
std::string encode(const message& m);

// ---- Decoding ----------------------------------------------------------------------------------

enum class decode_errc : uint8_t {
  unknown_type,   // the type frame names no message
  too_large,      // body over max_body_bytes(type)
  malformed,      // not one complete msgpack map (garbage, truncated, trailing bytes, nesting
                  // or container sizes over the limits)
  invalid_field,  // a field of the wrong type or outside its bounds
};
std::string_view name(decode_errc c);  // "unknown_type", ... (a metric label)

struct decode_error {
  decode_errc code = decode_errc::malformed;
  std::string message;     // names the type and field; never echoes body bytes
  std::string request_id;  // set when the body carried a valid request_id despite the error,
                           // so the reply can end that request
};

// The `error` message a receiver sends back for a message it could not decode: code
// invalid_request when the request is known, else bad_message. (An undecodable `error` is
// logged and counted, not answered, so two peers cannot ping-pong errors.)
error to_wire(const decode_error& e);

class decode_result {
 public:
  decode_result(message m) : v_(std::move(m)) {}
  decode_result(decode_error e) : v_(std::move(e)) {}

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  // Preconditions: ok() for value(), !ok() for failure() (std::bad_variant_access otherwise).
  const message& value() const { return std::get<0>(v_); }
  message& value() { return std::get<0>(v_); }
  const decode_error& failure() const { return std::get<1>(v_); }
  // The message if it decoded to a T, else nullptr.
  template <class T>
  const T* get_if() const noexcept {
    const message* m = std::get_if<0>(&v_);
    return m ? std::get_if<T>(m) : nullptr;
  }

 private:
  std::variant<message, decode_error> v_;
};

// Never throws and never reads past `body`; out of memory while decoding is reported as an
// error (out of memory while reporting it terminates).
decode_result decode(std::string_view type_frame, std::string_view body) noexcept;

// nullopt when `peer_version` (from hello/welcome) is ours; else the error to send back before
// closing: code unknown_version, message naming both versions.
std::optional<error> check_version(uint32_t peer_version);

}  // namespace sy::proto
