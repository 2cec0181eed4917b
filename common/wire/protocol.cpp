// Wire protocol encode/decode (see protocol.hpp).
//
// Each struct's fields are listed once, in a `fields(visitor, struct)` function below; the same
// list drives encoding (writer: a msgpack map keyed by field name) and decoding (reader: looks
// each key up in the decoded map, checks the value's type and size, and names the field on
// failure). After reading, `check(struct)` enforces the value bounds and cross-field rules.
//
// Decoding runs in two passes over the untrusted body:
//   1. shape pass: a msgpack visitor walks the bytes without building anything and enforces the
//      nesting depth and a per-type budget of container elements, so a few header bytes that
//      declare millions of elements cannot make pass 2 allocate for them;
//   2. msgpack::unpack with an unpack_limit (defence in depth), strings referencing the body.
// Every exception (msgpack's, std::bad_alloc, ours) stops in decode().
#include "common/wire/protocol.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <limits>
#include <msgpack.hpp>
#include <type_traits>

#include "common/enum_names.hpp"

namespace sy::proto {

namespace {

constexpr std::string_view k_type_names[k_n_msg_types] = {"hello",     "welcome",   "heartbeat", "submit",
                                                          "cancel",    "tokens",    "error",     "drain",
                                                          "kv_events", "kv_resync", "embed",     "embeddings"};

// msg_type values index `message`, and each struct's k_type names its own slot.
template <class T>
constexpr bool in_its_slot = std::is_same_v<std::variant_alternative_t<size_t(type_of<T>), message>, T>;
static_assert(std::variant_size_v<message> == k_n_msg_types);
static_assert(in_its_slot<hello> && in_its_slot<welcome> && in_its_slot<heartbeat> && in_its_slot<submit> &&
              in_its_slot<cancel> && in_its_slot<tokens> && in_its_slot<error> && in_its_slot<drain>);
static_assert(in_its_slot<kv_events> && in_its_slot<kv_resync> && in_its_slot<embed> && in_its_slot<embeddings>);

// Deepest legitimate nesting is 5 (tokens > logprobs > entry > top > entry).
constexpr size_t k_max_depth = 8;

// Shape-pass budget: container elements (array items + 2 per map pair) in one body. Each
// decoded element costs sizeof(msgpack::object) (24 bytes), so this bounds pass 2's memory:
// ~101 MB for a welcome, ~13 MB for a submit, ~6 MB for anything else.
size_t element_budget(msg_type t) {
  switch (t) {
    case msg_type::welcome:
      return 4 * k_max_vocab + 4096;  // tokens + token_types + scores + merges
    case msg_type::submit:
    case msg_type::embed:
      return k_max_prompt_tokens + k_max_embed_inputs + 4096;
    case msg_type::embeddings:
      return k_max_embeddings_body_bytes;  // never more elements than bytes
    default:
      return k_max_other_body_bytes;  // never more elements than bytes
  }
}

// ---- Field lists -------------------------------------------------------------------------------

// Per-field constraints the reader enforces while reading (the writer ignores them).
struct spec {
  size_t max_n = std::numeric_limits<size_t>::max();      // vector elements
  size_t max_bytes = std::numeric_limits<size_t>::max();  // string bytes (each, for vectors)
  bool required = false;                                  // a missing key is an error
};

template <class S, class T>
concept is = std::same_as<std::remove_const_t<S>, T>;

template <class V, is<tokenizer_spec> S>
void fields(V& v, S& m) {
  v("model", m.model, {.max_bytes = k_max_name_bytes});
  v("pre", m.pre, {.max_bytes = k_max_name_bytes});
  v("tokens", m.tokens, {.max_n = k_max_vocab, .max_bytes = k_max_token_bytes});
  v("token_types", m.token_types, {.max_n = k_max_vocab});
  v("scores", m.scores, {.max_n = k_max_vocab});
  v("merges", m.merges, {.max_n = k_max_vocab, .max_bytes = k_max_token_bytes});
  v("bos_id", m.bos_id);
  v("eos_id", m.eos_id);
  v("unk_id", m.unk_id);
  v("pad_id", m.pad_id);
  v("eot_id", m.eot_id);
  v("eom_id", m.eom_id);
  v("fim_pre_id", m.fim_pre_id);
  v("fim_suf_id", m.fim_suf_id);
  v("fim_mid_id", m.fim_mid_id);
  v("fim_pad_id", m.fim_pad_id);
  v("fim_rep_id", m.fim_rep_id);
  v("fim_sep_id", m.fim_sep_id);
  v("add_bos", m.add_bos);
  v("add_eos", m.add_eos);
  v("add_space_prefix", m.add_space_prefix);
  v("rstrip_specials", m.rstrip_specials);
  v("chat_template", m.chat_template, {.max_bytes = k_max_chat_template_bytes});
}

template <class V, is<hello> S>
void fields(V& v, S& m) {
  v("version", m.version, {.required = true});
  v("router_id", m.router_id, {.max_bytes = k_max_id_bytes});
  v("kv_events", m.kv_events);
}

template <class V, is<welcome> S>
void fields(V& v, S& m) {
  v("version", m.version, {.required = true});
  v("worker_id", m.worker_id, {.max_bytes = k_max_id_bytes});
  v("model_id", m.model_id, {.max_bytes = k_max_model_id_bytes});
  v("context_length", m.context_length);
  v("kv_capacity_tokens", m.kv_capacity_tokens);
  v("kv_block_size", m.kv_block_size);
  v("max_running", m.max_running);
  v("tokenizer", m.tokenizer);
  v("kv_events", m.kv_events);
  v("kv_hash_salt", m.kv_hash_salt);
  v("served_model_names", m.served_model_names, {.max_n = k_max_served_model_names, .max_bytes = k_max_model_id_bytes});
}

template <class V, is<heartbeat> S>
void fields(V& v, S& m) {
  v("running", m.running);
  v("waiting", m.waiting);
  v("free_kv_blocks", m.free_kv_blocks);
  v("total_kv_blocks", m.total_kv_blocks);
  v("step_time_ms", m.step_time_ms);
  v("steps", m.steps);
  v("draining", m.draining);
  v("unix_ms", m.unix_ms);
  v("kv_seq", m.kv_seq);
  v("free_window_kv_blocks", m.free_window_kv_blocks);
  v("total_window_kv_blocks", m.total_window_kv_blocks);
}

// The list is sampling_params' own (common/sampling_params.hpp), shared with the cache key.
template <class V, is<wire_sampling> S>
void fields(V& v, S& m) {
  visit_fields(m, [&v](std::string_view key, auto& x, field_bounds b) {
    v(key, x, {.max_n = b.max_n, .max_bytes = b.max_bytes});
  });
}

template <class V, is<wire_constraint> S>
void fields(V& v, S& m) {
  v("kind", m.kind, {.max_bytes = 32});
  v("schema", m.schema, {.max_bytes = k_max_schema_bytes});
}

template <class V, is<submit> S>
void fields(V& v, S& m) {
  v("request_id", m.request_id, {.max_bytes = k_max_id_bytes});
  v("prompt", m.prompt, {.max_n = k_max_prompt_tokens});
  v("sampling", m.sampling);
  v("priority", m.priority);
  v("budget_ms", m.budget_ms);
  v("stream", m.stream);
  v("n_generated", m.n_generated);
  v("constraint", m.constraint);
  v("cache_root", m.cache_root);
  v("traceparent", m.traceparent, {.max_bytes = 64});
}

template <class V, is<cancel> S>
void fields(V& v, S& m) {
  v("request_id", m.request_id, {.max_bytes = k_max_id_bytes});
}

template <class V, is<token_usage> S>
void fields(V& v, S& m) {
  v("prompt_tokens", m.prompt_tokens);
  v("cached_prompt_tokens", m.cached_prompt_tokens);
  v("completion_tokens", m.completion_tokens);
}

template <class V, is<top_logprob> S>
void fields(V& v, S& m) {
  v("token", m.token);
  v("logprob", m.logprob);
}

template <class V, is<token_logprob> S>
void fields(V& v, S& m) {
  v("token", m.token);
  v("logprob", m.logprob);
  v("top", m.top, {.max_n = size_t(k_max_top_logprobs)});
}

template <class V, is<tokens> S>
void fields(V& v, S& m) {
  v("request_id", m.request_id, {.max_bytes = k_max_id_bytes});
  v("token_ids", m.token_ids, {.max_n = k_max_tokens_per_message});
  v("text", m.text, {.max_bytes = k_max_text_delta_bytes});
  v("finish_reason", m.finish_reason, {.max_bytes = 16});
  v("usage", m.usage);
  v("logprobs", m.logprobs, {.max_n = k_max_tokens_per_message});
  v("seq", m.seq);
  v("stop", m.stop, {.max_bytes = k_max_stop_bytes});
}

template <class V, is<error> S>
void fields(V& v, S& m) {
  v("request_id", m.request_id, {.max_bytes = k_max_id_bytes});
  v("code", m.code, {.max_bytes = k_max_error_code_bytes});
  v("message", m.message, {.max_bytes = k_max_error_message_bytes});
  v("failure", m.failure);
}

template <class V, is<drain> S>
void fields(V& v, S& m) {
  v("reason", m.reason, {.max_bytes = k_max_reason_bytes});
}

template <class V, is<kv_events> S>
void fields(V& v, S& m) {
  v("seq", m.seq, {.required = true});
  v("reset", m.reset);
  v("model_id", m.model_id, {.max_bytes = k_max_model_id_bytes});
  v("stored", m.stored, {.max_n = k_max_kv_hashes});
  v("evicted", m.evicted, {.max_n = k_max_kv_hashes});
}

template <class V, is<kv_resync> S>
void fields(V& v, S& m) {
  v("reason", m.reason, {.max_bytes = k_max_reason_bytes});
}

template <class V, is<embed> S>
void fields(V& v, S& m) {
  v("request_id", m.request_id, {.max_bytes = k_max_id_bytes});
  v("inputs", m.inputs, {.max_n = k_max_embed_inputs});
  v("dimensions", m.dimensions);
  v("priority", m.priority);
  v("budget_ms", m.budget_ms);
}

template <class V, is<embeddings> S>
void fields(V& v, S& m) {
  v("request_id", m.request_id, {.max_bytes = k_max_id_bytes});
  v("data", m.data, {.max_n = k_max_embed_inputs});
  v("prompt_tokens", m.prompt_tokens);
}

template <class T>
concept record = requires(T& t, int& v) {
  fields(v, t);
};

// ---- Encoding ----------------------------------------------------------------------------------

struct string_sink {
  std::string* out;
  void write(const char* p, size_t n) { out->append(p, n); }
};

struct field_counter {
  uint32_t n = 0;
  template <class T>
  void operator()(std::string_view, const T&, spec = {}) {
    ++n;
  }
};

class writer {
 public:
  explicit writer(std::string* out) : sink_{out}, pk_(sink_) {}

  template <class T>
  void operator()(std::string_view key, const T& x, spec = {}) {
    put(key);
    put(x);
  }

  template <class T>
  requires record<T>
  void put(const T& r) {
    field_counter c;
    fields(c, r);
    pk_.pack_map(c.n);
    fields(*this, r);
  }
  template <class T>
  void put(const std::vector<T>& v) {
    pk_.pack_array(static_cast<uint32_t>(v.size()));
    for (const T& x : v) put(x);
  }
  void put(std::string_view s) {
    pk_.pack_str(static_cast<uint32_t>(s.size()));
    pk_.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
  }
  void put(const std::string& s) { put(std::string_view(s)); }
  void put(finish_reason r) { put(name(r)); }
  void put(error_code c) { put(name(c)); }
  void put(bool b) { b ? pk_.pack_true() : pk_.pack_false(); }
  void put(int32_t x) { pk_.pack_int32(x); }
  void put(uint32_t x) { pk_.pack_uint32(x); }
  void put(uint64_t x) { pk_.pack_uint64(x); }
  // Floats are written by hand: msgpack-c 4.1.3's pack_float/pack_double turn integral values
  // into integers and do so with undefined behaviour at 2^64 (uint64_t(1.8446744e19)).
  void put(float x) { put_be(0xca, std::bit_cast<uint32_t>(x)); }
  void put(double x) { put_be(0xcb, std::bit_cast<uint64_t>(x)); }

 private:
  // A type byte then `bits` big-endian (the packer writes straight through to sink_, so raw
  // bytes interleave correctly with its output).
  template <class U>
  void put_be(uint8_t type, U bits) {
    char buf[1 + sizeof(U)];
    buf[0] = static_cast<char>(type);
    for (size_t i = 0; i < sizeof(U); ++i) buf[1 + i] = static_cast<char>(bits >> (8 * (sizeof(U) - 1 - i)));
    sink_.write(buf, sizeof buf);
  }

  string_sink sink_;
  msgpack::packer<string_sink> pk_;
};

template <class T>
std::string encode_record(const T& m) {
  std::string out;
  writer w(&out);
  w.put(m);
  return out;
}

// ---- Decoding ----------------------------------------------------------------------------------

// Thrown by the reader and the checks; caught in decode().
struct field_error {
  std::string path;  // "sampling.stop[3]"
  std::string what;  // "expected a string"
};

class reader {
 public:
  template <class T>
  void operator()(std::string_view key, T& x, spec s = {}) {
    const msgpack::object* o = find(*map_, key);
    if (o == nullptr || o->type == msgpack::type::NIL) {
      if (s.required) fail_at(key, "missing");
      return;
    }
    path_.push_back({key, 0});
    get(*o, x, s);
    path_.pop_back();
  }

  template <class T>
  requires record<T>
  void read_record(const msgpack::object& o, T& r) {
    if (o.type != msgpack::type::MAP) fail("expected a map");
    const msgpack::object* saved = map_;
    map_ = &o;
    fields(*this, r);
    map_ = saved;
  }

  // The value of string key `key` in map `m`, or nullptr (first one wins on duplicates).
  static const msgpack::object* find(const msgpack::object& m, std::string_view key) {
    const msgpack::object_kv* kv = m.via.map.ptr;
    for (uint32_t i = 0; i < m.via.map.size; ++i) {
      const msgpack::object& k = kv[i].key;
      if (k.type == msgpack::type::STR && std::string_view(k.via.str.ptr, k.via.str.size) == key) return &kv[i].val;
    }
    return nullptr;
  }

  [[noreturn]] void fail(std::string what) const { throw field_error{render(), std::move(what)}; }

 private:
  // One step of the path to the value being read: a key, or an index when key is empty.
  struct step {
    std::string_view key;
    size_t index;
  };

  std::string render() const {
    std::string p;
    for (const step& s : path_) {
      if (s.key.empty()) {
        p += '[';
        p += std::to_string(s.index);
        p += ']';
      } else {
        if (!p.empty()) p += '.';
        p += s.key;
      }
    }
    return p;
  }

  [[noreturn]] void fail_at(std::string_view key, std::string what) {
    path_.push_back({key, 0});
    fail(std::move(what));
  }

  template <class T>
  requires record<T>
  void get(const msgpack::object& o, T& r, spec) { read_record(o, r); }

  template <class T>
  void get(const msgpack::object& o, std::vector<T>& v, spec s) {
    if (o.type != msgpack::type::ARRAY) fail("expected an array");
    const uint32_t n = o.via.array.size;
    if (n > s.max_n) fail("more than " + std::to_string(s.max_n) + " elements");
    v.clear();
    v.resize(n);
    const spec elem{.max_bytes = s.max_bytes};
    for (uint32_t i = 0; i < n; ++i) {
      path_.push_back({{}, i});
      get(o.via.array.ptr[i], v[i], elem);
      path_.pop_back();
    }
  }

  void get(const msgpack::object& o, std::string& x, spec s) {
    const char* p;
    uint32_t n;
    if (o.type == msgpack::type::STR) {
      p = o.via.str.ptr;
      n = o.via.str.size;
    } else if (o.type == msgpack::type::BIN) {
      p = o.via.bin.ptr;
      n = o.via.bin.size;
    } else {
      fail("expected a string");
    }
    if (n > s.max_bytes) fail("longer than " + std::to_string(s.max_bytes) + " bytes");
    x.assign(p, n);
  }

  void get(const msgpack::object& o, finish_reason& x, spec s) {
    std::string text;
    get(o, text, s);
    const auto r = parse_finish_reason(text);
    if (!r) {
      std::string known;
      for (size_t i = 1; i < k_n_finish_reasons; ++i) known += ", " + std::string(name(static_cast<finish_reason>(i)));
      fail("not one of \"\"" + known);
    }
    x = *r;
  }

  void get(const msgpack::object& o, error_code& x, spec s) {
    std::string text;
    get(o, text, s);
    x = parse_error_code(text);
  }

  void get(const msgpack::object& o, bool& x, spec) {
    if (o.type != msgpack::type::BOOLEAN) fail("expected a boolean");
    x = o.via.boolean;
  }

  template <std::integral T>
  requires(!std::is_same_v<T, bool>) void get(const msgpack::object& o, T& x, spec) {
    using lim = std::numeric_limits<T>;
    if (o.type == msgpack::type::POSITIVE_INTEGER && o.via.u64 <= uint64_t(lim::max())) {
      x = static_cast<T>(o.via.u64);
    } else if (lim::is_signed && o.type == msgpack::type::NEGATIVE_INTEGER && o.via.i64 >= int64_t(lim::min())) {
      x = static_cast<T>(o.via.i64);
    } else {
      fail(std::string("expected an integer in [") + std::to_string(lim::min()) + ", " + std::to_string(lim::max()) +
           "]");
    }
  }

  template <std::floating_point T>
  void get(const msgpack::object& o, T& x, spec) {
    switch (o.type) {
      case msgpack::type::FLOAT32:
      case msgpack::type::FLOAT64:
        x = static_cast<T>(o.via.f64);
        break;
      case msgpack::type::POSITIVE_INTEGER:
        x = static_cast<T>(o.via.u64);
        break;
      case msgpack::type::NEGATIVE_INTEGER:
        x = static_cast<T>(o.via.i64);
        break;
      default:
        fail("expected a number");
    }
  }

  const msgpack::object* map_ = nullptr;
  std::vector<step> path_;
};

// ---- Value checks after reading (field names as on the wire) ----

[[noreturn]] void bad(std::string path, std::string what) { throw field_error{std::move(path), std::move(what)}; }

void check_request_id(const std::string& id) {
  if (id.empty()) bad("request_id", "missing or empty");
}

void check_token_ids(const std::vector<int32_t>& ids, const char* field) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0) bad(std::string(field) + "[" + std::to_string(i) + "]", "negative token id");
}

void check_special_id(int32_t id, size_t n_tokens, const char* field) {
  if (id != -1 && (id < 0 || size_t(id) >= n_tokens))
    bad(std::string("tokenizer.") + field, "not -1 and not a token id");
}

void check(const hello&) {}

void check(const welcome& m) {
  for (size_t i = 0; i < m.served_model_names.size(); ++i)
    if (m.served_model_names[i].empty()) bad("served_model_names[" + std::to_string(i) + "]", "empty");
  const tokenizer_spec& t = m.tokenizer;
  if (!t.token_types.empty() && t.token_types.size() != t.tokens.size())
    bad("tokenizer.token_types", "neither empty nor one per token");
  if (!t.scores.empty() && t.scores.size() != t.tokens.size())
    bad("tokenizer.scores", "neither empty nor one per token");
  for (size_t i = 0; i < t.scores.size(); ++i)
    if (std::isnan(t.scores[i])) bad("tokenizer.scores[" + std::to_string(i) + "]", "not a number");
  check_special_id(t.bos_id, t.tokens.size(), "bos_id");
  check_special_id(t.eos_id, t.tokens.size(), "eos_id");
  check_special_id(t.unk_id, t.tokens.size(), "unk_id");
  check_special_id(t.pad_id, t.tokens.size(), "pad_id");
  check_special_id(t.eot_id, t.tokens.size(), "eot_id");
  check_special_id(t.eom_id, t.tokens.size(), "eom_id");
  check_special_id(t.fim_pre_id, t.tokens.size(), "fim_pre_id");
  check_special_id(t.fim_suf_id, t.tokens.size(), "fim_suf_id");
  check_special_id(t.fim_mid_id, t.tokens.size(), "fim_mid_id");
  check_special_id(t.fim_pad_id, t.tokens.size(), "fim_pad_id");
  check_special_id(t.fim_rep_id, t.tokens.size(), "fim_rep_id");
  check_special_id(t.fim_sep_id, t.tokens.size(), "fim_sep_id");
}

void check(const heartbeat& m) {
  if (m.free_kv_blocks > m.total_kv_blocks) bad("free_kv_blocks", "greater than total_kv_blocks");
  if (m.free_window_kv_blocks > m.total_window_kv_blocks)
    bad("free_window_kv_blocks", "greater than total_window_kv_blocks");
  if (!std::isfinite(m.step_time_ms) || m.step_time_ms < 0) bad("step_time_ms", "not a finite value >= 0");
}

void check(const submit& m) {
  check_request_id(m.request_id);
  check_token_ids(m.prompt, "prompt");
  if (m.n_generated > 0 && m.n_generated >= m.prompt.size()) bad("n_generated", "not less than the prompt's length");
  const wire_constraint& c = m.constraint;
  if (c.kind != "" && c.kind != "json_object" && c.kind != "json_schema")
    bad("constraint.kind", "not one of json_object, json_schema");
  if ((c.kind == "json_schema") != !c.schema.empty()) bad("constraint.schema", "given without json_schema or missing");
  if (const auto e = validate(m.sampling)) bad("sampling." + e->field, e->message);
}

void check(const cancel& m) { check_request_id(m.request_id); }

void check(const tokens& m) {
  check_request_id(m.request_id);
  check_token_ids(m.token_ids, "token_ids");
  if (m.usage.cached_prompt_tokens > m.usage.prompt_tokens)
    bad("usage.cached_prompt_tokens", "greater than usage.prompt_tokens");
  if (!m.stop.empty() && m.finish_reason != sy::finish_reason::stop) bad("stop", "given without finish_reason stop");
  if (!m.logprobs.empty() && m.logprobs.size() != m.token_ids.size())
    bad("logprobs", "neither empty nor one per token");
  for (size_t i = 0; i < m.logprobs.size(); ++i) {
    const token_logprob& e = m.logprobs[i];
    const std::string at = "logprobs[" + std::to_string(i) + "]";
    if (e.token < 0) bad(at + ".token", "negative token id");
    if (std::isnan(e.logprob) || e.logprob > 0) bad(at + ".logprob", "not a log probability");
    for (size_t j = 0; j < e.top.size(); ++j) {
      if (e.top[j].token < 0) bad(at + ".top[" + std::to_string(j) + "].token", "negative token id");
      if (std::isnan(e.top[j].logprob) || e.top[j].logprob > 0)
        bad(at + ".top[" + std::to_string(j) + "].logprob", "not a log probability");
    }
  }
}

void check(const embed& m) {
  check_request_id(m.request_id);
  if (m.inputs.empty()) bad("inputs", "empty");
  size_t total = 0;
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    const std::string at = "inputs[" + std::to_string(i) + "]";
    if (m.inputs[i].empty()) bad(at, "empty");
    check_token_ids(m.inputs[i], at.c_str());
    total += m.inputs[i].size();
  }
  if (total > k_max_prompt_tokens) bad("inputs", "more than " + std::to_string(k_max_prompt_tokens) + " tokens in all");
}

void check(const embeddings& m) {
  check_request_id(m.request_id);
  for (size_t i = 0; i < m.data.size(); ++i) {
    if (m.data[i].size() != m.data[0].size()) bad("data[" + std::to_string(i) + "]", "not the length of data[0]");
    for (const float x : m.data[i])
      if (!std::isfinite(x)) bad("data[" + std::to_string(i) + "]", "not a finite number");
  }
}

void check(const error&) {}
void check(const drain&) {}
void check(const kv_resync&) {}

void check(const kv_events& m) {
  if (m.seq == 0) bad("seq", "0 (sequence numbers start at 1)");
  for (size_t i = 0; i < m.stored.size(); ++i)
    if (m.stored[i] == 0) bad("stored[" + std::to_string(i) + "]", "0 is not a block hash");
  for (size_t i = 0; i < m.evicted.size(); ++i)
    if (m.evicted[i] == 0) bad("evicted[" + std::to_string(i) + "]", "0 is not a block hash");
}

// ---- Shape pass ----

class shape_visitor : public msgpack::null_visitor {
 public:
  explicit shape_visitor(size_t budget) : budget_(budget) {}

  bool start_array(uint32_t n) { return open(n); }
  bool end_array() { return close(); }
  bool start_map(uint32_t n) { return open(2 * uint64_t(n)); }
  bool end_map() { return close(); }
  void parse_error(size_t, size_t error_offset) { why_ = "invalid msgpack at byte " + std::to_string(error_offset); }
  void insufficient_bytes(size_t, size_t) { why_ = "truncated msgpack"; }

  const std::string& why() const { return why_; }

 private:
  bool open(uint64_t n) {
    if (++depth_ > k_max_depth) {
      why_ = "nested deeper than " + std::to_string(k_max_depth);
      return false;
    }
    elements_ += n;
    if (elements_ > budget_) {
      why_ = "more than " + std::to_string(budget_) + " elements in all";
      return false;
    }
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }

  size_t budget_;
  size_t depth_ = 0;
  uint64_t elements_ = 0;
  std::string why_;
};

bool reference_body(msgpack::type::object_type, size_t, void*) { return true; }

decode_error failed(decode_errc code, msg_type t, std::string what) {
  return decode_error{code, std::string(name(t)) + ": " + what, {}};
}

// A printable, bounded rendering of an untrusted type frame for an error message.
std::string printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 32; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > 32) out += "...";
  return out;
}

template <class T>
decode_result read_message(const msgpack::object& root, msg_type t) {
  T m{};
  reader r;
  try {
    r.read_record(root, m);
    check(m);
  } catch (const field_error& e) {
    decode_error err = failed(decode_errc::invalid_field, t, (e.path.empty() ? std::string() : e.path + ": ") + e.what);
    if constexpr (requires { m.request_id; }) {
      // Name the request when its id itself is fine, so the reply can end it.
      const msgpack::object* id = reader::find(root, "request_id");
      if (id != nullptr && id->type == msgpack::type::STR && id->via.str.size > 0 && id->via.str.size <= k_max_id_bytes)
        err.request_id.assign(id->via.str.ptr, id->via.str.size);
    }
    return err;
  }
  return message(std::in_place_type<T>, std::move(m));
}

decode_result decode_body(msg_type t, std::string_view body) {
  if (body.size() > max_body_bytes(t))
    return failed(
        decode_errc::too_large, t,
        "body of " + std::to_string(body.size()) + " bytes over the limit of " + std::to_string(max_body_bytes(t)));

  const size_t budget = element_budget(t);
  shape_visitor shape(budget);
  size_t off = 0;
  if (!msgpack::parse(body.data(), body.size(), off, shape))
    return failed(decode_errc::malformed, t, shape.why().empty() ? "invalid msgpack" : shape.why());
  if (off != body.size())
    return failed(decode_errc::malformed, t, std::to_string(body.size() - off) + " trailing bytes after the body");

  // Container sizes can never exceed the body's byte count (each element takes >= 1 byte).
  const size_t n_max = std::min(budget, body.size());
  const msgpack::unpack_limit limit(n_max, n_max, body.size(), body.size(), body.size(), k_max_depth);
  off = 0;
  msgpack::object_handle h = msgpack::unpack(body.data(), body.size(), off, reference_body, nullptr, limit);
  const msgpack::object& root = h.get();
  if (root.type != msgpack::type::MAP) return failed(decode_errc::malformed, t, "body is not a map");

  switch (t) {
    case msg_type::hello:
      return read_message<hello>(root, t);
    case msg_type::welcome:
      return read_message<welcome>(root, t);
    case msg_type::heartbeat:
      return read_message<heartbeat>(root, t);
    case msg_type::submit:
      return read_message<submit>(root, t);
    case msg_type::cancel:
      return read_message<cancel>(root, t);
    case msg_type::tokens:
      return read_message<tokens>(root, t);
    case msg_type::error:
      return read_message<error>(root, t);
    case msg_type::drain:
      return read_message<drain>(root, t);
    case msg_type::kv_events:
      return read_message<kv_events>(root, t);
    case msg_type::kv_resync:
      return read_message<kv_resync>(root, t);
    case msg_type::embed:
      return read_message<embed>(root, t);
    case msg_type::embeddings:
      return read_message<embeddings>(root, t);
  }
  return failed(decode_errc::unknown_type, t, "unhandled message type");
}

}  // namespace

std::string_view name(msg_type t) { return enum_name(k_type_names, t, "unknown"); }

std::optional<msg_type> parse_msg_type(std::string_view type_frame) {
  return enum_parse<msg_type>(k_type_names, type_frame);
}

size_t max_body_bytes(msg_type t) {
  switch (t) {
    case msg_type::welcome:
      return k_max_welcome_body_bytes;
    case msg_type::submit:
    case msg_type::embed:
      return k_max_submit_body_bytes;
    case msg_type::embeddings:
      return k_max_embeddings_body_bytes;
    default:
      return k_max_other_body_bytes;
  }
}

std::string encode(const hello& m) { return encode_record(m); }
std::string encode(const welcome& m) { return encode_record(m); }
std::string encode(const heartbeat& m) { return encode_record(m); }
std::string encode(const submit& m) { return encode_record(m); }
std::string encode(const cancel& m) { return encode_record(m); }
std::string encode(const tokens& m) { return encode_record(m); }
std::string encode(const error& m) { return encode_record(m); }
std::string encode(const drain& m) { return encode_record(m); }
std::string encode(const kv_events& m) { return encode_record(m); }
std::string encode(const kv_resync& m) { return encode_record(m); }
std::string encode(const embed& m) { return encode_record(m); }
std::string encode(const embeddings& m) { return encode_record(m); }
std::string encode(const message& m) {
  return std::visit([](const auto& x) { return encode_record(x); }, m);
}

std::string_view name(decode_errc c) {
  switch (c) {
    case decode_errc::unknown_type:
      return "unknown_type";
    case decode_errc::too_large:
      return "too_large";
    case decode_errc::malformed:
      return "malformed";
    case decode_errc::invalid_field:
      return "invalid_field";
  }
  return "unknown";
}

error to_wire(const decode_error& e) {
  const bool about_request = !e.request_id.empty();
  return error{e.request_id, about_request ? error_code::invalid_request : error_code::bad_message,
               e.message.substr(0, k_max_error_message_bytes)};
}

decode_result decode(std::string_view type_frame, std::string_view body) noexcept {
  const std::optional<msg_type> t = parse_msg_type(type_frame);
  if (!t) return decode_error{decode_errc::unknown_type, "unknown message type \"" + printable(type_frame) + "\"", {}};
  try {
    return decode_body(*t, body);
  } catch (const msgpack::unpack_error& e) {  // shape pass should have caught these
    return failed(decode_errc::malformed, *t, std::string("msgpack: ") + e.what());
  } catch (const std::bad_alloc&) {
    return failed(decode_errc::malformed, *t, "out of memory while decoding");
  } catch (const std::exception& e) {
    return failed(decode_errc::malformed, *t, std::string("unexpected: ") + e.what());
  } catch (...) {
    return failed(decode_errc::malformed, *t, "unexpected exception");
  }
}

std::optional<error> check_version(uint32_t peer_version) {
  if (peer_version == k_protocol_version) return std::nullopt;
  return error{{},
               error_code::unknown_version,
               "peer speaks protocol version " + std::to_string(peer_version) + ", this build speaks version " +
                   std::to_string(k_protocol_version)};
}

}  // namespace sy::proto
