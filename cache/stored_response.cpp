#include "cache/stored_response.hpp"

#include <bit>
#include <cassert>
#include <cstring>

#include "common/enum_names.hpp"

namespace sy::cache {
namespace {

constexpr char k_magic[4] = {'S', 'Y', 'R', 'C'};
// 1: before reasoning_tokens, 2: before each choice's stop string (both still read).
constexpr uint8_t k_version = 3;

constexpr std::string_view k_decode_errors[k_n_decode_errors] = {"malformed", "unknown_finish_reason"};

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

class writer {
 public:
  explicit writer(std::string& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void str(std::string_view s) {
    assert(s.size() <= UINT32_MAX);
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string& out_;
};

// Bounds-checked reader: every accessor returns false once the input runs out.
class reader {
 public:
  explicit reader(std::string_view in) : in_(in) {}
  bool u8(uint8_t* v) {
    uint64_t x;
    if (!le(&x, 1)) return false;
    *v = static_cast<uint8_t>(x);
    return true;
  }
  bool u32(uint32_t* v) {
    uint64_t x;
    if (!le(&x, 4)) return false;
    *v = static_cast<uint32_t>(x);
    return true;
  }
  bool u64(uint64_t* v) { return le(v, 8); }
  bool str(std::string* s) {
    uint32_t n;
    if (!u32(&n) || n > remaining()) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool bytes(const char* expect, size_t n) {
    if (n > remaining() || std::memcmp(in_.data() + pos_, expect, n) != 0) return false;
    pos_ += n;
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }
  size_t pos() const { return pos_; }

 private:
  bool le(uint64_t* v, int n) {
    if (remaining() < static_cast<size_t>(n)) return false;
    uint64_t x = 0;
    for (int i = 0; i < n; ++i) x |= uint64_t(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += n;
    *v = x;
    return true;
  }
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

std::string_view name(decode_error e) { return enum_name(k_decode_errors, e, "?"); }

std::string stored_response::text(size_t choice_index) const {
  std::string out;
  for (const std::string& d : choices.at(choice_index).deltas) out += d;
  return out;
}

std::string encode(const stored_response& r) {
  size_t size = 64 + r.model.size();
  for (const auto& c : r.choices) {
    size += 20 + name(c.finish_reason).size() + c.logprobs_json.size() + c.stop.size();
    for (const auto& d : c.deltas) size += 4 + d.size();
  }
  std::string out;
  out.reserve(size);
  writer w(out);
  out.append(k_magic, sizeof k_magic);
  w.u8(k_version);
  w.u8(r.endpoint);
  w.str(r.model);
  w.u32(r.prompt_tokens);
  w.u32(r.completion_tokens);
  w.u32(r.cached_tokens);
  w.u32(r.reasoning_tokens);
  w.u64(std::bit_cast<uint64_t>(r.generation_s));
  w.u64(static_cast<uint64_t>(r.created_unix_s));
  w.u32(static_cast<uint32_t>(r.choices.size()));
  for (const auto& c : r.choices) {
    w.u32(static_cast<uint32_t>(c.deltas.size()));
    for (const auto& d : c.deltas) w.str(d);
    w.str(name(c.finish_reason));
    w.str(c.logprobs_json);
    w.str(c.stop);
  }
  w.u64(fnv1a64(out));
  return out;
}

std::optional<stored_response> decode(std::string_view bytes, decode_error* why) {
  const auto fail = [why](decode_error e) -> std::optional<stored_response> {
    if (why) *why = e;
    return std::nullopt;
  };
  // Checksum first: garbage and bit flips stop here, before any allocation.
  if (bytes.size() < sizeof k_magic + 8) return fail(decode_error::malformed);
  std::string_view body = bytes.substr(0, bytes.size() - 8);
  reader tail(bytes.substr(body.size()));
  uint64_t checksum = 0;
  if (!tail.u64(&checksum) || checksum != fnv1a64(body)) return fail(decode_error::malformed);

  reader in(body);
  stored_response r;
  uint8_t version = 0;
  uint64_t gen_bits = 0, created = 0;
  uint32_t n_choices = 0;
  if (!in.bytes(k_magic, sizeof k_magic) || !in.u8(&version) || version < 1 || version > k_version)
    return fail(decode_error::malformed);
  if (!in.u8(&r.endpoint) || !in.str(&r.model) || !in.u32(&r.prompt_tokens) || !in.u32(&r.completion_tokens) ||
      !in.u32(&r.cached_tokens) || (version >= 2 && !in.u32(&r.reasoning_tokens)) || !in.u64(&gen_bits) ||
      !in.u64(&created) || !in.u32(&n_choices))
    return fail(decode_error::malformed);
  r.generation_s = std::bit_cast<double>(gen_bits);
  r.created_unix_s = static_cast<int64_t>(created);
  // Each choice takes at least 12 bytes and each delta 4: counts beyond that are lies.
  if (n_choices > in.remaining() / 12) return fail(decode_error::malformed);
  r.choices.resize(n_choices);
  bool unknown_finish = false;
  for (auto& c : r.choices) {
    uint32_t n_deltas = 0;
    if (!in.u32(&n_deltas) || n_deltas > in.remaining() / 4) return fail(decode_error::malformed);
    c.deltas.resize(n_deltas);
    for (auto& d : c.deltas)
      if (!in.str(&d)) return fail(decode_error::malformed);
    std::string finish;
    if (!in.str(&finish) || !in.str(&c.logprobs_json) || (version >= 3 && !in.str(&c.stop)))
      return fail(decode_error::malformed);
    const std::optional<finish_reason> fr = parse_finish_reason(finish);
    unknown_finish = unknown_finish || !fr;
    c.finish_reason = fr.value_or(finish_reason::none);
  }
  if (in.remaining() != 0) return fail(decode_error::malformed);
  // Only a record that is whole otherwise is one with an unknown reason (a newer router's).
  if (unknown_finish) return fail(decode_error::unknown_finish_reason);
  return r;
}

}  // namespace sy::cache
