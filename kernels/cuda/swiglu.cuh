// SwiGLU activation on the device. CPU reference: sy::cpu::silu_mul (kernels/cpu/ops).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sy::cuda {

// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], computed in fp32 and
// stored as fp16 (the input of the down projection), for i < n. Device pointers; async on `s`.
void silu_mul(const float* gate, const float* up, __half* out, int64_t n, cudaStream_t s);

}  // namespace sy::cuda
