// Cache entries sealed with a MAC (HMAC-SHA256 under a key only routers hold): whoever can write
// Redis but lacks the key can neither forge an answer for some tenant's prompt nor move a real
// entry under another key, because the MAC covers the Redis key as well as the entry. A value
// that does not verify reads as a corrupt entry, i.e. a miss.
//
//   sealed value = encoded entry | HMAC-SHA256(mac_key, redis_key | 0x00 | encoded entry)  (32 bytes)
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sy::cache {

inline constexpr size_t k_entry_mac_bytes = 32;
inline constexpr size_t k_min_mac_key_bytes = 16;  // shorter keys are refused at start-up

std::string seal(std::string_view mac_key, std::string_view redis_key, std::string encoded);
// The encoded entry inside `value` when its MAC verifies (constant-time compare); else nullopt.
std::optional<std::string_view> unseal(std::string_view mac_key, std::string_view redis_key, std::string_view value);

}  // namespace sy::cache
