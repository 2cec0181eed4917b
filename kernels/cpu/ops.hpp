// Elementwise and row kernels of the Llama forward (CPU reference = these; the CUDA backend
// compares against them). All sizes in elements; rows are contiguous.
#pragma once

#include <cstdint>

namespace sy::cpu {

// out = x / sqrt(mean(x^2) + eps) * w, for one row of n.
void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps);
// RoPE, llama.cpp "normal" mode: rotates adjacent pairs (x[2i], x[2i+1]) of each head by
// pos * base^(-2i / n_rot). `x` holds n_heads heads of head_dim, n_rot <= head_dim.
void rope_norm(float* x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos, float base);
// out[i] = silu(gate[i]) * up[i]
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n);
// In-place softmax over n values; returns nothing. Uses the vector exp.
void softmax_inplace(float* x, int64_t n);
// Vector exp of n values in place (exposed for tests).
void exp_inplace(float* x, int64_t n);

}  // namespace sy::cpu
