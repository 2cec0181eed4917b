// Weight conversion to fp16 on the device, run once at model load: GGUF rows (ggml block layouts
// as in kernels/cpu/quant.hpp) in, a dense fp16 matrix for cuBLAS out. CPU reference:
// sy::cpu::dequantize_row followed by rounding to fp16.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/quant.hpp"

namespace sy::cuda {

// src: n_rows rows of n_cols elements of `type` (f32, f16, bf16, q4_0, q4_1, q8_0), each row
// cpu::row_bytes(type, n_cols) bytes, rows back to back, in device memory. dst: [n_rows][n_cols]
// fp16, each element as dequantize_row gives it in fp32, rounded to fp16 (nearest even).
// Block types need n_cols % 32 == 0 (std::invalid_argument otherwise). src_device is aligned as
// its element (4 bytes for f32, 2 for the others; cudaMalloc gives 256). Asynchronous on `s`.
void dequantize_to_f16(const void* src_device, cpu::weight_type type, int64_t n_rows, int64_t n_cols, __half* dst,
                       cudaStream_t s);

}  // namespace sy::cuda
