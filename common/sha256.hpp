// SHA-256 of a byte string as 64 lowercase hex digits (OpenSSL's EVP digest): the response cache's
// keys and the start-up check for published example secrets use this one definition.
#pragma once

#include <string>
#include <string_view>

namespace sy {

std::string sha256_hex(std::string_view bytes);

}  // namespace sy
