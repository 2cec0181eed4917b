#include "kernels/cuda/embedding.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace sy::cuda {
namespace {

using cpu::weight_type;
constexpr int k_threads = 256;

// One block per token row (grid-stride over rows), threads stride over the row, each element
// decoded on its own from the raw row.
template <weight_type T>
__global__ void embed_rows_kernel(const unsigned char* __restrict__ table, int64_t row_bytes,
                                  const int32_t* __restrict__ ids, int64_t n_tokens, int64_t n_embd, int64_t n_vocab,
                                  float* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    const int64_t id = ids[t];
    float* dst = out + t * n_embd;
    if (id < 0 || id >= n_vocab) {
      for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) dst[i] = 0.f;
      continue;
    }
    const unsigned char* row = table + id * row_bytes;
    for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) dst[i] = quant::decode_element<T>(row, i);
  }
}

template <weight_type T>
void launch_embed_rows(const unsigned char* table, const int32_t* ids, int64_t n_tokens, int64_t n_embd,
                       int64_t n_vocab, float* out, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n_tokens, 65535));
  embed_rows_kernel<T><<<blocks, k_threads, 0, s>>>(table, static_cast<int64_t>(cpu::row_bytes(T, n_embd)), ids,
                                                    n_tokens, n_embd, n_vocab, out);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embed_rows(const void* table, cpu::weight_type type, const int32_t* ids, int64_t n_tokens, int64_t n_embd,
                int64_t n_vocab, float* out, cudaStream_t s) {
  const int64_t block = cpu::block_elements(type);
  if (n_embd % block != 0)
    throw std::invalid_argument(std::string("cuda::embed_rows: n_embd (") + std::to_string(n_embd) + ") of a " +
                                cpu::weight_type_name(type) + " table must be a multiple of " + std::to_string(block));
  if (n_tokens <= 0 || n_embd <= 0) return;
  const auto* t = static_cast<const unsigned char*>(table);
  switch (type) {
    case weight_type::f32:
      return launch_embed_rows<weight_type::f32>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::f16:
      return launch_embed_rows<weight_type::f16>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::bf16:
      return launch_embed_rows<weight_type::bf16>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::q4_0:
      return launch_embed_rows<weight_type::q4_0>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::q4_1:
      return launch_embed_rows<weight_type::q4_1>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::q8_0:
      return launch_embed_rows<weight_type::q8_0>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::q5_0:
      return launch_embed_rows<weight_type::q5_0>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::q5_1:
      return launch_embed_rows<weight_type::q5_1>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::q4_k:
      return launch_embed_rows<weight_type::q4_k>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::q5_k:
      return launch_embed_rows<weight_type::q5_k>(t, ids, n_tokens, n_embd, n_vocab, out, s);
    case weight_type::q6_k:
      return launch_embed_rows<weight_type::q6_k>(t, ids, n_tokens, n_embd, n_vocab, out, s);
  }
  throw std::invalid_argument("cuda::embed_rows: unknown weight type");
}

}  // namespace sy::cuda
