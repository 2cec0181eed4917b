#include "cache/cache_key.hpp"

#include <bit>
#include <cassert>
#include <cmath>

namespace sy::cache {
namespace {

// Appends fixed-width little-endian integers and length-prefixed strings to a byte string.
class canonical_writer {
 public:
  explicit canonical_writer(std::string& out) : out_(out) {}

  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void boolean(bool v) { u8(v ? 1 : 0); }
  void f32(float v) {
    if (v == 0.0f) v = 0.0f;  // -0.0 compares equal to 0.0: one encoding for both
    uint32_t bits = std::isnan(v) ? 0x7fc00000u : std::bit_cast<uint32_t>(v);
    u32(bits);
  }
  void str(std::string_view s) {
    u64(s.size());
    out_.append(s);
  }
  // One value per sampling_params field type; a field of a new type fails to compile here.
  void value(float v) { f32(v); }
  void value(int32_t v) { i32(v); }
  void value(uint64_t v) { u64(v); }
  void value(bool v) { boolean(v); }
  void value(const std::string& v) { str(v); }
  void value(const std::vector<std::string>& v) {
    u64(v.size());
    for (const std::string& s : v) str(s);
  }

 private:
  std::string& out_;
};

}  // namespace

std::string canonical_bytes(const key_input& in) {
  std::string out;
  out.reserve(128 + in.tenant_namespace.size() + in.model.size() + 4 * in.prompt_tokens.size());
  canonical_writer w(out);
  w.str("sy-response-key-v2");
  w.str(in.tenant_namespace);
  w.str(in.model);
  w.u8(in.endpoint);
  w.u64(in.prompt_tokens.size());
  for (int32_t t : in.prompt_tokens) w.i32(t);
  visit_fields(in.sampling, [&w, &in](std::string_view name, const auto& v, field_bounds) {
    // A thinking budget is keyed only when set, so the keys of requests without one are those of
    // before it existed.
    if (in.sampling.thinking_budget == 0 && (name == "thinking_budget" || name == "thinking_end")) return;
    w.str(name);
    w.value(v);
  });
  w.i32(in.n);
  w.boolean(in.want_logprobs);
  w.boolean(in.echo);
  // Appended only when set, so the keys of unconstrained requests are those of before.
  if (!in.constraint_kind.empty()) {
    w.str(in.constraint_kind);
    w.str(in.constraint_schema);
  }
  // Tool calling, likewise only when set; the tag keeps it apart from a constraint's fields.
  if (!in.tools.empty()) {
    w.str("tools");
    w.str(in.tools);
  }
  return out;
}

std::string make_key(const key_input& in) {
  std::string key;
  key.reserve(8 + in.tenant_namespace.size() + 1 + 64);
  key.append("sy:v1:r:").append(in.tenant_namespace).append(":").append(sha256_hex(canonical_bytes(in)));
  return key;
}

std::string prompt_hash(const key_input& in) {
  std::string out;
  out.reserve(32 + in.model.size() + 4 * in.prompt_tokens.size());
  canonical_writer w(out);
  w.str("sy-prompt-v1");
  w.str(in.model);
  w.u64(in.prompt_tokens.size());
  for (int32_t t : in.prompt_tokens) w.i32(t);
  return sha256_hex(out);
}

}  // namespace sy::cache
