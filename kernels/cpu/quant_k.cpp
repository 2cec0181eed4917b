// Reference (scalar) conversions of the K-quant formats (quant.hpp): dequantization, the q8_K
// activation quantization and the dot products the fast kernels must reproduce exactly in their
// integer part.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/quant.hpp"

namespace sy::cpu {
namespace {

// The 256 unsigned values and per-sub-block (scale, min) of a q4_K/q5_K super-block.
void unpack_q45_k(weight_type t, const uint8_t* blk, uint8_t* q, uint8_t* sc, uint8_t* mn, float& d, float& dmin) {
  const uint8_t* qs;
  const uint8_t* qh = nullptr;
  const uint8_t* scales;
  if (t == weight_type::q4_k) {
    const auto& b = *reinterpret_cast<const block_q4_K*>(blk);
    d = fp16_to_fp32(b.d);
    dmin = fp16_to_fp32(b.dmin);
    scales = b.scales;
    qs = b.qs;
  } else {
    const auto& b = *reinterpret_cast<const block_q5_K*>(blk);
    d = fp16_to_fp32(b.d);
    dmin = fp16_to_fp32(b.dmin);
    scales = b.scales;
    qs = b.qs;
    qh = b.qh;
  }
  for (int j = 0; j < 8; ++j) k_scale_min(j, scales, sc[j], mn[j]);
  for (int g = 0; g < 4; ++g)
    for (int l = 0; l < 32; ++l) {
      uint8_t lo = qs[32 * g + l] & 15, hi = qs[32 * g + l] >> 4;
      if (qh) {
        lo |= ((qh[l] >> (2 * g)) & 1) << 4;
        hi |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
      }
      q[64 * g + l] = lo;
      q[64 * g + 32 + l] = hi;
    }
}

// The 256 values (q - 32, in [-32, 31]) and the 16 scales of a q6_K super-block.
void unpack_q6_k(const block_q6_K& b, int8_t* q) {
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const uint8_t lbyte = b.ql[64 * n + l + 32 * (c & 1)];
        const int lo = c < 2 ? lbyte & 15 : lbyte >> 4;
        const int hi = (b.qh[32 * n + l] >> (2 * c)) & 3;
        q[128 * n + 32 * c + l] = static_cast<int8_t>((lo | (hi << 4)) - 32);
      }
}

}  // namespace

void unpack_k_block(weight_type t, const void* blk, uint8_t* q, int8_t* sc, uint8_t* mn) {
  if (t == weight_type::q6_k) {
    const auto& b = *static_cast<const block_q6_K*>(blk);
    int8_t v[256];
    unpack_q6_k(b, v);
    for (int e = 0; e < 256; ++e) q[e] = static_cast<uint8_t>(v[e] + 32);
    std::memcpy(sc, b.scales, 16);
    return;
  }
  uint8_t s[8];
  float d, dmin;
  unpack_q45_k(t, static_cast<const uint8_t*>(blk), q, s, mn, d, dmin);
  for (int j = 0; j < 8; ++j) sc[j] = static_cast<int8_t>(s[j]);
}

namespace {

size_t k_block_bytes(weight_type t) {
  return t == weight_type::q4_k ? sizeof(block_q4_K) : t == weight_type::q5_k ? sizeof(block_q5_K) : sizeof(block_q6_K);
}

}  // namespace

void dequantize_row_k(weight_type t, const void* row, float* out, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(row);
  const size_t bytes = k_block_bytes(t);
  for (int64_t i = 0; i < n / qk_k; ++i, p += bytes, out += qk_k) {
    if (t == weight_type::q6_k) {
      const auto& b = *reinterpret_cast<const block_q6_K*>(p);
      int8_t q[256];
      unpack_q6_k(b, q);
      const float d = fp16_to_fp32(b.d);
      for (int e = 0; e < 256; ++e) out[e] = d * b.scales[e / 16] * q[e];
      continue;
    }
    uint8_t q[256], sc[8], mn[8];
    float d, dmin;
    unpack_q45_k(t, p, q, sc, mn, d, dmin);
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32;
      out[e] = d * sc[j] * q[e] - dmin * mn[j];
    }
  }
}

void quantize_row_q8_K(const float* x, block_q8_K* y, int64_t n) {
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) {
    // ggml's rule: the element of largest magnitude maps to -127 (its sign kept in the scale),
    // values round to nearest (ties to even) and are capped at 127.
    float amax = 0, vmax = 0;
    bool finite = true;
    for (int j = 0; j < qk_k; ++j) {
      const float a = std::fabs(x[j]);
      finite = finite && std::isfinite(a);
      if (a > amax) {
        amax = a;
        vmax = x[j];
      }
    }
    block_q8_K& b = y[i];
    if (!finite || amax == 0) {
      set_q8_K_unscaled(b, finite);
      continue;
    }
    const float iscale = -127.f / vmax;
    for (int j = 0; j < qk_k; ++j) {  // finite here, so a plain clamp (an inlined min/max)
      const float v = std::nearbyint(iscale * x[j]);
      b.qs[j] = static_cast<int8_t>(std::clamp(v, -128.f, 127.f));
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += b.qs[16 * g + j];
      b.bsums[g] = static_cast<int16_t>(s);
    }
    for (int g = 0; g < 8; ++g) b.sums32[g] = static_cast<int16_t>(b.bsums[2 * g] + b.bsums[2 * g + 1]);
    b.d = 1.f / iscale;
  }
}

float dot_row_q8_K_ref(weight_type t, const void* row, const block_q8_K* a, int64_t n) {
  if (!is_k_quant(t)) throw std::logic_error("dot_row_q8_K_ref: not a K-quant type");
  const auto* p = static_cast<const uint8_t*>(row);
  const size_t bytes = k_block_bytes(t);
  double acc = 0;
  for (int64_t i = 0; i < n / qk_k; ++i, p += bytes) {
    const block_q8_K& y = a[i];
    if (t == weight_type::q6_k) {
      const auto& b = *reinterpret_cast<const block_q6_K*>(p);
      int8_t q[256];
      unpack_q6_k(b, q);
      int64_t isum = 0;
      for (int j = 0; j < 16; ++j) {
        int s = 0;
        for (int l = 0; l < 16; ++l) s += q[16 * j + l] * y.qs[16 * j + l];
        isum += static_cast<int64_t>(b.scales[j]) * s;
      }
      acc += static_cast<double>(fp16_to_fp32(b.d) * y.d) * static_cast<double>(isum);
      continue;
    }
    uint8_t q[256], sc[8], mn[8];
    float d, dmin;
    unpack_q45_k(t, p, q, sc, mn, d, dmin);
    int64_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      int s = 0;
      for (int l = 0; l < 32; ++l) s += q[32 * j + l] * y.qs[32 * j + l];
      isum += static_cast<int64_t>(sc[j]) * s;
      msum += static_cast<int64_t>(mn[j]) * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
    }
    acc += static_cast<double>(d * y.d) * static_cast<double>(isum) -
           static_cast<double>(dmin * y.d) * static_cast<double>(msum);
  }
  return static_cast<float>(acc);
}

}  // namespace sy::cpu
