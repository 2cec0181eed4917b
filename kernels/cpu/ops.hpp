// Elementwise and row kernels of the transformer forward (CPU reference = these; the CUDA backend
// compares against them). All sizes in elements; rows are contiguous.
#pragma once

#include <cstdint>

namespace sy::cpu {

// out = x / sqrt(mean(x^2) + eps) * w, for one row of n.
void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps);
// Rotary position embedding as llama.cpp computes it. Pair i < n_rot / 2 of each head turns by
//   theta_i = freq_scale * (pos * base^(-2i / n_rot)) / freq_factors[i]
// (base^(-2i/n_rot) by repeated multiplication, as llama.cpp does, so results match it bit for
// bit in the common case). "normal" mode rotates adjacent pairs (x[2i], x[2i+1]) (Llama, Mistral);
// neox mode rotates (x[i], x[i + n_rot/2]) (Qwen2).
struct rope_config {
  int64_t n_rot = 0;                    // rotated dimensions per head, <= head_dim, even, <= 512
  float base = 10000.f;                 // rope.freq_base
  float freq_scale = 1.f;               // 1 / rope.scaling.factor for linear scaling
  const float* freq_factors = nullptr;  // n_rot / 2 divisors (rope_freqs.weight: Llama 3.1+), or null
  bool neox = false;
  float mscale = 1.f;  // cos and sin times this (Phi-3's LongRoPE attention factor), as llama.cpp's attn_factor
};
// `x` holds n_heads heads of head_dim.
void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const rope_config& c);
// Normal mode, no scaling (rope() with defaults).
void rope_norm(float* x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos, float base);
// out[i] = silu(gate[i]) * up[i]
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
// out[i] = gelu(gate[i]) * up[i], GELU in its tanh form (Gemma's feed-forward):
//   gelu(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))), computed as x / (1 + e^(-2u)).
void gelu_mul(const float* gate, const float* up, float* out, int64_t n);
// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n);
// In-place softmax over n values; returns nothing. Uses the vector exp.
void softmax_inplace(float* x, int64_t n);
// Vector exp of n values in place (exposed for tests).
void exp_inplace(float* x, int64_t n);

// The AVX-512 parts of silu_mul, gelu_mul and softmax_inplace's exp pass (ops_avx512.cpp; only
// where use_avx512_vnni_kernels()): each does the first multiple of 16 of n elements, bitwise as
// the 8-lane loops would, and returns how many; softmax_exp_avx512 writes e^(x - mx) and adds
// them to the 8-lane partial sums `sums8` in the 8-lane loop's order.
int64_t silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n);
int64_t gelu_mul_avx512(const float* gate, const float* up, float* out, int64_t n);
int64_t softmax_exp_avx512(float* x, int64_t n, float mx, float* sums8);

}  // namespace sy::cpu
