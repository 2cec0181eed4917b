#include "kernels/cuda/rms_norm.cuh"

#include <algorithm>

#include "kernels/cuda/cuda_check.cuh"

namespace sy::cuda {
namespace {

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum of `v` over the block; every thread gets the total. `sh` holds 33 floats; the block size is
// a multiple of 32. Ends with a barrier, so `sh` may be reused right after.
template <int block>
__device__ __forceinline__ float block_sum(float v, float* sh) {
  static_assert(block % 32 == 0 && block <= 1024, "block size");
  constexpr int n_warps = block / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < n_warps ? sh[lane] : 0.f;
    t = warp_sum(t);
    if (lane == 0) sh[32] = t;
  }
  __syncthreads();
  const float total = sh[32];
  __syncthreads();
  return total;
}

// One block per row (grid-stride over rows). With `delta`, the row is first updated in place:
// x[i] += delta[i] (the same thread writes and later re-reads each element, so no barrier needed).
template <int block, bool fused_add>
__global__ void __launch_bounds__(block)
    rms_norm_kernel(float* x, const float* __restrict__ delta, const float* __restrict__ weight, __half* __restrict__ y,
                    int64_t n_rows, int64_t n, float eps) {
  __shared__ float sh[33];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    float* xr = x + r * n;
    float sum = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += block) {
      float v = xr[i];
      if constexpr (fused_add) {
        v += delta[r * n + i];
        xr[i] = v;
      }
      sum += v * v;
    }
    sum = block_sum<block>(sum, sh);
    const float scale = 1.f / sqrtf(sum / static_cast<float>(n) + eps);
    __half* yr = y + r * n;
    for (int64_t i = threadIdx.x; i < n; i += block) yr[i] = __float2half_rn(xr[i] * scale * weight[i]);
  }
}

template <bool fused_add>
void launch_rms_norm(float* x, const float* delta, const float* weight, __half* y, int64_t n_rows, int64_t n, float eps,
                     cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n_rows, 65535));
  if (n <= 1024) {
    rms_norm_kernel<128, fused_add><<<blocks, 128, 0, s>>>(x, delta, weight, y, n_rows, n, eps);
  } else {
    rms_norm_kernel<256, fused_add><<<blocks, 256, 0, s>>>(x, delta, weight, y, n_rows, n, eps);
  }
  SY_CUDA_CHECK_LAUNCH();
}

constexpr int k_elem_threads = 256;

unsigned elementwise_blocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + k_elem_threads - 1) / k_elem_threads, 65535));
}

__global__ void add_inplace_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void f32_to_f16_kernel(const float* __restrict__ x, __half* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __float2half_rn(x[i]);
}

}  // namespace

void rms_norm(const float* x, const float* weight, __half* y, int64_t n_rows, int64_t n, float eps, cudaStream_t s) {
  if (n_rows <= 0 || n <= 0) return;
  // The non-fused kernel only reads x; the pointer is non-const because the template shares code.
  launch_rms_norm<false>(const_cast<float*>(x), nullptr, weight, y, n_rows, n, eps, s);
}

void add_rms_norm(float* residual, const float* delta, const float* weight, __half* y, int64_t n_rows, int64_t n,
                  float eps, cudaStream_t s) {
  if (n_rows <= 0 || n <= 0) return;
  launch_rms_norm<true>(residual, delta, weight, y, n_rows, n, eps, s);
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_inplace_kernel<<<elementwise_blocks(n), k_elem_threads, 0, s>>>(x, y, n);
  SY_CUDA_CHECK_LAUNCH();
}

void f32_to_f16(const float* x, __half* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  f32_to_f16_kernel<<<elementwise_blocks(n), k_elem_threads, 0, s>>>(x, y, n);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace sy::cuda
