// The GGUF decoder the CUDA weight readers share (kernels/cuda/quant_decode.cuh: dequantize_to_f16
// and embed_rows) against the CPU reference cpu::dequantize_row, bit for bit, for every weight type,
// run on the host: the decoder's indexing (nibbles, fifth bits, packed 6-bit scales and mins, q6_K's
// split quants) is the same code on both sides, so this checks it on any machine, device or not.
// The device run of the same comparison, through the kernels, is tests/gpu/test_cuda_ops.cpp.
// Needs no device: exits 0 or 1.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/quant.hpp"
#include "kernels/cuda/quant_decode.cuh"
#include "tests/gpu/random_weights.hpp"

namespace {

using sy::cpu::weight_type;

template <weight_type T>
float decode(const unsigned char* row, int64_t c) {
  return sy::cuda::quant::decode_element<T>(row, c);
}

float decode_any(weight_type t, const unsigned char* row, int64_t c) {
  switch (t) {
    case weight_type::f32:
      return decode<weight_type::f32>(row, c);
    case weight_type::f16:
      return decode<weight_type::f16>(row, c);
    case weight_type::bf16:
      return decode<weight_type::bf16>(row, c);
    case weight_type::q4_0:
      return decode<weight_type::q4_0>(row, c);
    case weight_type::q4_1:
      return decode<weight_type::q4_1>(row, c);
    case weight_type::q8_0:
      return decode<weight_type::q8_0>(row, c);
    case weight_type::q5_0:
      return decode<weight_type::q5_0>(row, c);
    case weight_type::q5_1:
      return decode<weight_type::q5_1>(row, c);
    case weight_type::q4_k:
      return decode<weight_type::q4_k>(row, c);
    case weight_type::q5_k:
      return decode<weight_type::q5_k>(row, c);
    case weight_type::q6_k:
      return decode<weight_type::q6_k>(row, c);
  }
  return 0.f;
}

}  // namespace

int main() {
  int failures = 0;
  uint32_t seed = 77;
  for (const weight_type t : sy::gpu_test::k_all_types) {
    const int64_t block = sy::cpu::block_elements(t);
    const int64_t n_rows = 300, n_cols = block == 256 ? 768 : (block == 32 ? 576 : 577);
    const auto w = sy::gpu_test::random_weights(t, n_rows, n_cols, seed += 7919);
    const size_t rb = sy::cpu::row_bytes(t, n_cols);
    std::vector<float> want(static_cast<size_t>(n_cols));
    int64_t bad = 0, first = -1;
    for (int64_t r = 0; r < n_rows; ++r) {
      const unsigned char* row = w.data() + r * rb;
      sy::cpu::dequantize_row(t, row, want.data(), n_cols);
      for (int64_t c = 0; c < n_cols; ++c) {
        const float got = decode_any(t, row, c);
        if (std::memcmp(&got, &want[c], 4) != 0 && bad++ == 0) first = r * n_cols + c;
      }
    }
    std::printf("%s quant_decode %-5s %lld x %lld: %lld differ%s\n",
                bad ? "FAIL" : "ok:  ", sy::cpu::weight_type_name(t), static_cast<long long>(n_rows),
                static_cast<long long>(n_cols), static_cast<long long>(bad),
                bad ? (" (first at " + std::to_string(first) + ")").c_str() : "");
    failures += bad != 0;
  }
  std::printf("%s quant_decode: %d of %zu types differ\n", failures ? "FAIL" : "PASS", failures,
              std::size(sy::gpu_test::k_all_types));
  return failures ? 1 : 0;
}
