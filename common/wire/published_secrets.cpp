#include "common/wire/published_secrets.hpp"

#include "common/sha256.hpp"

#include <array>
#include <cstdio>
#include <stdexcept>

namespace sy {

namespace {

struct published {
  const char* sha256_hex;
  const char* what;
};

constexpr std::array<published, 6> k_published = {{
    {"4fb9e662078a5ff5b1f13be0fb7b55f78240623d1e8b0bee9530460d73861f86", "an example tenant API key"},
    {"28204c66e9cc71749653e18ac26aec836683fa37809f957290eb0cb4ccaecc85", "an example tenant API key"},
    {"5a10dfdd6c05dafc1fbe4b8d31cd4c0be2a35cb5d366678e856481e0ca70bd49", "an example tenant API key"},
    {"f95b9f1cd9e1553ad065965fc7c26de7353baeb9d86fe2fda107e4c256d436bf", "the example worker CURVE secret key"},
    {"7de0fb770cb9ad7ce3d2706909ba30c1bb9cf218da666d2ba757513c2f42c1da", "the example router CURVE secret key"},
    {"769ad88fcb377488c26ba16577213259cf845eb303969a9d87d4583600084e45", "the example cache MAC key"},
}};

}  // namespace

std::string published_secret(std::string_view secret) {
  const std::string h = sha256_hex(secret);
  for (const auto& p : k_published)
    if (h == p.sha256_hex) return p.what;
  return {};
}

void refuse_published(std::string_view secret, const std::string& where, bool demo) {
  const std::string what = published_secret(secret);
  if (what.empty()) return;
  const std::string says = where + " is " + what + " published with Switchyard: anyone who read it can use it";
  if (demo) {
    std::fprintf(stderr, "WARNING: %s (--allow-example-keys: a demo)\n", says.c_str());
    return;
  }
  throw std::invalid_argument(says +
                              ". Make your own (python3 deploy/k8s/make-secrets.py), or pass --allow-example-keys "
                              "for a demo that nobody else can reach");
}

}  // namespace sy
