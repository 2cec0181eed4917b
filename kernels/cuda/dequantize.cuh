// Weight conversion to fp16 on the device, run once at model load: GGUF rows (ggml block layouts
// as in kernels/cpu/quant.hpp) in, a dense fp16 matrix for cuBLAS out. CPU reference:
// sy::cpu::dequantize_row followed by rounding to fp16.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/quant.hpp"

namespace sy::cuda {

// src: n_rows rows of n_cols elements of `type` (any cpu::weight_type: f32, f16, bf16, q4_0, q4_1,
// q5_0, q5_1, q8_0, q4_K, q5_K, q6_K), each row cpu::row_bytes(type, n_cols) bytes, rows back to
// back, in device memory. dst: [n_rows][n_cols] fp16, each element exactly the fp32 value
// dequantize_row gives (bit for bit: quant_decode.cuh), rounded to fp16 (nearest even).
// n_cols must be a multiple of the type's block (32; 256 for the K-quants; std::invalid_argument
// otherwise). src_device is aligned as its element (4 bytes for f32, 2 for the others; cudaMalloc
// gives 256). Asynchronous on `s`.
void dequantize_to_f16(const void* src_device, cpu::weight_type type, int64_t n_rows, int64_t n_cols, __half* dst,
                       cudaStream_t s);

}  // namespace sy::cuda
