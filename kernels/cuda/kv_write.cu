#include "kernels/cuda/kv_write.cuh"

#include <algorithm>

#include "kernels/cuda/cuda_check.cuh"

namespace sy::cuda {
namespace {

constexpr int k_threads = 256;

// Grid-stride over the n_tok * kv_dim elements; consecutive threads write consecutive elements
// of one cache row.
__global__ void kv_write_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                const int32_t* __restrict__ slots, int64_t n_tok, int64_t kv_dim,
                                __half* __restrict__ k_cache, __half* __restrict__ v_cache) {
  const int64_t n = n_tok * kv_dim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / kv_dim, j = idx % kv_dim;
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    k_cache[slot * kv_dim + j] = __float2half_rn(k[idx]);
    v_cache[slot * kv_dim + j] = __float2half_rn(v[idx]);
  }
}

void launch_kv_write(const float* k, const float* v, const int32_t* slots, int64_t n_tok, int64_t kv_dim,
                     __half* k_cache, __half* v_cache, cudaStream_t s) {
  const int64_t n = n_tok * kv_dim;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + k_threads - 1) / k_threads, 65535));
  kv_write_kernel<<<blocks, k_threads, 0, s>>>(k, v, slots, n_tok, kv_dim, k_cache, v_cache);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void kv_write(const float* k, const float* v, const int32_t* slots, int64_t n_tok, int64_t kv_dim, __half* k_cache,
              __half* v_cache, cudaStream_t s) {
  if (n_tok <= 0 || kv_dim <= 0) return;
  launch_kv_write(k, v, slots, n_tok, kv_dim, k_cache, v_cache, s);
}

}  // namespace sy::cuda
