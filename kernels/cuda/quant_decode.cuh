// Decoders of the GGUF weight formats (kernels/cpu/quant.hpp) for the device, one element at a time,
// shared by the two ops that read raw GGUF rows: dequantize.cu (weights -> fp16 at load) and
// embedding.cu (token rows -> fp32 per step); not an op of its own. The functions are also host
// functions, so that tests/gpu/test_quant_decode.cpp checks the decoding against the CPU reference
// on any machine, device or not (the device build is what serves; the host build is for tests).
//
// Exactness: decode_element<T>(row, c) equals cpu::dequantize_row(T, row, ...)[c] bit for bit for
// every finite block scale. The reference (kernels/cpu/quant.cpp, quant_k.cpp) is compiled by GCC
// with FMA available and -ffp-contract=fast (the C++ default), so it may fuse any `a * b + c`;
// nvcc fuses by default too. Neither can change a result here, because every product below is
// exact in fp32 and each element rounds at most once (its final add):
//   q8_0  d * q               d: fp16 (11 significant bits), |q| <= 128 (8 bits): <= 19 bits
//   q4_0  d * (q - 8)         <= 11 + 4 bits
//   q4_1  d * q + m           d * q <= 15 bits, exact; the add rounds once
//   q5_0  d * q + (-16 * d)   d * q <= 16 bits, -16 * d a power-of-two scaling: both exact, and
//                             their sum d * (q - 16) fits 16 bits: exact
//   q5_1  d * q + m           d * q <= 16 bits; the add rounds once
//   q4_K, q5_K  (d * sc) * q - dmin * m   sc, m < 64: d * sc <= 17 bits, times q < 32 <= 22 bits,
//                             dmin * m <= 17 bits; the subtraction rounds once
//   q6_K  (d * sc) * q        |sc| <= 128, |q| <= 32: 2047 * 128 * 32 < 2^24: exact
// (fp16 subnormal scales are fp32 normals with fewer significant bits: still exact; nothing here
// can overflow fp32.) A fused multiply-add of an exact product and an addend rounds exactly like
// the separate add, so GCC's and nvcc's contraction choices agree with the unfused order. Still,
// the device arithmetic below is __fmul_rn / __fadd_rn / __fsub_rn (mul_rn, add_rn, sub_rn), which
// nvcc never contracts, in the reference's evaluation order: should a future format break the
// exactness argument, the device keeps the reference's unfused order rather than a compiler's
// choice.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/quant.hpp"

namespace sy::cuda::quant {

using cpu::weight_type;

#define SY_QD_FN __host__ __device__ __forceinline__

SY_QD_FN float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SY_QD_FN float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SY_QD_FN float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
SY_QD_FN float bits_as_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

SY_QD_FN float half_bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// The 6-bit (scale, min) pair j < 8 of a q4_K / q5_K super-block: cpu::k_scale_min on the device.
SY_QD_FN void k_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The 5-bit value of element j < 32 of a q5_0 / q5_1 block from its qh (4 bytes, read bytewise:
// the block is only 2-byte aligned) and qs: byte j % 16 of qs holds element j in its low nibble
// (j < 16) or high nibble (j >= 16); bit j of the little-endian qh is its fifth bit.
SY_QD_FN int q5_value(const uint8_t* qh, const uint8_t* qs, int j) {
  const int nib = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
  return nib | (((qh[j >> 3] >> (j & 7)) & 1) << 4);
}

// Element c of the row starting at `row` (2-byte aligned; 4 for f32), in fp32 exactly as
// cpu::dequantize_row gives it (see the top of this file).
template <weight_type T>
SY_QD_FN float decode_element(const unsigned char* row, int64_t c) {
  if constexpr (T == weight_type::f32) {
    return reinterpret_cast<const float*>(row)[c];
  } else if constexpr (T == weight_type::f16) {
    return half_bits(reinterpret_cast<const uint16_t*>(row)[c]);
  } else if constexpr (T == weight_type::bf16) {
    return bits_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[c]) << 16);
  } else if constexpr (T == weight_type::q4_0 || T == weight_type::q4_1 || T == weight_type::q8_0 ||
                       T == weight_type::q5_0 || T == weight_type::q5_1) {
    const int64_t b = c / cpu::qk;
    const int j = static_cast<int>(c % cpu::qk);
    if constexpr (T == weight_type::q8_0) {
      const auto& blk = reinterpret_cast<const cpu::block_q8_0*>(row)[b];
      return mul_rn(half_bits(blk.d), static_cast<float>(blk.qs[j]));
    } else if constexpr (T == weight_type::q4_0) {
      const auto& blk = reinterpret_cast<const cpu::block_q4_0*>(row)[b];
      const int q = j < 16 ? (blk.qs[j] & 15) : (blk.qs[j - 16] >> 4);
      return mul_rn(half_bits(blk.d), static_cast<float>(q - 8));
    } else if constexpr (T == weight_type::q4_1) {
      const auto& blk = reinterpret_cast<const cpu::block_q4_1*>(row)[b];
      const int q = j < 16 ? (blk.qs[j] & 15) : (blk.qs[j - 16] >> 4);
      return add_rn(mul_rn(half_bits(blk.d), static_cast<float>(q)), half_bits(blk.m));
    } else if constexpr (T == weight_type::q5_0) {
      // The reference: m = -16.f * d, then d * q + m.
      const auto& blk = reinterpret_cast<const cpu::block_q5_0*>(row)[b];
      const float d = half_bits(blk.d);
      const float q = static_cast<float>(q5_value(blk.qh, blk.qs, j));
      return add_rn(mul_rn(d, q), mul_rn(-16.f, d));
    } else {
      const auto& blk = reinterpret_cast<const cpu::block_q5_1*>(row)[b];
      const float q = static_cast<float>(q5_value(blk.qh, blk.qs, j));
      return add_rn(mul_rn(half_bits(blk.d), q), half_bits(blk.m));
    }
  } else if constexpr (T == weight_type::q4_k || T == weight_type::q5_k) {
    // Element e of a super-block: sub-block j = e / 32 (its scale and min); g = e / 64 picks 32
    // bytes of qs, l = e % 32 the byte, (e / 32) % 2 the nibble; q5_K's fifth bit is bit
    // 2g + (e / 32) % 2 of qh[l].
    using block = std::conditional_t<T == weight_type::q4_k, cpu::block_q4_K, cpu::block_q5_K>;
    const auto& blk = reinterpret_cast<const block*>(row)[c / cpu::qk_k];
    const int e = static_cast<int>(c % cpu::qk_k);
    const int j = e / 32, g = e / 64, l = e % 32, half = j & 1;
    const uint8_t byte = blk.qs[32 * g + l];
    int q = half ? byte >> 4 : byte & 15;
    if constexpr (T == weight_type::q5_k) q |= ((blk.qh[l] >> (2 * g + half)) & 1) << 4;
    int sc, m;
    k_scale_min(j, blk.scales, sc, m);
    // The reference: d * sc[j] * q[e] - dmin * mn[j], i.e. ((d * sc) * q) - (dmin * m).
    const float dq = mul_rn(mul_rn(half_bits(blk.d), static_cast<float>(sc)), static_cast<float>(q));
    return sub_rn(dq, mul_rn(half_bits(blk.dmin), static_cast<float>(m)));
  } else {
    static_assert(T == weight_type::q6_k, "unhandled weight type");
    // Element e = 128n + 32c + l: low 4 bits in ql[64n + l + 32 (c & 1)] (low nibble for c < 2),
    // top 2 bits at bit 2c of qh[32n + l]; value q - 32 times the scale of its 16-element group.
    const auto& blk = reinterpret_cast<const cpu::block_q6_K*>(row)[c / cpu::qk_k];
    const int e = static_cast<int>(c % cpu::qk_k);
    const int n = e / 128, cq = (e % 128) / 32, l = e % 32;
    const uint8_t lbyte = blk.ql[64 * n + l + 32 * (cq & 1)];
    const int lo = cq < 2 ? lbyte & 15 : lbyte >> 4;
    const int hi = (blk.qh[32 * n + l] >> (2 * cq)) & 3;
    const int q = (lo | (hi << 4)) - 32;
    // The reference: d * scales[e / 16] * q, i.e. (d * sc) * q.
    return mul_rn(mul_rn(half_bits(blk.d), static_cast<float>(blk.scales[e / 16])), static_cast<float>(q));
  }
}

#undef SY_QD_FN

}  // namespace sy::cuda::quant
