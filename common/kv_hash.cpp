#include "common/kv_hash.hpp"

namespace sy {
uint64_t kv_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

namespace {

constexpr uint64_t k_golden = 0x9e3779b97f4a7c15ULL;

}  // namespace

uint64_t kv_chain_hash(uint64_t parent_hash, std::span<const int32_t> tokens, uint64_t salt) {
  uint64_t h = kv_mix64(salt + k_golden);
  h = kv_mix64(h ^ parent_hash);
  for (const int32_t t : tokens) h = kv_mix64(h + k_golden + static_cast<uint32_t>(t));
  h = kv_mix64(h ^ static_cast<uint64_t>(tokens.size()));
  return h == 0 ? 1 : h;  // 0 is reserved for "no parent"
}

std::vector<uint64_t> kv_block_hashes(std::span<const int32_t> prompt, uint32_t block_size, uint64_t salt,
                                      uint64_t root) {
  std::vector<uint64_t> out;
  if (block_size == 0) return out;
  out.reserve(prompt.size() / block_size);
  uint64_t parent = root;
  for (size_t b = 0; (b + 1) * block_size <= prompt.size(); ++b) {
    parent = kv_chain_hash(parent, prompt.subspan(b * block_size, block_size), salt);
    out.push_back(parent);
  }
  return out;
}

uint64_t kv_cache_root(std::string_view cache_namespace) {
  return cache_namespace.empty() ? 0 : kv_model_salt(cache_namespace);  // the same FNV-1a + mix; never 0
}

uint64_t kv_model_salt(std::string_view model_identity) {
  // FNV-1a, then mixed; odd so that it is never 0.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : model_identity) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return kv_mix64(h) | 1;
}

}  // namespace sy
