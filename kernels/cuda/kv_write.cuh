// Writes the step's new keys and values into the paged KV cache on the device. CPU reference:
// cpu::store_kv_row into kv_arena blocks (worker/model/cpu_forward.cpp), for an fp16 cache.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sy::cuda {

// k, v: [n_tok][kv_dim] fp32. slots: [n_tok] int32, slot = block_id * block_size + offset in the
// block; a negative slot marks a padding row and writes nothing. k_cache, v_cache: this layer's
// cache, [n_blocks * block_size][kv_dim] fp16, row `slot` receives the token's K / V rounded to
// fp16 (nearest even). Slots must be distinct and inside the cache (not checked on the device).
// All pointers in device memory; asynchronous on `s`.
void kv_write(const float* k, const float* v, const int32_t* slots, int64_t n_tok, int64_t kv_dim, __half* k_cache,
              __half* v_cache, cudaStream_t s);

}  // namespace sy::cuda
