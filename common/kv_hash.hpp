// Prefix-cache block hashes, defined once for both sides: the worker registers each full KV
// block under this hash (worker/engine/kv_block_pool), and the router hashes a prompt the same way to
// look its blocks up in the view it keeps of every worker's cache (router/fleet/kv_view). Equal
// hashes mean equal whole prefixes: a block's hash chains its parent's.
//
// The functions are fixed bit for bit (splitmix64's finalizer, no std::hash): a router and a
// worker built by different compilers, or on different hosts, must agree.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace sy {

// The hash of a full block holding `tokens` after the prefix whose last block hashed to
// `parent_hash` (0 for the first block). Never 0: 0 means "no parent".
// splitmix64's finalizer: a bijection on 64 bits with full avalanche (the mixing step of the
// hashes below, and of the block pool's collision rehash).
uint64_t kv_mix64(uint64_t x);

uint64_t kv_chain_hash(uint64_t parent_hash, std::span<const int32_t> tokens, uint64_t salt);

// The chained hashes of a prompt's full blocks: result[i] covers tokens [0, (i+1) * block_size).
// Empty when block_size is 0. `root`: the first block's parent, the prompt's prefix-cache
// namespace (kv_cache_root; 0: the shared one).
std::vector<uint64_t> kv_block_hashes(std::span<const int32_t> prompt, uint32_t block_size, uint64_t salt,
                                      uint64_t root = 0);

// The prefix-cache namespace of requests that may share cached prompt blocks: the parent hash
// of their first block, so that equal prompts in different namespaces hash apart and never
// share a block (nor reveal, through cached_tokens or time to first token, that another
// namespace sent the same text). The router gives each tenant its own, and tenants of one
// cache_group a shared one; "" (open access, one tenant) maps to 0.
uint64_t kv_cache_root(std::string_view cache_namespace);

// The salt a model's blocks are hashed with: a stable function of the model's identity, so
// every worker of one model (wherever its file is mounted) hashes alike and workers of
// different models never share a hash.
uint64_t kv_model_salt(std::string_view model_identity);

}  // namespace sy
