#include "kernels/cuda/dequantize.cuh"

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/cuda_check.cuh"

namespace sy::cuda {
namespace {

using cpu::weight_type;
constexpr int k_threads = 256;

// Bytes of one row (the header-only twin of cpu::row_bytes, which lives in sy_kernels_cpu).
int64_t bytes_per_row(weight_type t, int64_t n_cols) {
  switch (t) {
    case weight_type::f32:
      return 4 * n_cols;
    case weight_type::f16:
    case weight_type::bf16:
      return 2 * n_cols;
    case weight_type::q4_0:
      return n_cols / cpu::qk * static_cast<int64_t>(sizeof(cpu::block_q4_0));
    case weight_type::q4_1:
      return n_cols / cpu::qk * static_cast<int64_t>(sizeof(cpu::block_q4_1));
    case weight_type::q8_0:
      return n_cols / cpu::qk * static_cast<int64_t>(sizeof(cpu::block_q8_0));
  }
  return 0;
}

// Element c of a row starting at `row`, as cpu::dequantize_row computes it in fp32. q4 blocks hold
// element j in the low nibble of byte j and element j + 16 in the high nibble (j < 16). The scale
// d is fp16 (11 significant bits) and a quant has at most 8, so d * q is exact in fp32; only q4_1's
// "+ m" rounds, once, whether or not a compiler fuses it into an FMA (GCC does on the CPU side).
// Hence the device matches the CPU reference bit for bit.
template <weight_type T>
__device__ __forceinline__ float load_element(const unsigned char* row, int64_t c) {
  if constexpr (T == weight_type::f32) {
    return reinterpret_cast<const float*>(row)[c];
  } else if constexpr (T == weight_type::f16) {
    return __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(row)[c]));
  } else if constexpr (T == weight_type::bf16) {
    const unsigned bits = static_cast<unsigned>(reinterpret_cast<const unsigned short*>(row)[c]) << 16;
    return __uint_as_float(bits);
  } else {
    const int64_t b = c / cpu::qk;
    const int j = static_cast<int>(c % cpu::qk);
    if constexpr (T == weight_type::q8_0) {
      const auto& blk = reinterpret_cast<const cpu::block_q8_0*>(row)[b];
      return __half2float(__ushort_as_half(blk.d)) * static_cast<float>(blk.qs[j]);
    } else if constexpr (T == weight_type::q4_0) {
      const auto& blk = reinterpret_cast<const cpu::block_q4_0*>(row)[b];
      const int q = j < 16 ? (blk.qs[j] & 15) : (blk.qs[j - 16] >> 4);
      return __half2float(__ushort_as_half(blk.d)) * static_cast<float>(q - 8);
    } else {
      static_assert(T == weight_type::q4_1, "unhandled weight type");
      const auto& blk = reinterpret_cast<const cpu::block_q4_1*>(row)[b];
      const int q = j < 16 ? (blk.qs[j] & 15) : (blk.qs[j - 16] >> 4);
      return __half2float(__ushort_as_half(blk.d)) * static_cast<float>(q) + __half2float(__ushort_as_half(blk.m));
    }
  }
}

// Grid-stride over the n_rows * n_cols output elements, consecutive threads on consecutive columns.
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
      dst[idx] = __float2half_rn(load_element<T>(src + r * row_bytes, c));
    }
  }
}

template <weight_type T>
void launch_dequantize(const unsigned char* src, int64_t n_rows, int64_t n_cols, __half* dst, cudaStream_t s) {
  const int64_t n = n_rows * n_cols;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + k_threads - 1) / k_threads, 65535));
  dequantize_kernel<T><<<blocks, k_threads, 0, s>>>(src, bytes_per_row(T, n_cols), n_rows, n_cols, dst);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void dequantize_to_f16(const void* src_device, cpu::weight_type type, int64_t n_rows, int64_t n_cols, __half* dst,
                       cudaStream_t s) {
  const bool blocked = type == weight_type::q4_0 || type == weight_type::q4_1 || type == weight_type::q8_0;
  if (blocked && n_cols % cpu::qk != 0)
    throw std::invalid_argument("cuda::dequantize_to_f16: n_cols of a block type must be a multiple of 32");
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
  }
  throw std::invalid_argument("cuda::dequantize_to_f16: unknown weight type");
}

}  // namespace sy::cuda
