#include "kernels/cpu/quant.hpp"

#include <immintrin.h>

#include <cmath>
#include <stdexcept>

namespace sy::cpu {

// The 32 unsigned 5-bit values of a q5_0/q5_1 block from its qh (4 bytes) followed by qs (16).
void unpack_q5(const uint8_t* qh_qs, uint8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_qs, 4);
  const uint8_t* qs = qh_qs + 4;
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 15) | (((qh >> j) & 1) << 4));
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

const char* weight_type_name(weight_type t) {
  switch (t) {
    case weight_type::f32:
      return "f32";
    case weight_type::f16:
      return "f16";
    case weight_type::bf16:
      return "bf16";
    case weight_type::q4_0:
      return "q4_0";
    case weight_type::q4_1:
      return "q4_1";
    case weight_type::q8_0:
      return "q8_0";
    case weight_type::q5_0:
      return "q5_0";
    case weight_type::q5_1:
      return "q5_1";
    case weight_type::q4_k:
      return "q4_K";
    case weight_type::q5_k:
      return "q5_K";
    case weight_type::q6_k:
      return "q6_K";
  }
  return "?";
}

int64_t block_elements(weight_type t) {
  if (is_float_type(t)) return 1;
  return is_k_quant(t) ? qk_k : qk;
}

size_t row_bytes(weight_type t, int64_t n) {
  switch (t) {
    case weight_type::f32:
      return 4 * n;
    case weight_type::f16:
    case weight_type::bf16:
      return 2 * n;
    case weight_type::q4_0:
      return n / qk * sizeof(block_q4_0);
    case weight_type::q4_1:
      return n / qk * sizeof(block_q4_1);
    case weight_type::q8_0:
      return n / qk * sizeof(block_q8_0);
    case weight_type::q5_0:
      return n / qk * sizeof(block_q5_0);
    case weight_type::q5_1:
      return n / qk * sizeof(block_q5_1);
    case weight_type::q4_k:
      return n / qk_k * sizeof(block_q4_K);
    case weight_type::q5_k:
      return n / qk_k * sizeof(block_q5_K);
    case weight_type::q6_k:
      return n / qk_k * sizeof(block_q6_K);
  }
  return 0;
}

float fp16_to_fp32(uint16_t h) { return _cvtsh_ss(h); }
uint16_t fp32_to_fp16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

void dequantize_row(weight_type t, const void* row, float* out, int64_t n) {
  switch (t) {
    case weight_type::f32:
      std::memcpy(out, row, 4 * n);
      return;
    case weight_type::f16: {
      auto* p = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(p[i]);
      return;
    }
    case weight_type::bf16: {
      auto* p = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_fp32(p[i]);
      return;
    }
    case weight_type::q4_0: {
      auto* b = static_cast<const block_q4_0*>(row);
      for (int64_t i = 0; i < n / qk; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < 16; ++j) {
          out[i * qk + j] = d * ((b[i].qs[j] & 15) - 8);
          out[i * qk + j + 16] = d * ((b[i].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case weight_type::q4_1: {
      auto* b = static_cast<const block_q4_1*>(row);
      for (int64_t i = 0; i < n / qk; ++i) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        for (int j = 0; j < 16; ++j) {
          out[i * qk + j] = d * (b[i].qs[j] & 15) + m;
          out[i * qk + j + 16] = d * (b[i].qs[j] >> 4) + m;
        }
      }
      return;
    }
    case weight_type::q8_0: {
      auto* b = static_cast<const block_q8_0*>(row);
      for (int64_t i = 0; i < n / qk; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < qk; ++j) out[i * qk + j] = d * b[i].qs[j];
      }
      return;
    }
    case weight_type::q5_0:
    case weight_type::q5_1: {
      const bool q5_1 = t == weight_type::q5_1;
      const auto* p = static_cast<const uint8_t*>(row);
      const size_t bytes = q5_1 ? sizeof(block_q5_1) : sizeof(block_q5_0);
      for (int64_t i = 0; i < n / qk; ++i) {
        uint8_t q[32];
        const float d = fp16_to_fp32(q5_1 ? reinterpret_cast<const block_q5_1*>(p)[i].d
                                          : reinterpret_cast<const block_q5_0*>(p)[i].d);
        const float m = q5_1 ? fp16_to_fp32(reinterpret_cast<const block_q5_1*>(p)[i].m) : -16.f * d;
        unpack_q5(p + i * bytes + (q5_1 ? 4 : 2), q);
        for (int j = 0; j < qk; ++j) out[i * qk + j] = d * q[j] + m;
      }
      return;
    }
    case weight_type::q4_k:
    case weight_type::q5_k:
    case weight_type::q6_k:
      dequantize_row_k(t, row, out, n);
      return;
  }
  throw std::logic_error("dequantize_row: unknown type");
}

void quantize_row_q8_act(const float* x, block_q8_act* out, int64_t n) {
  for (int64_t i = 0; i < n / qk; ++i) {
    const float* xb = x + i * qk;
    float amax = 0;
    for (int j = 0; j < qk; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.f;
    // A non-finite activation (a diverged model) must not reach the float->int conversion:
    // quantize the block to zeros with a NaN scale, so the NaN shows in the output.
    const float id = d > 0 && std::isfinite(d) ? 1.f / d : 0.f;
    int sum = 0;
    for (int j = 0; j < qk; ++j) {
      // Clamped (fmax/fmin also map NaN into range): no undefined float->int conversion.
      const int q = static_cast<int>(std::nearbyint(std::fmin(127.f, std::fmax(-127.f, xb[j] * id))));
      out[i].qs[j] = static_cast<int8_t>(q);
      sum += q;
    }
    out[i].d = d;
    out[i].s = d * static_cast<float>(sum);
  }
}

float dot_row_q8_act_ref(weight_type t, const void* row, const block_q8_act* a, int64_t n) {
  double acc = 0;
  const int64_t nb = n / qk;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    float dw = 0, cw = 0;
    switch (t) {
      case weight_type::q4_0: {
        auto& b = static_cast<const block_q4_0*>(row)[i];
        for (int j = 0; j < 16; ++j) isum += (b.qs[j] & 15) * a[i].qs[j] + (b.qs[j] >> 4) * a[i].qs[j + 16];
        dw = fp16_to_fp32(b.d);
        cw = -8 * dw;
        break;
      }
      case weight_type::q4_1: {
        auto& b = static_cast<const block_q4_1*>(row)[i];
        for (int j = 0; j < 16; ++j) isum += (b.qs[j] & 15) * a[i].qs[j] + (b.qs[j] >> 4) * a[i].qs[j + 16];
        dw = fp16_to_fp32(b.d);
        cw = fp16_to_fp32(b.m);
        break;
      }
      case weight_type::q8_0: {
        auto& b = static_cast<const block_q8_0*>(row)[i];
        for (int j = 0; j < qk; ++j) isum += b.qs[j] * a[i].qs[j];
        dw = fp16_to_fp32(b.d);
        cw = 0;
        break;
      }
      case weight_type::q5_0:
      case weight_type::q5_1: {
        const bool q5_1 = t == weight_type::q5_1;
        const auto* p = static_cast<const uint8_t*>(row) + i * (q5_1 ? sizeof(block_q5_1) : sizeof(block_q5_0));
        uint8_t q[32];
        unpack_q5(p + (q5_1 ? 4 : 2), q);
        for (int j = 0; j < qk; ++j) isum += q[j] * a[i].qs[j];
        uint16_t d, m;
        std::memcpy(&d, p, 2);
        std::memcpy(&m, p + 2, 2);
        dw = fp16_to_fp32(d);
        cw = q5_1 ? fp16_to_fp32(m) : -16.f * dw;
        break;
      }
      default:
        throw std::logic_error("dot_row_q8_act_ref: not an integer type");
    }
    acc += static_cast<double>(dw) * a[i].d * isum + static_cast<double>(cw) * a[i].s;
  }
  return static_cast<float>(acc);
}

}  // namespace sy::cpu
