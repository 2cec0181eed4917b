// Embedding gather on the device (CPU reference: llama_model::embed, which is cpu::dequantize_row
// of the token's row of token_embd.weight).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/quant.hpp"

namespace sy::cuda {

// out[t][:] = row ids[t] of `table` dequantized to fp32, for t < n_tokens: bit for bit what
// cpu::dequantize_row gives for that row (quant_decode.cuh). `table` is the GGUF tensor as stored,
// [n_vocab] rows of cpu::row_bytes(type, n_embd) bytes, any cpu::weight_type; `ids` [n_tokens]
// int32; both in device memory (cudaMalloc alignment). An id outside [0, n_vocab) gives a row of
// zeros. n_embd must be a multiple of the type's block (32; 256 for the K-quants;
// std::invalid_argument otherwise). Asynchronous on `s`.
void embed_rows(const void* table, cpu::weight_type type, const int32_t* ids, int64_t n_tokens, int64_t n_embd,
                int64_t n_vocab, float* out, cudaStream_t s);

}  // namespace sy::cuda
