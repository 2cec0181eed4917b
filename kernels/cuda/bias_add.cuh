// Bias of a linear layer on the device (Qwen2's attn_{q,k,v}.bias). CPU reference:
// sy::cpu::add_inplace of the bias onto each row (worker/model/cpu_forward.cpp, before RoPE).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sy::cuda {

// y[r][i] += bias[i] for r < n_rows, i < n: y [n_rows][n] fp32, bias [n] fp32, device memory.
// One fp32 addition per element, so the result is the CPU's bit for bit. Asynchronous on `s`.
void add_bias(float* y, const float* bias, int64_t n_rows, int64_t n, cudaStream_t s);

}  // namespace sy::cuda
