// Operands and scalar references shared by the AMX kernel tests: test_amx_emulation.cpp (the
// kernels' loops on the tile model, any CPU) and test_kernels_amx.cpp (the tile instructions,
// AMX machines). The references are built from the definitions (the panel layout formula, the
// GGUF blocks), not from the repacking code, so a layout bug cannot cancel out.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/cpu/quant.hpp"

namespace amx_test {

using namespace sy::cpu;

inline std::mt19937& rng() {
  static std::mt19937 r(4321);
  return r;
}

inline std::vector<float> random_floats(size_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = fp32_to_bf16(v[i]);
  return b;
}

// A rows x cols bf16 matrix (row-major) and its 16-row panels by the layout's definition:
// panels[p * 16 * cols + kp * 32 + 2 i + j] = W[16 p + i][2 kp + j], zero past the last row.
struct bf16_matrix {
  int64_t rows = 0, cols = 0, n_panels = 0;
  std::vector<uint16_t> w, panels;
};
inline bf16_matrix random_bf16_matrix(int64_t rows, int64_t cols) {
  bf16_matrix m;
  m.rows = rows;
  m.cols = cols;
  m.n_panels = (rows + panel_rows - 1) / panel_rows;
  m.w = to_bf16(random_floats(static_cast<size_t>(rows * cols), 0.1f));
  m.panels.assign(static_cast<size_t>(m.n_panels * panel_rows * cols), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m.panels[(r / panel_rows) * panel_rows * cols + (c / 2) * 32 + 2 * (r % panel_rows) + c % 2] = m.w[r * cols + c];
  return m;
}

// y[t][r] = sum_k W[r][k] x[t][k] in double, for rows of panels [p0, p1) (clipped to the matrix).
inline double bf16_dot(const bf16_matrix& m, int64_t r, const uint16_t* x) {
  double s = 0;
  for (int64_t c = 0; c < m.cols; ++c) s += static_cast<double>(bf16_to_fp32(m.w[r * m.cols + c])) * bf16_to_fp32(x[c]);
  return s;
}

// GGUF rows of a random q4_0 / q4_1 / q8_0 matrix.
inline std::vector<uint8_t> random_int_weights(weight_type t, int64_t rows, int64_t cols) {
  std::vector<uint8_t> w(row_bytes(t, cols) * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.001f, 0.05f);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + r * row_bytes(t, cols);
    for (int64_t i = 0; i < cols / qk; ++i) {
      if (t == weight_type::q4_0) {
        auto& b = reinterpret_cast<block_q4_0*>(row)[i];
        b.d = fp32_to_fp16(sc(rng()));
        for (auto& q : b.qs) q = static_cast<uint8_t>(byte(rng()));
      } else if (t == weight_type::q4_1) {
        auto& b = reinterpret_cast<block_q4_1*>(row)[i];
        b.d = fp32_to_fp16(sc(rng()));
        b.m = fp32_to_fp16(-8 * sc(rng()));
        for (auto& q : b.qs) q = static_cast<uint8_t>(byte(rng()));
      } else if (t == weight_type::q5_0) {
        auto& b = reinterpret_cast<block_q5_0*>(row)[i];
        b.d = fp32_to_fp16(sc(rng()) / 2);
        for (auto& q : b.qh) q = static_cast<uint8_t>(byte(rng()));  // every fifth bit, both values
        for (auto& q : b.qs) q = static_cast<uint8_t>(byte(rng()));
      } else if (t == weight_type::q5_1) {
        auto& b = reinterpret_cast<block_q5_1*>(row)[i];
        b.d = fp32_to_fp16(sc(rng()) / 2);
        b.m = fp32_to_fp16(-16 * sc(rng()) / 2);
        for (auto& q : b.qh) q = static_cast<uint8_t>(byte(rng()));
        for (auto& q : b.qs) q = static_cast<uint8_t>(byte(rng()));
      } else {
        auto& b = reinterpret_cast<block_q8_0*>(row)[i];
        b.d = fp32_to_fp16(sc(rng()) / 16);
        // The full int8 range, -128 included (u = 0): the extremes of the unsigned weight bytes.
        for (auto& q : b.qs) q = static_cast<int8_t>(byte(rng()) - 128);
      }
    }
  }
  return w;
}

// GGUF rows of a random q4_K / q5_K / q6_K matrix: random bytes everywhere (values, scales, mins),
// then sane super-block scales (the extremes of every 4/5/6-bit value and scale occur).
inline std::vector<uint8_t> random_k_weights(weight_type t, int64_t rows, int64_t cols) {
  std::vector<uint8_t> w(row_bytes(t, cols) * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.001f, 0.05f);
  const size_t bytes = row_bytes(t, qk_k);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols / qk_k; ++i) {
      uint8_t* b = w.data() + r * row_bytes(t, cols) + i * bytes;
      for (size_t j = 0; j < bytes; ++j) b[j] = static_cast<uint8_t>(byte(rng()));
      if (t == weight_type::q6_k) {
        const uint16_t d = fp32_to_fp16(sc(rng()) / 64);
        std::memcpy(b + bytes - 2, &d, 2);
      } else {
        const uint16_t d = fp32_to_fp16(sc(rng()) / 32), dmin = fp32_to_fp16(sc(rng()) / 8);
        std::memcpy(b, &d, 2);
        std::memcpy(b + 2, &dmin, 2);
      }
    }
  return w;
}

// Each token's q8_K blocks in a row (k / 256 per token), by the scalar quantizer.
inline std::vector<block_q8_K> quantize_k_batch(const std::vector<float>& x, int64_t n_tok, int64_t k) {
  std::vector<block_q8_K> a(static_cast<size_t>(n_tok * (k / qk_k)));
  for (int64_t t = 0; t < n_tok; ++t) quantize_row_q8_K(x.data() + t * k, a.data() + t * (k / qk_k), k);
  return a;
}

// Activations of n_tok tokens as the AVX-512 / AMX integer kernels take them (q8_act_batch),
// quantized by the scalar definition (quantize_q8_act_avx512 gives the same values).
struct act_batch {
  q8_act_batch a;
  std::vector<int8_t> qs;
  std::vector<float> d, s;
};
inline act_batch quantize_batch(const std::vector<float>& x, int64_t n_tok, int64_t k) {
  act_batch b;
  b.a.n_tok = n_tok;
  b.a.k = k;
  b.a.nb = k / qk;
  b.a.nb_pad = (b.a.nb + 15) / 16 * 16;
  b.qs.resize(static_cast<size_t>(n_tok * k));
  b.d.assign(static_cast<size_t>(n_tok * b.a.nb_pad), 0.f);
  b.s.assign(b.d.size(), 0.f);
  std::vector<block_q8_act> blocks(static_cast<size_t>(b.a.nb));
  for (int64_t t = 0; t < n_tok; ++t) {
    quantize_row_q8_act(x.data() + t * k, blocks.data(), k);
    for (int64_t i = 0; i < b.a.nb; ++i) {
      std::memcpy(b.qs.data() + t * k + i * qk, blocks[i].qs, qk);
      b.d[t * b.a.nb_pad + i] = blocks[i].d;
      b.s[t * b.a.nb_pad + i] = blocks[i].s;
    }
  }
  b.a.qs = b.qs.data();
  b.a.d = b.d.data();
  b.a.s = b.s.data();
  return b;
}

// The AVX-512 VNNI kernel's arithmetic for one (row, token), scalar, from the GGUF row: per block
// the exact integer sum of the unsigned weights u times the activations q, then
// acc = fma(float(isum), d_w * d_x, acc); acc = fma(m_w, s_x, acc), with w = d_w u + m_w.
inline float int_kernel_reference(weight_type t, const uint8_t* row, const q8_act_batch& a, int64_t tok) {
  float acc = 0.f;
  for (int64_t b = 0; b < a.nb; ++b) {
    int u[32];
    float dw, mw;
    if (t == weight_type::q8_0) {
      const auto& blk = reinterpret_cast<const block_q8_0*>(row)[b];
      for (int j = 0; j < 32; ++j) u[j] = blk.qs[j] + 128;
      dw = fp16_to_fp32(blk.d);
      mw = -128.f * dw;
    } else {
      const uint8_t* qs;
      uint32_t qh = 0;  // q5: bit j = element j's fifth bit
      if (t == weight_type::q5_0) {
        const auto& blk = reinterpret_cast<const block_q5_0*>(row)[b];
        qs = blk.qs;
        std::memcpy(&qh, blk.qh, 4);
        dw = fp16_to_fp32(blk.d);
        mw = -16.f * dw;
      } else if (t == weight_type::q5_1) {
        const auto& blk = reinterpret_cast<const block_q5_1*>(row)[b];
        qs = blk.qs;
        std::memcpy(&qh, blk.qh, 4);
        dw = fp16_to_fp32(blk.d);
        mw = fp16_to_fp32(blk.m);
      } else if (t == weight_type::q4_0) {
        const auto& blk = reinterpret_cast<const block_q4_0*>(row)[b];
        qs = blk.qs;
        dw = fp16_to_fp32(blk.d);
        mw = -8.f * dw;
      } else {
        const auto& blk = reinterpret_cast<const block_q4_1*>(row)[b];
        qs = blk.qs;
        dw = fp16_to_fp32(blk.d);
        mw = fp16_to_fp32(blk.m);
      }
      for (int j = 0; j < 16; ++j) {
        u[j] = (qs[j] & 15) | ((qh >> j) & 1) << 4;
        u[16 + j] = (qs[j] >> 4) | ((qh >> (16 + j)) & 1) << 4;
      }
    }
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += u[j] * a.qs[tok * a.k + b * qk + j];
    const float dx = a.d[tok * a.nb_pad + b], sx = a.s[tok * a.nb_pad + b];
    acc = std::fma(static_cast<float>(isum), dw * dx, acc);
    acc = std::fma(mw, sx, acc);
  }
  return acc;
}

// An n_tok x ldy output filled with a sentinel, plus a guard row before and after: a kernel that
// writes outside the (token, row) results it owns leaves a changed sentinel.
struct sentinel_out {
  static constexpr float sentinel = -12345.f;
  int64_t n_tok, ldy;
  std::vector<float> buf;
  sentinel_out(int64_t n, int64_t ld) : n_tok(n), ldy(ld), buf(static_cast<size_t>((n + 2) * ld), sentinel) {}
  float* y() { return buf.data() + ldy; }
  const float* y() const { return buf.data() + ldy; }
  // Whether only columns [c0, c1) of the n_tok rows changed.
  bool only_wrote(int64_t c0, int64_t c1) const {
    for (int64_t i = 0; i < static_cast<int64_t>(buf.size()); ++i) {
      const int64_t t = i / ldy - 1, c = i % ldy;
      const bool owned = t >= 0 && t < n_tok && c >= c0 && c < c1;
      if (!owned && buf[i] != sentinel) return false;
    }
    return true;
  }
};

// Normalised mean squared error of got[t * ldy + c0 + r] against ref[t * n_rows + r].
inline double nmse(const std::vector<double>& ref, const float* got, int64_t n_rows, int64_t ldy, int64_t c0) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) / n_rows, r = static_cast<int64_t>(i) % n_rows;
    const double e = ref[i] - got[t * ldy + c0 + r];
    num += e * e;
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace amx_test
