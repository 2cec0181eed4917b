// Random GGUF weight rows of every type for the parity tests of the CUDA weight readers
// (dequantize, embedding gather): tests/gpu/test_cuda_ops.cpp on a device, and
// tests/gpu/test_quant_decode.cpp, which checks the shared decoder on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/quant.hpp"

namespace sy::gpu_test {

inline constexpr cpu::weight_type k_all_types[] = {
    cpu::weight_type::f32,  cpu::weight_type::f16,  cpu::weight_type::bf16, cpu::weight_type::q4_0,
    cpu::weight_type::q4_1, cpu::weight_type::q8_0, cpu::weight_type::q5_0, cpu::weight_type::q5_1,
    cpu::weight_type::q4_k, cpu::weight_type::q5_k, cpu::weight_type::q6_k};

// n_rows rows of random weights of type t, as GGUF stores them (the idea of
// tests/unit/test_kernels.cpp's random_weights): float types from a normal distribution with some
// fp16 subnormals and fp16 overflows; block types random bytes everywhere (quants, q5 fifth bits,
// the K-quants' packed 6-bit scales and mins, q6_K's int8 scales), then sane fp16 block scales —
// except every fifth block, whose fp16 scales are random finite bit patterns (subnormals up to
// 65504): the exactness argument of kernels/cuda/quant_decode.cuh must hold for any of them.
inline std::vector<uint8_t> random_weights(cpu::weight_type t, int64_t n_rows, int64_t n_cols, uint32_t seed) {
  using cpu::weight_type;
  const size_t rb = cpu::row_bytes(t, n_cols);
  std::vector<uint8_t> out(rb * n_rows);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> sc(0.001f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto put16 = [&](size_t at, uint16_t h) { std::memcpy(out.data() + at, &h, 2); };
  auto any_finite_half = [&] {
    uint16_t h;
    do h = static_cast<uint16_t>(byte(rng) | byte(rng) << 8);
    while ((h & 0x7C00) == 0x7C00);
    return h;
  };
  switch (t) {
    case weight_type::f32:
      for (size_t i = 0; i < out.size() / 4; ++i) {
        // Mostly ordinary weights; some fp16 subnormals and some values that overflow fp16.
        const float f = normal(rng) * (i % 11 == 0 ? 1e-6f : (i % 13 == 0 ? 1e5f : 1.f));
        std::memcpy(out.data() + 4 * i, &f, 4);
      }
      return out;
    case weight_type::f16:
      for (size_t i = 0; i < out.size() / 2; ++i) put16(2 * i, cpu::fp32_to_fp16(normal(rng)));
      return out;
    case weight_type::bf16:
      for (size_t i = 0; i < out.size() / 2; ++i)
        put16(2 * i, cpu::fp32_to_bf16(normal(rng) * (i % 11 == 0 ? 1e-7f : 1.f)));
      return out;
    default:
      break;
  }
  for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
  // Per type: bytes of a block, offset of d, offset of the second fp16 scale (m or dmin; -1: none),
  // and what a sane d is multiplied by (test_kernels.cpp's choices).
  size_t block = 0;
  int at_d = 0, at_m = -1;
  float d_mul = 1.f;
  switch (t) {
    case weight_type::q4_0:
      block = sizeof(cpu::block_q4_0);
      break;
    case weight_type::q4_1:
      block = sizeof(cpu::block_q4_1), at_m = 2;
      break;
    case weight_type::q8_0:
      block = sizeof(cpu::block_q8_0), d_mul = 1.f / 16;
      break;
    case weight_type::q5_0:
      block = sizeof(cpu::block_q5_0), d_mul = 0.5f;
      break;
    case weight_type::q5_1:
      block = sizeof(cpu::block_q5_1), at_m = 2, d_mul = 0.5f;
      break;
    case weight_type::q4_k:
      block = sizeof(cpu::block_q4_K), at_m = 2, d_mul = 1.f / 32;
      break;
    case weight_type::q5_k:
      block = sizeof(cpu::block_q5_K), at_m = 2, d_mul = 1.f / 32;
      break;
    case weight_type::q6_k:
      block = sizeof(cpu::block_q6_K), at_d = offsetof(cpu::block_q6_K, d), d_mul = 1.f / 64;
      break;
    default:
      throw std::logic_error("random_weights: unhandled type");
  }
  const bool k_quant = cpu::is_k_quant(t);
  size_t i = 0;
  for (size_t at = 0; at < out.size(); at += block, ++i) {
    if (i % 5 == 4) {
      put16(at + at_d, any_finite_half());
      if (at_m >= 0) put16(at + at_m, any_finite_half());
      continue;
    }
    put16(at + at_d, cpu::fp32_to_fp16(sc(rng) * d_mul));
    // q4_1 / q5_1: the block minimum m; K-quants: dmin, the scale of the 6-bit mins.
    if (at_m >= 0) put16(at + at_m, cpu::fp32_to_fp16(k_quant ? sc(rng) / 8 : normal(rng) * 0.1f));
  }
  return out;
}

}  // namespace sy::gpu_test
