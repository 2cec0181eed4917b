// Rotary position embedding on the device, Llama "normal" mode: the same math as
// sy::cpu::rope_norm (kernels/cpu/ops), applied to every token of a ragged batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sy::cuda {

// x is [n_tok][n_heads][head_dim] fp32 in device memory, rotated in place; pos [n_tok] int32 in
// device memory. In each head the adjacent pairs (x[2i], x[2i+1]), i < n_rot / 2, turn by
// pos * base^(-2i / n_rot); elements from n_rot on are left alone. Requires 2 <= n_rot <= head_dim,
// n_rot even (std::invalid_argument otherwise). Asynchronous on `s`.
void rope(float* x, const int32_t* pos, int64_t n_tok, int64_t n_heads, int64_t head_dim, int64_t n_rot, float base,
          cudaStream_t s);

}  // namespace sy::cuda
