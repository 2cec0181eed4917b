// Rotary position embedding on the device: the same math as sy::cpu::rope (kernels/cpu/ops), in
// both of its modes, applied to every token of a ragged batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sy::cuda {

// The settings of cpu::rope_config, with the divisors in device memory.
struct rope_params {
  int64_t n_rot = 0;                    // rotated dimensions per head: even, 2 <= n_rot <= head_dim
  float base = 10000.f;                 // rope.freq_base
  float freq_scale = 1.f;               // 1 / rope.scaling.factor (linear scaling), else 1
  const float* freq_factors = nullptr;  // device memory: n_rot / 2 divisors (rope_freqs.weight), or null
  bool neox = false;                    // rotate (x[i], x[i + n_rot/2]) instead of (x[2i], x[2i+1])
};

// x is [n_tok][n_heads][head_dim] fp32 in device memory, rotated in place; pos [n_tok] int32 in
// device memory. In each head, pair i < n_rot / 2 — (x[2i], x[2i+1]), or (x[i], x[i + n_rot/2])
// in neox mode — turns by
//   theta_i = freq_scale * ((pos * theta_scale^i) / freq_factors[i]),  theta_scale = base^(-2/n_rot)
// evaluated as cpu::rope does (theta_scale on the host with the same expression, its powers by
// repeated fp32 multiplication, then the division and the scaling, each rounded once), so the
// angles are bit for bit the CPU's; only cos/sin (CUDA's sincosf vs the C library) may differ in
// the last bit. Elements from n_rot on are left alone. std::invalid_argument for an invalid n_rot.
// Asynchronous on `s`.
void rope(float* x, const int32_t* pos, int64_t n_tok, int64_t n_heads, int64_t head_dim, const rope_params& p,
          cudaStream_t s);

}  // namespace sy::cuda
