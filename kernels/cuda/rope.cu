#include "kernels/cuda/rope.cuh"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cuda/cuda_check.cuh"

namespace sy::cuda {
namespace {

constexpr int k_threads = 128;

// One block per token (grid-stride over tokens). The token's n_pairs (cos, sin) are computed once
// into shared memory, then every (head, pair) of the token is rotated. The angle of pair i is
// built as cpu::rope builds it: theta = pos multiplied i times by theta_scale in fp32 (a closed-form
// pow would differ in the last bits, which large positions amplify), then
// freq_scale * (theta / ff[i]) with __fdiv_rn / __fmul_rn: IEEE division and no contraction, as
// on the CPU (where ff = 1 and freq_scale = 1 leave theta unchanged, here too).
// `pair_stride` / `other`: the first element of pair i is x[i * pair_stride], its partner
// `other` elements further (normal mode: 2 and 1; neox: 1 and n_pairs).
__global__ void __launch_bounds__(k_threads)
    rope_kernel(float* __restrict__ x, const int32_t* __restrict__ pos, int64_t n_tok, int64_t n_heads,
                int64_t head_dim, int n_pairs, float theta_scale, float freq_scale,
                const float* __restrict__ freq_factors, int pair_stride, int other) {
  extern __shared__ float cos_sin[];  // [n_pairs][2]
  const int64_t n_work = n_heads * n_pairs;
  for (int64_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
    const float p = static_cast<float>(pos[t]);
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
      float theta = p;
      for (int k = 0; k < i; ++k) theta = __fmul_rn(theta, theta_scale);
      const float ff = freq_factors ? freq_factors[i] : 1.0f;
      const float angle = __fmul_rn(freq_scale, __fdiv_rn(theta, ff));
      float s, c;
      sincosf(angle, &s, &c);
      cos_sin[2 * i] = c;
      cos_sin[2 * i + 1] = s;
    }
    __syncthreads();
    float* xt = x + t * n_heads * head_dim;
    for (int64_t j = threadIdx.x; j < n_work; j += blockDim.x) {
      const int64_t h = j / n_pairs, i = j % n_pairs;
      float* v = xt + h * head_dim + i * pair_stride;
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float a = v[0], b = v[other];
      v[0] = a * c - b * s;
      v[other] = a * s + b * c;
    }
    __syncthreads();  // the table is rewritten for the next token
  }
}

void launch_rope(float* x, const int32_t* pos, int64_t n_tok, int64_t n_heads, int64_t head_dim, int n_pairs,
                 float theta_scale, const rope_params& p, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n_tok, 65535));
  const size_t shmem = sizeof(float) * 2 * static_cast<size_t>(n_pairs);
  const int pair_stride = p.neox ? 1 : 2, other = p.neox ? n_pairs : 1;
  rope_kernel<<<blocks, k_threads, shmem, s>>>(x, pos, n_tok, n_heads, head_dim, n_pairs, theta_scale, p.freq_scale,
                                               p.freq_factors, pair_stride, other);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope(float* x, const int32_t* pos, int64_t n_tok, int64_t n_heads, int64_t head_dim, const rope_params& p,
          cudaStream_t s) {
  // 48 KiB of default shared memory holds 6144 (cos, sin) pairs: far above any head size.
  if (p.n_rot < 2 || p.n_rot % 2 != 0 || p.n_rot > head_dim || p.n_rot > 2 * 6144)
    throw std::invalid_argument("cuda::rope: n_rot must be even, >= 2 and <= head_dim");
  if (n_tok <= 0 || n_heads <= 0) return;
  // Same expression as the CPU reference, evaluated on the host, so both use the same scale.
  const float theta_scale = std::pow(p.base, -2.0f / static_cast<float>(p.n_rot));
  launch_rope(x, pos, n_tok, n_heads, head_dim, static_cast<int>(p.n_rot / 2), theta_scale, p, s);
}

}  // namespace sy::cuda
