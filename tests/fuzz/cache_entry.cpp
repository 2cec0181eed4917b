// Fuzzes the response cache's entry decoder (cache/stored_response.hpp) and the MAC check in
// front of it (cache/entry_mac.hpp): what a router reads back from Redis, which anyone who can
// write Redis controls. The first byte picks how the rest is read, as response_cache does:
//   0: a plain entry (no --cache-mac-key): decode() directly;
//   1: a sealed value: unseal() under a fixed key, then decode() what verifies;
//   2: the rest sealed here first, so decode() runs behind a MAC that verifies;
//   3: the rest with its FNV-1a checksum appended here, so the fuzzer reaches the fields behind
//      the checksum (as a writer of Redis can: the checksum is no secret).
// decode() must never throw or crash, and an entry it accepts must encode back to the same bytes
// (the format has exactly one encoding per entry) — but for an entry of an earlier format
// version, which is written back in the current one, and must then encode to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "cache/entry_mac.hpp"
#include "cache/stored_response.hpp"

namespace cache = sy::cache;

namespace {

constexpr std::string_view k_mac_key = "fuzz-mac-key-0123456789abcdef";
constexpr std::string_view k_redis_key = "sy:cache:v1:fuzz";

void check_entry(std::string_view bytes) {
  const std::optional<cache::stored_response> r = cache::decode(bytes);
  if (!r) return;
  const std::string again = cache::encode(*r);
  if (bytes.size() > 4 && (bytes[4] == 1 || bytes[4] == 2)) {
    // An entry of an earlier format is read with the defaults of the fields it lacks (version 1:
    // no reasoning_tokens; versions 1 and 2: no choice's stop string) and written in the current
    // format: that one must read back and encode to itself.
    if (bytes[4] == 1 && r->reasoning_tokens != 0) std::abort();
    for (const auto& c : r->choices)
      if (!c.stop.empty()) std::abort();
    const std::optional<cache::stored_response> r2 = cache::decode(again);
    if (!r2 || cache::encode(*r2) != again) std::abort();
  } else if (again != bytes) {
    std::abort();
  }
  for (size_t i = 0; i < r->choices.size(); ++i) (void)r->text(i);
}

// FNV-1a-64, the entry's trailing checksum (stored_response.hpp), little-endian.
std::string with_checksum(std::string_view body) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : body) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  std::string out(body);
  for (int i = 0; i < 8; ++i) out += char(h >> (8 * i));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      check_entry(rest);
      break;
    case 1:
      if (const auto body = cache::unseal(k_mac_key, k_redis_key, rest)) check_entry(*body);
      break;
    case 3:
      check_entry(with_checksum(rest));
      break;
    default: {
      const std::string sealed = cache::seal(k_mac_key, k_redis_key, std::string(rest));
      const auto body = cache::unseal(k_mac_key, k_redis_key, sealed);
      if (!body || *body != rest) std::abort();                                 // a value sealed under the key verifies
      if (cache::unseal(k_mac_key, "sy:cache:v1:other", sealed)) std::abort();  // ... only under its Redis key
      check_entry(*body);
    }
  }
  return 0;
}
