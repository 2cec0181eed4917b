#include "kernels/cuda/dequantize.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace sy::cuda {
namespace {

using cpu::weight_type;
constexpr int k_threads = 256;

// Grid-stride over the n_rows * n_cols output elements, consecutive threads on consecutive
// columns. Each element is decoded on its own (quant_decode.cuh: bit for bit the CPU reference's
// fp32 value), then rounded to fp16 once (nearest even, as cpu::fp32_to_fp16).
template <weight_type T>
__global__ void dequantize_kernel(const unsigned char* __restrict__ src, int64_t row_bytes, int64_t n_rows,
                                  int64_t n_cols, __half* __restrict__ dst) {
  const int64_t n = n_rows * n_cols;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / n_cols, c = idx % n_cols;
    if constexpr (T == weight_type::f16) {
      dst[idx] = reinterpret_cast<const __half*>(src + r * row_bytes)[c];  // a plain copy
    } else {
      dst[idx] = __float2half_rn(quant::decode_element<T>(src + r * row_bytes, c));
    }
  }
}

template <weight_type T>
void launch_dequantize(const unsigned char* src, int64_t n_rows, int64_t n_cols, __half* dst, cudaStream_t s) {
  const int64_t n = n_rows * n_cols;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + k_threads - 1) / k_threads, 65535));
  dequantize_kernel<T>
      <<<blocks, k_threads, 0, s>>>(src, static_cast<int64_t>(cpu::row_bytes(T, n_cols)), n_rows, n_cols, dst);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void dequantize_to_f16(const void* src_device, cpu::weight_type type, int64_t n_rows, int64_t n_cols, __half* dst,
                       cudaStream_t s) {
  const int64_t block = cpu::block_elements(type);
  if (n_cols % block != 0)
    throw std::invalid_argument(std::string("cuda::dequantize_to_f16: n_cols (") + std::to_string(n_cols) + ") of a " +
                                cpu::weight_type_name(type) + " matrix must be a multiple of " + std::to_string(block));
  if (n_rows <= 0 || n_cols <= 0) return;
  const auto* src = static_cast<const unsigned char*>(src_device);
  switch (type) {
    case weight_type::f32:
      return launch_dequantize<weight_type::f32>(src, n_rows, n_cols, dst, s);
    case weight_type::f16:
      return launch_dequantize<weight_type::f16>(src, n_rows, n_cols, dst, s);
    case weight_type::bf16:
      return launch_dequantize<weight_type::bf16>(src, n_rows, n_cols, dst, s);
    case weight_type::q4_0:
      return launch_dequantize<weight_type::q4_0>(src, n_rows, n_cols, dst, s);
    case weight_type::q4_1:
      return launch_dequantize<weight_type::q4_1>(src, n_rows, n_cols, dst, s);
    case weight_type::q8_0:
      return launch_dequantize<weight_type::q8_0>(src, n_rows, n_cols, dst, s);
    case weight_type::q5_0:
      return launch_dequantize<weight_type::q5_0>(src, n_rows, n_cols, dst, s);
    case weight_type::q5_1:
      return launch_dequantize<weight_type::q5_1>(src, n_rows, n_cols, dst, s);
    case weight_type::q4_k:
      return launch_dequantize<weight_type::q4_k>(src, n_rows, n_cols, dst, s);
    case weight_type::q5_k:
      return launch_dequantize<weight_type::q5_k>(src, n_rows, n_cols, dst, s);
    case weight_type::q6_k:
      return launch_dequantize<weight_type::q6_k>(src, n_rows, n_cols, dst, s);
  }
  throw std::invalid_argument("cuda::dequantize_to_f16: unknown weight type");
}

}  // namespace sy::cuda
