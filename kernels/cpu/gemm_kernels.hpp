// ISA-specific matrix kernels behind `linear` (linear.hpp picks one at run time).
//
// Panel layout of repacked bf16 weights ("panels"): rows are grouped 16 at a time; panel p holds,
// for each pair of columns (2kp, 2kp+1), the 16 rows' two values interleaved:
//   panels[p * 16 * K + kp * 32 + 2 * i + j] = W[16 p + i][2 kp + j]   (i < 16, j < 2)
// so one 64-byte load feeds a 16-row AVX-512 BF16 dot product step. Rows past the end are zero.
#pragma once

#include <cstdint>
#include <cstring>

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

// Activations of a batch of tokens quantized for the AVX-512 integer kernel (per 32 elements an
// int8 vector, its scale d and s = d * sum(q), as block_q8_act), structure of arrays: per token
// k int8 values, and nb_pad = nb rounded up to 16 values of d and of s (zero tail).
struct q8_act_batch {
  int64_t n_tok = 0, k = 0, nb = 0, nb_pad = 0;
  int8_t* qs = nullptr;  // [n_tok][k]
  float* d = nullptr;    // [n_tok][nb_pad]
  float* s = nullptr;    // [n_tok][nb_pad]
};
// Quantizes row `t` of the batch from x (k floats); same values as quantize_row_q8_act.
void quantize_q8_act_avx512(const float* x, q8_act_batch& a, int64_t t);

// Integer weights (q4_0, q4_1, q5_0, q5_1, q8_0) repacked at load into 16-row panels ("int
// panels") for the AVX-512 VNNI kernel. Per panel, per 32-column block b, in 64-byte lines:
//   n_int_lines(t) lines of unsigned weight bytes: line g, lane i (4 bytes) = row 16p+i's bytes
//     for columns 4g..4g+3 of the block, so one vpdpbusd against 4 broadcast activation bytes
//     gives 16 rows' partial sums. q8_0: u = q + 128, 8 lines. q4 and q5: the GGUF nibble bytes
//     4g..4g+3 (low nibbles = columns 4g.., high nibbles = columns 16+4g..), 4 lines; q5 adds a
//     fifth line of the fifth bits, lane i byte c: bit g = column 4g+c's, bit 4+g = column
//     16+4g+c's (so group g's bits come out of one mask and one shift);
//   one line of 16 f32 scales d; for q4_1 and q5_1 one line of 16 f32 offsets m, with w = d * u + m.
//     The symmetric types' m is d times a power of two (q4_0: -8 d, q5_0: -16 d, q8_0: -128 d),
//     computed by the kernels exactly as it would have been stored, so their panels skip the line
//     (decode streams every weight byte: q8_0 holds 1.125 bytes a weight instead of 1.25).
// Rows past the end of the matrix are zero.
struct alignas(64) line64 {
  uint8_t b[64];
};
// Lines of weight bytes per block (8 for q8_0, 4 nibble lines for q4 and q5), whether a fifth-bit
// line follows them (q5), and all of them: the scales' line is blk[n_int_lines(t)].
constexpr int64_t int_byte_lines(weight_type t) { return t == weight_type::q8_0 ? 8 : 4; }
constexpr bool int_has_fifth_bits(weight_type t) { return t == weight_type::q5_0 || t == weight_type::q5_1; }
constexpr int64_t n_int_lines(weight_type t) { return int_byte_lines(t) + (int_has_fifth_bits(t) ? 1 : 0); }
// Whether the panels store m (else m = int_panel_offset(t) * d), and that offset.
constexpr bool int_panel_has_m(weight_type t) { return t == weight_type::q4_1 || t == weight_type::q5_1; }
constexpr float int_panel_offset(weight_type t) {
  return t == weight_type::q8_0 ? -128.f : t == weight_type::q5_0 ? -16.f : -8.f;
}
// Lines per 32-column block: weights, d, and m where stored; lines per panel for a k-column matrix.
constexpr int64_t int_block_lines(weight_type t) { return n_int_lines(t) + 1 + (int_panel_has_m(t) ? 1 : 0); }
constexpr int64_t int_panel_lines(weight_type t, int64_t k) { return k / 32 * int_block_lines(t); }
// The unsigned 5-bit (q5) or 4-bit (q4) weight bytes of group g of a block, from its lines:
// lo = columns 4g..4g+3, hi = columns 16+4g.. of every lane (scalar form, for the AMX and bf16
// paths; the VNNI kernel does the same in registers).
inline void int_panel_group_bytes(const line64* blk, weight_type t, int g, uint8_t lo[64], uint8_t hi[64]) {
  for (int j = 0; j < 64; ++j) {
    const uint8_t v = blk[g].b[j], h = int_has_fifth_bits(t) ? blk[4].b[j] : 0;
    lo[j] = static_cast<uint8_t>((v & 15) | ((h >> g) & 1) << 4);
    hi[j] = static_cast<uint8_t>((v >> 4) | ((h >> (4 + g)) & 1) << 4);
  }
}
// A block's 16 scales d and offsets m (stored, or int_panel_offset(t) * d: exact, the VNNI
// kernel's value).
inline void int_panel_scales(const line64* blk, weight_type t, float d[16], float m[16]) {
  const int64_t nl = n_int_lines(t);
  std::memcpy(d, blk[nl].b, 16 * sizeof(float));
  if (int_panel_has_m(t))
    std::memcpy(m, blk[nl + 1].b, 16 * sizeof(float));
  else
    for (int i = 0; i < 16; ++i) m[i] = int_panel_offset(t) * d[i];
}
// Fills panels [p0, p1) of `out` from GGUF rows (row_bytes apart) of a `rows` x k matrix.
void repack_int_panels(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                       int64_t p1, line64* out);

// bf16 panels [p0, p1) of a `rows` x k matrix, written to out[(p - p0) * 16 * k ...] (kernels/cpu/repack.cpp):
// from its GGUF rows (any weight type, dequantized then rounded to nearest even), or from its
// integer panels (q4_0/q4_1/q5_0/q5_1/q8_0; the same values). Rows past the end are zero.
void pack_bf16_panels(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                      int64_t p1, uint16_t* out);
void pack_bf16_panels_from_int(weight_type t, const line64* int_panels, int64_t k, int64_t p0, int64_t p1,
                               uint16_t* out);
// ... or from K panels (q4_K/q5_K/q6_K, kquant_panels.hpp) of a `rows`-row matrix: the same values as
// from the rows.
void pack_bf16_panels_from_kq(weight_type t, const line64* kq_panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                              uint16_t* out);
// The same with AVX-512, lane-parallel (kquant_bf16_avx512.cpp): bitwise the same panels; what
// pack_bf16_panels_from_kq runs where use_avx512_kernels().
void pack_bf16_panels_from_kq_avx512(weight_type t, const line64* kq_panels, int64_t rows, int64_t k, int64_t p0,
                                     int64_t p1, uint16_t* out);

// y[t * ldy + r] = dot(W row r, token t) for rows in panels [p0, p1) (clipped to `rows`) and
// every token of `a`. Each (row, token) result is computed by the same instruction sequence
// whatever the number of tokens: results do not depend on the batch.
void gemv_int_panels_avx512(weight_type t, const line64* panels, int64_t rows, int64_t p0, int64_t p1,
                            const q8_act_batch& a, float* y, int64_t ldy);
// AMX (gemm_amx.cpp; loops in amx_loops.hpp): the same contracts and the same panels as
// gemm_panels_avx512 (k a multiple of 32) and gemv_int_panels_avx512 (bitwise its results), on
// tdpbf16ps and tdpbsud. Only called when use_amx_kernels(); each call configures the tiles of its
// thread and releases them.
void gemm_panels_amx(const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const uint16_t* x_bf16, int64_t ldx,
                     int64_t n_tok, float* y, int64_t ldy);
void gemv_int_panels_amx(weight_type t, const line64* panels, int64_t rows, int64_t p0, int64_t p1,
                         const q8_act_batch& a, float* y, int64_t ldy);
// Token count from which forward_gemv runs the integer panels on AMX rather than AVX-512 VNNI
// (one full tile of A; the results are the same either way).
constexpr int64_t amx_int_min_tokens = 16;
// The same for K panels, whose AMX kernel also runs on a part-filled tile: it rebuilds its B tiles
// per step from the stored bits, which pays from 12 tokens (q4_K, q5_K) or 8 (q6_K), as measured
// in the engine: docs/cpu-backend.md, "K panels".
constexpr int64_t amx_kq_min_tokens(weight_type t) { return t == weight_type::q6_k ? 8 : 12; }
// Portable kernels on the weights as stored in GGUF (kernels/cpu/gemv_avx2.cpp): rows [r0, r1) of a
// k-column matrix (rows row_bytes apart) against n_tok tokens, y[t * ldy + r]. Activations: q8_act
// blocks (k / 32 per token, contiguous) for q4_0/q4_1/q5_0/q5_1/q8_0; f32 rows (ldx apart) for
// f32/f16/bf16. (K-quants run on K panels on every CPU: kquant_panels.hpp.)
void gemv_q8act_avx2(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const block_q8_act* a,
                     int64_t k, int64_t n_tok, float* y, int64_t ldy);
void gemv_f32act_avx2(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const float* x,
                      int64_t ldx, int64_t k, int64_t n_tok, float* y, int64_t ldy);

}  // namespace sy::cpu
