#include "common/sha256.hpp"

#include <openssl/evp.h>

#include <stdexcept>

namespace sy {

std::string sha256_hex(std::string_view bytes) {
  static constexpr char k_hex[] = "0123456789abcdef";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr) != 1 || n != 32)
    throw std::runtime_error("sha256_hex: OpenSSL's SHA-256 failed");
  std::string hex(2 * n, '0');
  for (unsigned i = 0; i < n; ++i) {
    hex[2 * i] = k_hex[md[i] >> 4];
    hex[2 * i + 1] = k_hex[md[i] & 0xf];
  }
  return hex;
}

}  // namespace sy
