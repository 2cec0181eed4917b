// Embedding gather on the device (CPU reference: llama_model::embed, a row of the token table).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sy::cuda {

// out[t][:] = table[ids[t]][:] widened to fp32, for t < n_tokens. `table` is [n_vocab][n_embd]
// fp16 and `ids` [n_tokens] int32, both in device memory; an id outside [0, n_vocab) gives a row
// of zeros. Asynchronous on `s`.
void embed_rows(const __half* table, const int32_t* ids, int64_t n_tokens, int64_t n_embd, int64_t n_vocab, float* out,
                cudaStream_t s);

}  // namespace sy::cuda
