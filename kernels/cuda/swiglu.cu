#include "kernels/cuda/swiglu.cuh"

#include <algorithm>

#include "kernels/cuda/cuda_check.cuh"

namespace sy::cuda {
namespace {

constexpr int k_threads = 256;

__global__ void silu_mul_kernel(const float* __restrict__ gate, const float* __restrict__ up, __half* __restrict__ out,
                                int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    // For g very negative expf(-g) is +inf and the quotient a signed zero, as on the CPU.
    out[i] = __float2half_rn(g / (1.f + expf(-g)) * up[i]);
  }
}

void launch_silu_mul(const float* gate, const float* up, __half* out, int64_t n, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + k_threads - 1) / k_threads, 65535));
  silu_mul_kernel<<<blocks, k_threads, 0, s>>>(gate, up, out, n);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void silu_mul(const float* gate, const float* up, __half* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  launch_silu_mul(gate, up, out, n, s);
}

}  // namespace sy::cuda
