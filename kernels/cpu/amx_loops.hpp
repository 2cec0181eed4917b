// The loops of the AMX kernels, written once over a `Tiles` type so the same code runs on the
// tile instructions (gemm_amx.cpp, compiled with -mamx-*) and on a scalar model of them
// (amx_emulator.hpp), which the tests run on any CPU: only the instructions themselves differ.
//
// Tiles: palette 1, 8 tile registers of at most 16 rows x 64 bytes. A `Tiles` type provides
//   configure(const tile_config&)                 ldtilecfg
//   zero<T>()                                     tilezero tmmT
//   load<T>(const void* p, int64_t stride_bytes)  tileloadd tmmT, rows p + r * stride
//   store<T>(void* p, int64_t stride_bytes)       tilestored
//   dot_bf16<C, A, B>()                           tdpbf16ps: C[m][n] += sum_k A[m][2k+j] B[k][2n+j] (f32)
//   dot_s8u8<C, A, B>()                           tdpbsud:   C[m][n] += sum_k A[m][4k+j] B[k][4n+j]
//                                                 (int32; A signed bytes, B unsigned bytes)
//   release()                                     tilerelease
//   scratch(const void* p, size_t bytes)          a kernel-local buffer tiles may load from and
//                                                 store to (the model checks every access)
//
// Shapes (gemm_kernels.hpp has the panel layouts):
//  * bf16 prompt GEMM, 32 columns of k per tdpbf16ps: A = 16 tokens x 32 bf16 of x (row stride
//    2 ldx bytes); B = 16 consecutive 64-byte lines of a bf16 panel: line kp holds the 16 rows'
//    pairs (2kp, 2kp+1), i.e. B[kp][2n+j] = W[n][2kp+j], the pair-interleaved order tdpbf16ps
//    reads; C = 16 tokens x 16 rows of f32, stored straight into y (row stride 4 ldy bytes).
//    Tiles 0-3 are a 2x2 block of C (two token tiles x two panels), 4-5 the two A, 6-7 the two B:
//    one tile load per tdpbf16ps.
//  * integer panels, one 32-column block per tdpbsud: A = 16 tokens x 32 int8 activations (row
//    stride k bytes); B = 8 lines of the block's unsigned weights, line g lane n = row n's bytes
//    for columns 4g..4g+3 (q8_0: the panel's 8 lines as they are; q4: its 4 nibble lines split
//    into low nibbles, columns 0-15, then high nibbles, columns 16-31); C = 16 tokens x 16 rows
//    of int32: the exact integer sums the AVX-512 kernel's vpdpbusd gives. They are folded into
//    f32 with the same operations in the same order as there (convert, fma with d_w * d_x, fma
//    of m_w and s_x), so the results are bitwise those of gemv_int_panels_avx512.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {

// The 64-byte operand of ldtilecfg: byte 0 palette, 1 start_row, 2-15 zero, 16-47 bytes per row
// of tiles 0-15 (u16), 48-63 rows of tiles 0-15 (u8). Palette 1 names tiles 0-7; the entries
// of 8-15 must stay zero, and an unused tile has 0 rows and 0 bytes.
struct alignas(64) tile_config {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  void set(int tile, int n_rows, int bytes_per_row) {
    rows[tile] = static_cast<uint8_t>(n_rows);
    colsb[tile] = static_cast<uint16_t>(bytes_per_row);
  }
};
static_assert(sizeof(tile_config) == 64);
static_assert(offsetof(tile_config, colsb) == 16 && offsetof(tile_config, rows) == 48);

constexpr int amx_tile_rows = 16;   // tokens per tile
constexpr int64_t amx_bf16_k = 32;  // columns of k per tdpbf16ps (64 bytes of bf16)

// Internal linkage: gemm_amx.cpp compiles these with AVX-512 and AMX enabled, the model without;
// no copy of one may stand in for the other at link time.
namespace {

// bf16 GEMM: m tokens per A/C tile (16, or the last tile's remainder).
inline tile_config amx_bf16_config(int m) {
  tile_config c;
  for (int t = 0; t < 4; ++t) c.set(t, m, 64);  // C
  c.set(4, m, 64);                              // A (32 bf16 per row)
  c.set(5, m, 64);
  c.set(6, 16, 64);  // B (16 pairs of k per tile)
  c.set(7, 16, 64);
  return c;
}

// NT token tiles (1-2) x NP panels (1-2) of C over all of k. `panel`: the first panel; x, y: the
// first token's row (y already offset to the panel's first row).
template <int NT, int NP, class Tiles>
void amx_bf16_block(Tiles& tl, const uint16_t* panel, int64_t k, const uint16_t* x, int64_t ldx, float* y,
                    int64_t ldy) {
  const int64_t x_stride = ldx * 2, y_stride = ldy * 4, panel_elems = panel_rows * k;
  tl.template zero<0>();
  if constexpr (NP > 1) tl.template zero<1>();
  if constexpr (NT > 1) tl.template zero<2>();
  if constexpr (NT > 1 && NP > 1) tl.template zero<3>();
  for (int64_t kb = 0; kb < k; kb += amx_bf16_k) {
    // Columns kb..kb+31 of x; pairs kb/2.. of the panels, 32 bf16 (one line) per pair.
    tl.template load<4>(x + kb, x_stride);
    if constexpr (NT > 1) tl.template load<5>(x + amx_tile_rows * ldx + kb, x_stride);
    tl.template load<6>(panel + kb / 2 * 32, 64);
    if constexpr (NP > 1) tl.template load<7>(panel + panel_elems + kb / 2 * 32, 64);
    tl.template dot_bf16<0, 4, 6>();
    if constexpr (NP > 1) tl.template dot_bf16<1, 4, 7>();
    if constexpr (NT > 1) tl.template dot_bf16<2, 5, 6>();
    if constexpr (NT > 1 && NP > 1) tl.template dot_bf16<3, 5, 7>();
  }
  tl.template store<0>(y, y_stride);
  if constexpr (NP > 1) tl.template store<1>(y + panel_rows, y_stride);
  if constexpr (NT > 1) tl.template store<2>(y + amx_tile_rows * ldy, y_stride);
  if constexpr (NT > 1 && NP > 1) tl.template store<3>(y + amx_tile_rows * ldy + panel_rows, y_stride);
}

// Tokens [t0, t0 + NT tiles) against panels [p0, p1), two panels at a time.
template <int NT, class Tiles>
void amx_bf16_tokens(Tiles& tl, const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const uint16_t* x,
                     int64_t ldx, int64_t t0, float* y, int64_t ldy) {
  int64_t p = p0;
  for (; p + 2 <= p1; p += 2)
    amx_bf16_block<NT, 2>(tl, panels + p * panel_rows * k, k, x + t0 * ldx, ldx, y + t0 * ldy + p * panel_rows, ldy);
  if (p < p1)
    amx_bf16_block<NT, 1>(tl, panels + p * panel_rows * k, k, x + t0 * ldx, ldx, y + t0 * ldy + p * panel_rows, ldy);
}

// gemm_panels_avx512's contract (k a multiple of 32): full token tiles in pairs, then the
// remainder with fewer rows configured, so nothing past token n_tok - 1 is read or written and
// every (token, row) result comes from the same instruction sequence whatever n_tok is.
template <class Tiles>
void amx_gemm_panels(Tiles& tl, const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const uint16_t* x,
                     int64_t ldx, int64_t n_tok, float* y, int64_t ldy) {
  if (p0 >= p1 || n_tok <= 0) return;
  const int64_t full = n_tok / amx_tile_rows, rest = n_tok % amx_tile_rows;
  if (full > 0) {
    tl.configure(amx_bf16_config(amx_tile_rows));
    int64_t tt = 0;
    for (; tt + 2 <= full; tt += 2) amx_bf16_tokens<2>(tl, panels, k, p0, p1, x, ldx, tt * amx_tile_rows, y, ldy);
    if (tt < full) amx_bf16_tokens<1>(tl, panels, k, p0, p1, x, ldx, tt * amx_tile_rows, y, ldy);
  }
  if (rest > 0) {
    tl.configure(amx_bf16_config(static_cast<int>(rest)));
    amx_bf16_tokens<1>(tl, panels, k, p0, p1, x, ldx, full * amx_tile_rows, y, ldy);
  }
  tl.release();
}

// Integer panels: C = tile 0 (16 x 16 int32), A = tile 1 (16 tokens x 32 bytes), B = tile 2
// (8 lines x 64 bytes). One configuration for every tile: a last tile of fewer tokens loads its
// rows from a zero-padded copy, so A never reads past the batch.
inline tile_config amx_int_config() {
  tile_config c;
  c.set(0, amx_tile_rows, 64);
  c.set(1, amx_tile_rows, 32);
  c.set(2, 8, 64);
  return c;
}

// Tokens per pass over a panel: the f32 accumulators of a pass stay on the stack (8 KiB).
constexpr int64_t amx_int_tokens = 128;

template <weight_type wt, class Tiles>
void amx_int_panels_t(Tiles& tl, const line64* panels, int64_t rows, int64_t p0, int64_t p1, const q8_act_batch& a,
                      float* y, int64_t ldy) {
  constexpr int64_t nl = n_int_lines(wt);
  const int64_t nb = a.nb, stride = int_panel_lines(wt, a.nb * 32);
  alignas(64) line64 nibbles[8];                // q4: the block's B tile (bytes 0..15)
  alignas(64) int32_t sums[amx_tile_rows][16];  // C of one block: [token][row]
  alignas(64) int8_t tail[amx_tile_rows][32];   // A of a last tile of fewer tokens, zero-padded
  alignas(64) float acc[amx_int_tokens][16];    // [token][row], f32 as the AVX-512 kernel's
  std::memset(tail, 0, sizeof tail);
  tl.scratch(nibbles, sizeof nibbles);
  tl.scratch(sums, sizeof sums);
  tl.scratch(tail, sizeof tail);
  tl.configure(amx_int_config());
  for (int64_t c0 = 0; c0 < a.n_tok; c0 += amx_int_tokens) {
    const int64_t n_c = a.n_tok - c0 < amx_int_tokens ? a.n_tok - c0 : amx_int_tokens;
    for (int64_t p = p0; p < p1; ++p) {
      const line64* panel = panels + p * stride;
      const int64_t row0 = p * panel_rows, n_rows = rows - row0 < panel_rows ? rows - row0 : panel_rows;
      for (int64_t t = 0; t < n_c; ++t)
        for (int i = 0; i < 16; ++i) acc[t][i] = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const line64* blk = panel + b * (nl + 2);
        const line64* w = blk;
        if constexpr (nl == 4) {
          for (int g = 0; g < 4; ++g)
            for (int j = 0; j < 64; ++j) {
              nibbles[g].b[j] = blk[g].b[j] & 15;
              nibbles[4 + g].b[j] = blk[g].b[j] >> 4;
            }
          w = nibbles;
        }
        tl.template load<2>(w, 64);  // one B per block, for every token tile of the pass
        float dw[16], mw[16];
        std::memcpy(dw, blk[nl].b, sizeof dw);
        std::memcpy(mw, blk[nl + 1].b, sizeof mw);
        for (int64_t tt = 0; tt < n_c; tt += amx_tile_rows) {
          const int64_t t0 = c0 + tt, m = n_c - tt < amx_tile_rows ? n_c - tt : amx_tile_rows;
          const int8_t* xq = a.qs + t0 * a.k + 32 * b;
          tl.template zero<0>();
          if (m == amx_tile_rows) {
            tl.template load<1>(xq, a.k);
          } else {
            for (int64_t t = 0; t < m; ++t) std::memcpy(tail[t], xq + t * a.k, 32);
            tl.template load<1>(tail, 32);
          }
          tl.template dot_s8u8<0, 1, 2>();
          tl.template store<0>(sums, 64);
          for (int64_t t = 0; t < m; ++t) {
            const float dx = a.d[(t0 + t) * a.nb_pad + b], sx = a.s[(t0 + t) * a.nb_pad + b];
            float* at = acc[tt + t];
            for (int i = 0; i < 16; ++i) {
              at[i] = std::fma(static_cast<float>(sums[t][i]), dw[i] * dx, at[i]);
              at[i] = std::fma(mw[i], sx, at[i]);
            }
          }
        }
      }
      for (int64_t t = 0; t < n_c; ++t) std::memcpy(y + (c0 + t) * ldy + row0, acc[t], n_rows * sizeof(float));
    }
  }
  tl.release();
}

// gemv_int_panels_avx512's contract, bitwise the same results.
template <class Tiles>
void amx_int_panels(Tiles& tl, weight_type t, const line64* panels, int64_t rows, int64_t p0, int64_t p1,
                    const q8_act_batch& a, float* y, int64_t ldy) {
  if (p0 >= p1 || a.n_tok <= 0) return;
  switch (t) {
    case weight_type::q4_0:
      return amx_int_panels_t<weight_type::q4_0>(tl, panels, rows, p0, p1, a, y, ldy);
    case weight_type::q4_1:
      return amx_int_panels_t<weight_type::q4_1>(tl, panels, rows, p0, p1, a, y, ldy);
    case weight_type::q8_0:
      return amx_int_panels_t<weight_type::q8_0>(tl, panels, rows, p0, p1, a, y, ldy);
    default:
      return;
  }
}

}  // namespace
}  // namespace sy::cpu
