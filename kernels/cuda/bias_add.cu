#include "kernels/cuda/bias_add.cuh"

#include <algorithm>

#include "kernels/cuda/cuda_check.cuh"

namespace sy::cuda {
namespace {

constexpr int k_threads = 256;

// Grid-stride over the n_rows * n elements; consecutive threads on consecutive columns.
__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n_rows, int64_t n) {
  const int64_t total = n_rows * n;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[idx] = __fadd_rn(y[idx], bias[idx % n]);
}

void launch_add_bias(float* y, const float* bias, int64_t n_rows, int64_t n, cudaStream_t s) {
  const int64_t total = n_rows * n;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + k_threads - 1) / k_threads, 65535));
  add_bias_kernel<<<blocks, k_threads, 0, s>>>(y, bias, n_rows, n);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_bias(float* y, const float* bias, int64_t n_rows, int64_t n, cudaStream_t s) {
  if (n_rows <= 0 || n <= 0) return;
  launch_add_bias(y, bias, n_rows, n, s);
}

}  // namespace sy::cuda
