// ISA-specific matrix kernels behind `linear` (linear.hpp picks one at run time).
//
// Panel layout of repacked bf16 weights ("panels"): rows are grouped 16 at a time; panel p holds,
// for each pair of columns (2kp, 2kp+1), the 16 rows' two values interleaved:
//   panels[p * 16 * K + kp * 32 + 2 * i + j] = W[16 p + i][2 kp + j]   (i < 16, j < 2)
// so one 64-byte load feeds a 16-row AVX-512 BF16 dot product step. Rows past the end are zero.
#pragma once

#include <cstdint>

#include "kernels/cpu/quant.hpp"

namespace sy::cpu {

constexpr int panel_rows = 16;
// Widest row the AVX-512 integer kernel prepares on its stack-like scratch.
constexpr int64_t k_max_int_cols = 8192;

// y[t * ldy + r] = sum_k W[r][k] * x[t][k] for rows r in panels [p0, p1) and tokens t < n_tok.
// AVX-512 BF16: x already converted to bf16, row-major with leading dimension ldx (elements).
void gemm_panels_avx512(const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const uint16_t* x_bf16, int64_t ldx,
                        int64_t n_tok, float* y, int64_t ldy);
// AVX2/FMA: x in f32.
void gemm_panels_avx2(const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const float* x, int64_t ldx,
                      int64_t n_tok, float* y, int64_t ldy);
// Converts n f32 values to bf16 (round to nearest even).
void convert_f32_to_bf16_avx512(const float* x, uint16_t* out, int64_t n);

// Activations of a batch of tokens quantized for the AVX-512 integer kernel, structure of arrays
// so one 64-byte load covers two blocks: per token, k_pad int8 values (k rounded up to 64, zero
// tail), d expanded per pair of blocks (16 floats: 8 x d[2p], 8 x d[2p+1]; zero tail), and
// s = d * sum(q) per block (nb_pad = nb rounded up to 16, zero tail).
struct q8_act_batch {
  int64_t n_tok = 0, k = 0, k_pad = 0, nb = 0, nb_pad = 0;
  int8_t* qs = nullptr;   // [n_tok][k_pad]
  float* dexp = nullptr;  // [n_tok][k_pad / 4]
  float* s = nullptr;     // [n_tok][nb_pad]
};
// Quantizes row `t` of the batch from x (k floats); same values as quantize_row_q8_act.
void quantize_q8_act_avx512(const float* x, q8_act_batch& a, int64_t t);

// y[t * ldy + r] = dot(W row r, token t) for rows [r0, r1) and every token of `a`, for an
// integer-quantized weight (q4_0, q4_1, q8_0). Each (row, token) result is computed by the same
// instruction sequence whatever the number of tokens: results do not depend on the batch.
void gemv_q8act_avx512(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1,
                       const q8_act_batch& a, float* y, int64_t ldy);
void gemv_q8act_avx2(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_act* a,
                     int64_t k, float* y);

}  // namespace sy::cpu
