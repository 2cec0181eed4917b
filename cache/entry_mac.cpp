#include "cache/entry_mac.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <stdexcept>

namespace sy::cache {
namespace {

std::string mac_of(std::string_view mac_key, std::string_view redis_key, std::string_view encoded) {
  std::string msg;
  msg.reserve(redis_key.size() + 1 + encoded.size());
  msg.append(redis_key).push_back('\0');  // the separator keeps (key, entry) pairs unambiguous
  msg.append(encoded);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!HMAC(EVP_sha256(), mac_key.data(), static_cast<int>(mac_key.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), md, &n) ||
      n != k_entry_mac_bytes)
    throw std::runtime_error("HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(md), n);
}

}  // namespace

std::string seal(std::string_view mac_key, std::string_view redis_key, std::string encoded) {
  const std::string mac = mac_of(mac_key, redis_key, encoded);
  encoded += mac;
  return encoded;
}

std::optional<std::string_view> unseal(std::string_view mac_key, std::string_view redis_key, std::string_view value) {
  if (value.size() < k_entry_mac_bytes) return std::nullopt;
  const std::string_view body = value.substr(0, value.size() - k_entry_mac_bytes);
  const std::string want = mac_of(mac_key, redis_key, body);
  if (CRYPTO_memcmp(want.data(), value.data() + body.size(), k_entry_mac_bytes) != 0) return std::nullopt;
  return body;
}

}  // namespace sy::cache
