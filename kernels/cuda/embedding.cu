#include "kernels/cuda/embedding.cuh"

#include <algorithm>

#include "kernels/cuda/cuda_check.cuh"

namespace sy::cuda {
namespace {

constexpr int k_threads = 256;

// One block per token row (grid-stride over rows), threads stride over the row.
__global__ void embed_rows_kernel(const __half* __restrict__ table, const int32_t* __restrict__ ids, int64_t n_tokens,
                                  int64_t n_embd, int64_t n_vocab, float* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    const int64_t id = ids[t];
    float* dst = out + t * n_embd;
    if (id < 0 || id >= n_vocab) {
      for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) dst[i] = 0.f;
      continue;
    }
    const __half* src = table + id * n_embd;
    for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) dst[i] = __half2float(src[i]);
  }
}

void launch_embed_rows(const __half* table, const int32_t* ids, int64_t n_tokens, int64_t n_embd, int64_t n_vocab,
                       float* out, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n_tokens, 65535));
  embed_rows_kernel<<<blocks, k_threads, 0, s>>>(table, ids, n_tokens, n_embd, n_vocab, out);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embed_rows(const __half* table, const int32_t* ids, int64_t n_tokens, int64_t n_embd, int64_t n_vocab, float* out,
                cudaStream_t s) {
  if (n_tokens <= 0 || n_embd <= 0) return;
  launch_embed_rows(table, ids, n_tokens, n_embd, n_vocab, out, s);
}

}  // namespace sy::cuda
