// RMSNorm (optionally fused with the residual add) and two small elementwise ops on the device.
// CPU reference: kernels/cpu/ops (rms_norm, add_inplace). Rows are contiguous, sizes in elements,
// all pointers in device memory, every call asynchronous on the given stream.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sy::cuda {

// For each of n_rows rows of n: y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32 and
// stored as fp16 (the input of the next GEMM). `weight` has n values.
void rms_norm(const float* x, const float* weight, __half* y, int64_t n_rows, int64_t n, float eps, cudaStream_t s);
// residual += delta (fp32, in place), then y = rms_norm(residual) as above: the residual add of
// one sub-layer fused with the norm in front of the next.
void add_rms_norm(float* residual, const float* delta, const float* weight, __half* y, int64_t n_rows, int64_t n,
                  float eps, cudaStream_t s);
// x[i] += y[i] for i < n.
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s);
// y[i] = x[i] rounded to fp16 (nearest even), for i < n.
void f32_to_f16(const float* x, __half* y, int64_t n, cudaStream_t s);

}  // namespace sy::cuda
