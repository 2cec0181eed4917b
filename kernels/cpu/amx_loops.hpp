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
//   dot_s8s8<C, A, B>()                           tdpbssd:   the same with B signed
//   fold_kq(acc, hi, lo, hi_shift, dw, dx, mins, sums32, dmw)  the K-panel kernel's f32 fold of 16 rows (below):
//                                                 zmm instructions on the hardware, scalar on the model
//   fold_int(acc, sums, m, dw, mw, dx, sx, x_stride)  the integer-panel kernel's f32 fold of a block
//                                                 for m tokens (int_fold_scalar), the same way
//   release()                                     tilerelease
//   prefetch(const void* p)                       prefetcht1 (a hint: never faults; nothing on the model)
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
//  * K panels (kquant_panels.hpp), one super-block per C: the weights times their sub-block
//    scales in two parts, as B tiles of 64 columns (16 lines of 16 rows x 4 bytes), made once per
//    super-block and pass: q4_K/q5_K split the scale (sc = 2^s sh + sl, so q sl and q sh fit a byte,
//    isum = 2^s C_hi + C_lo), q6_K the product (sc (q - 32), |.| <= 4096, = 256 hi + lo with lo in
//    [0, 256), hi signed); A = 16 tokens x 64 activation bytes (row stride 256: the activations are
//    copied block-major, a super-block of every token in turn);
//    C = the super-block's sums of x lo (tdpbsud) and of x hi (tdpbsud, or tdpbssd for q6_K's
//    signed high parts), so isum is exactly the model's integer sum, then the same f32 fold as the
//    model: bitwise gemv_kq_panels_model's results. (The scales cannot ride in 8 bits next to their
//    values, so each weight takes two bytes; a super-block is then one C, not one per sub-block.)
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/cpu/kquant_panels.hpp"

namespace sy::cpu {

// One token's results for a panel's rows into y. A full panel (16 rows, the common case) is a
// fixed 64-byte copy the compiler inlines, not a library call per token and panel (a million a
// 32-sequence decode step of a 1B model, ~4 % of its profile; the step's time measured the same
// within the noise either way).
inline void store_panel_rows(float* dst, const float* src, int64_t n_rows) {
  if (n_rows == 16)
    std::memcpy(dst, src, 16 * sizeof(float));
  else
    std::memcpy(dst, src, static_cast<size_t>(n_rows) * sizeof(float));
}

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

// Tokens of tile `half` (0 or 1) of pair `pi` in a pass of n tokens taken two tiles at a time
// (the integer and K-panel kernels): 16, the last tile's remainder, or 0 past the pass.
inline int64_t amx_pair_tokens(int64_t n, int64_t pi, int half) {
  const int64_t t0 = pi * 2 * amx_tile_rows + half * amx_tile_rows;
  return t0 >= n ? int64_t{0} : n - t0 < amx_tile_rows ? n - t0 : int64_t{amx_tile_rows};
}

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

// The integer-panel kernel's f32 fold of one block for m tokens and 16 rows, as the AVX-512
// kernel's: acc[t] = fma(float(sums[t]), dw dx_t, acc[t]), then acc[t] = fma(mw, sx_t, acc[t])
// (dx_t = dx[t x_stride], the same for sx). The scalar definition; the tile model calls it,
// gemm_amx.cpp has the same operations on zmm registers.
inline void int_fold_scalar(float (*acc)[16], const int32_t (*sums)[16], int64_t m, const float* dw, const float* mw,
                            const float* dx, const float* sx, int64_t x_stride) {
  for (int64_t t = 0; t < m; ++t)
    for (int i = 0; i < 16; ++i) {
      acc[t][i] = std::fma(static_cast<float>(sums[t][i]), dw[i] * dx[t * x_stride], acc[t][i]);
      acc[t][i] = std::fma(mw[i], sx[t * x_stride], acc[t][i]);
    }
}

// Integer panels, two panels and two token tiles at a time: C = tiles 0-3 (panel 0 and 1 of the
// first token tile, then of the second; 16 x 16 int32 each), A = tiles 4 and 5 (16 tokens x 32
// bytes), B = tiles 6 and 7 (8 lines x 64 bytes, one per panel). One configuration for every
// tile: a last tile of fewer tokens loads its rows from a zero-padded copy, so A never reads past
// the batch.
inline tile_config amx_int_config() {
  tile_config c;
  for (int t = 0; t < 4; ++t) c.set(t, amx_tile_rows, 64);
  c.set(4, amx_tile_rows, 32);
  c.set(5, amx_tile_rows, 32);
  c.set(6, 8, 64);
  c.set(7, 8, 64);
  return c;
}

// Tokens per pass over a pair of panels: their f32 accumulators stay on the stack (16 KiB).
constexpr int64_t amx_int_tokens = 128;
// Blocks a block's C waits in the scratch before it is folded into f32: the tile stores are done
// by then, so the fold's loads do not wait for them (as the K-panel kernel's pairs).
constexpr int64_t amx_int_fold_lag = 2;
// Blocks of weights prefetched ahead of the one read (each panel's blocks lie in reading order).
constexpr int64_t amx_int_prefetch_blocks = 8;

template <weight_type wt, class Tiles>
void amx_int_panels_t(Tiles& tl, const line64* panels, int64_t rows, int64_t p0, int64_t p1, const q8_act_batch& a,
                      float* y, int64_t ldy) {
  constexpr int64_t nl = n_int_lines(wt), bl = int_block_lines(wt), lag = amx_int_fold_lag;
  constexpr int64_t n_pairs = amx_int_tokens / (2 * amx_tile_rows);
  const int64_t nb = a.nb, stride = int_panel_lines(wt, a.nb * 32);
  alignas(64) line64 nibbles[2][8];  // q4, q5: the block's B tile of each panel (bytes 0..15, 0..31)
  // C of the block's token tiles, [block % (lag + 1)][pair][tile: panel + 2 * second token tile]
  alignas(64) int32_t c[lag + 1][n_pairs][4][amx_tile_rows][16];
  alignas(64) float dw[lag + 1][2][16], mw[lag + 1][2][16];  // the blocks' scales, as c
  alignas(64) int8_t tail[amx_tile_rows][32];                // A of a last tile of fewer tokens, zero-padded
  alignas(64) float acc[2][amx_int_tokens][16];              // [panel][token][row], f32 as the AVX-512 kernel's
  std::memset(tail, 0, sizeof tail);
  tl.scratch(nibbles, sizeof nibbles);
  tl.scratch(c, sizeof c);
  tl.scratch(tail, sizeof tail);
  tl.configure(amx_int_config());
  // A of the m tokens from t0, block b, into tile T.
  auto load_a = [&](auto tile, int64_t t0, int64_t m, int64_t b) {
    constexpr int T = decltype(tile)::value;
    const int8_t* xq = a.qs + t0 * a.k + 32 * b;
    if (m == amx_tile_rows) return tl.template load<T>(xq, a.k);
    for (int64_t t = 0; t < m; ++t) std::memcpy(tail[t], xq + t * a.k, 32);
    tl.template load<T>(tail, 32);
  };
  for (int64_t c0 = 0; c0 < a.n_tok; c0 += amx_int_tokens) {
    const int64_t n_c = a.n_tok - c0 < amx_int_tokens ? a.n_tok - c0 : amx_int_tokens;
    const int64_t n_pc = (n_c + 2 * amx_tile_rows - 1) / (2 * amx_tile_rows);
    auto tokens_of = [&](int64_t pi, int half) { return amx_pair_tokens(n_c, pi, half); };
    for (int64_t p = p0; p < p1; p += 2) {
      const int np = p + 1 < p1 ? 2 : 1;
      const line64* panel[2] = {panels + p * stride, panels + (p + np - 1) * stride};
      for (int j = 0; j < np; ++j)
        for (int64_t t = 0; t < n_c; ++t)
          for (int i = 0; i < 16; ++i) acc[j][t][i] = 0.f;
      // The f32 fold of block b, in block order per (token, row): the same operations in the same
      // order as the AVX-512 kernel's.
      auto fold = [&](int64_t b) {
        const int64_t s = b % (lag + 1);
        for (int j = 0; j < np; ++j)
          for (int64_t pi = 0; pi < n_pc; ++pi)
            for (int half = 0; half < 2; ++half) {
              const int64_t t = pi * 2 * amx_tile_rows + half * amx_tile_rows, m = tokens_of(pi, half);
              if (m == 0) continue;
              const int64_t x = (c0 + t) * a.nb_pad + b;
              tl.fold_int(acc[j] + t, c[s][pi][j + 2 * half], m, dw[s][j], mw[s][j], a.d + x, a.s + x, a.nb_pad);
            }
      };
      for (int64_t b = 0; b < nb + lag; ++b) {
        if (b < nb) {
          const int64_t s = b % (lag + 1);
          for (int j = 0; j < np; ++j) {
            const line64* blk = panel[j] + b * bl;
            if (c0 == 0)  // the first pass streams the weights from memory
              for (int64_t l = 0; l < bl; ++l) tl.prefetch(blk + amx_int_prefetch_blocks * bl + l);
            const line64* w = blk;
            if constexpr (nl != 8) {
              for (int g = 0; g < 4; ++g) int_panel_group_bytes(blk, wt, g, nibbles[j][g].b, nibbles[j][4 + g].b);
              w = nibbles[j];
            }
            if (j == 0)
              tl.template load<6>(w, 64);  // one B per block and panel, for every token tile of the pass
            else
              tl.template load<7>(w, 64);
            int_panel_scales(blk, wt, dw[s][j], mw[s][j]);
          }
          for (int64_t pi = 0; pi < n_pc; ++pi) {
            const int64_t t0 = c0 + pi * 2 * amx_tile_rows, m0 = tokens_of(pi, 0), m1 = tokens_of(pi, 1);
            tl.template zero<0>();
            if (np > 1) tl.template zero<1>();
            load_a(std::integral_constant<int, 4>{}, t0, m0, b);
            tl.template dot_s8u8<0, 4, 6>();
            if (np > 1) tl.template dot_s8u8<1, 4, 7>();
            if (m1 > 0) {
              tl.template zero<2>();
              if (np > 1) tl.template zero<3>();
              load_a(std::integral_constant<int, 5>{}, t0 + amx_tile_rows, m1, b);
              tl.template dot_s8u8<2, 5, 6>();
              if (np > 1) tl.template dot_s8u8<3, 5, 7>();
            }
            tl.template store<0>(c[s][pi][0], 64);
            if (np > 1) tl.template store<1>(c[s][pi][1], 64);
            if (m1 > 0) {
              tl.template store<2>(c[s][pi][2], 64);
              if (np > 1) tl.template store<3>(c[s][pi][3], 64);
            }
          }
        }
        if (b >= lag) fold(b - lag);
      }
      for (int j = 0; j < np; ++j) {
        const int64_t row0 = (p + j) * panel_rows, n_rows = rows - row0 < panel_rows ? rows - row0 : panel_rows;
        for (int64_t t = 0; t < n_c; ++t) store_panel_rows(y + (c0 + t) * ldy + row0, acc[j][t], n_rows);
      }
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
    case weight_type::q5_0:
      return amx_int_panels_t<weight_type::q5_0>(tl, panels, rows, p0, p1, a, y, ldy);
    case weight_type::q5_1:
      return amx_int_panels_t<weight_type::q5_1>(tl, panels, rows, p0, p1, a, y, ldy);
    case weight_type::q8_0:
      return amx_int_panels_t<weight_type::q8_0>(tl, panels, rows, p0, p1, a, y, ldy);
    default:
      return;
  }
}

// K panels: every tile 16 x 64 bytes. A = tiles 1 and 4 (two token tiles), B = tiles 2 (high
// parts) and 5 (low parts) of one 64-column group, C = tiles 0/3 (high/low sums of the first token
// tile) and 6/7 (of the second).
inline tile_config amx_kq_config() {
  tile_config c;
  for (int t = 0; t < 8; ++t) c.set(t, amx_tile_rows, 64);
  return c;
}

// Tokens per pass over a panel: their f32 sums stay on the stack (8 KiB a panel).
constexpr int64_t amx_kq_tokens = 128;
// Panels taken together, a super-block of each in turn: the activations of a super-block (256
// bytes a token) are loaded into tiles from L1 for the group instead of from L2 for every panel.
constexpr int64_t amx_kq_group = 4;
// Super-blocks of weights prefetched ahead, in the order they are read (8 are 19-27 KiB:
// docs/cpu-backend.md, K panels).
constexpr int64_t amx_kq_prefetch_blocks = 8;

// 64 bytes as one value (GCC's vector extension): zmm instructions where this is compiled for
// AVX-512 (gemm_amx.cpp), plain code on the tile model, the same (exact, integer) results.
// (-Wpsabi: these values never cross a call boundary that another translation unit compiled.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
using kq_v16i = int32_t __attribute__((vector_size(64)));
using kq_v32i16 = int16_t __attribute__((vector_size(64)));
using kq_v64u = uint8_t __attribute__((vector_size(64)));
using kq_v16f = float __attribute__((vector_size(64)));
using kq_v32u8 = uint8_t __attribute__((vector_size(32)));
using kq_v32i8 = int8_t __attribute__((vector_size(32)));
using kq_v32u16 = uint16_t __attribute__((vector_size(64)));
template <class V>
inline V kq_load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
inline void kq_store(void* p, V v) {
  std::memcpy(p, &v, sizeof v);
}
template <class To, class From>
inline To kq_cast(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To t;
  std::memcpy(&t, &v, sizeof t);
  return t;
}

// One sub-block's scales for kq_split_scalar and its zmm form: each row's scale in both 16-bit
// halves of its lane (`sc16`), the same as bytes (sc, 0) and (0, sc) of each 16-bit word (`sc_even`,
// `sc_odd`: vpmaddubsw's signed operand, so one instruction gives the even or the odd values'
// products), and offset * sc (`off`, q6_K's 32 sc; zero otherwise).
struct kq_sub_scale {
  kq_v32i16 sc16, off;
  kq_v64u sc_even, sc_odd;
};
inline kq_sub_scale kq_make_sub_scale(kq_v32i16 sc16, int16_t offset) {
  const kq_v32i16 low = sc16 & 0xff;
  return {sc16, sc16 * offset, kq_cast<kq_v64u>(low), kq_cast<kq_v64u>(low << 8)};
}

// One line of 16 rows x 4 values (lane i = row i, values 0..63 in its 4 bytes) times the rows'
// scales, minus the offset term: p = q sc - off (= (q - offset) sc, exact in 16 bits), written as
// the bytes of each product p = 256 hi + lo (lo in [0, 256), the 16-bit word's low byte; hi signed,
// its high byte, |hi| <= 16). The definition; the hardware does the same with vpmaddubsw, a shift
// of each product by 8 and byte blends.
inline void kq_split_scalar(kq_v64u v, const kq_sub_scale& s, line64* hi, line64* lo) {
  const kq_v32i16 w = kq_cast<kq_v32i16>(v);
  const kq_v32i16 pe = (w & 0xff) * s.sc16 - s.off, po = ((w >> 8) & 0xff) * s.sc16 - s.off;
  kq_store(hi, ((pe >> 8) & 0xff) | (po & static_cast<int16_t>(0xff00)));
  kq_store(lo, (pe & 0xff) | (po << 8));
}

// q4_K / q5_K: the scale is split instead of the product. With sc = 2^s sh + sl (s = 4 for q4_K,
// 3 for q5_K; sl < 2^s), q sl and q sh each fit a byte (q4_K: q <= 15, sl <= 15, sh <= 3; q5_K:
// q <= 31, sl <= 7, sh <= 7; at most 225), so `lo` = q sl and `hi` = q sh are two unsigned B tiles
// and isum = 2^s C_hi + C_lo. Because a product fits its byte, one 16-bit multiply of a line's
// 16-bit word (its even value in the low byte, its odd value in the high one) by the row's sl (or
// sh) gives both bytes' products in place, with no carry between them: one vpmullw per line and
// part where kq_split_scalar needs the unpack, two multiplies and the byte blends.
struct kq_scale_split {
  kq_v32u16 sl, sh;  // each row's sl / sh in both 16-bit halves of its lane
};
inline kq_scale_split kq_make_scale_split(kq_v32u16 sc16, int shift) {
  return {sc16 & static_cast<uint16_t>((1 << shift) - 1), sc16 >> shift};
}
inline void kq_split_scale(kq_v64u v, const kq_scale_split& s, line64* hi, line64* lo) {
  const kq_v32u16 w = kq_cast<kq_v32u16>(v);
  kq_store(lo, w * s.sl);
  kq_store(hi, w * s.sh);
}

// The K-panel kernel's f32 fold of one token and super-block for 16 rows, as gemv_kq_panels_model's:
// isum = 2^hi_shift hi + lo (the two C tiles' sums, exact: hi_shift 8 for q6_K's product split, 4 or
// 3 for q4_K's / q5_K's scale split), acc = fma(float(isum), dw dx, acc); with mins
// (q4_K/q5_K), acc = fma(-float(msum), dmw dx, acc) where msum = sum_j m_j sums32_j exactly in
// int32 (`mins`: per pair of sub-blocks q, row i's m_2q and m_2q+1 as the two 16-bit halves of
// mins[q][i]; `sums32` as the activation block stores them). The scalar definition; the tile model
// calls it, gemm_amx.cpp has the same operations on zmm registers (msum by vpdpwssd).
inline void kq_fold_scalar(float* acc, const int32_t* hi, const int32_t* lo, int hi_shift, const float* dw, float dx,
                           const uint32_t (*mins)[16], const int16_t* sums32, const float* dmw) {
  for (int i = 0; i < 16; ++i) {
    const int32_t isum = hi[i] * (1 << hi_shift) + lo[i];
    acc[i] = std::fma(static_cast<float>(isum), dw[i] * dx, acc[i]);
    if (!mins) continue;
    int32_t ms = 0;
    for (int q = 0; q < 4; ++q)
      ms += static_cast<int16_t>(mins[q][i] & 0xffff) * sums32[2 * q] +
            static_cast<int16_t>(mins[q][i] >> 16) * sums32[2 * q + 1];
    acc[i] = std::fma(-static_cast<float>(ms), dmw[i] * dx, acc[i]);
  }
}

inline void fp16x16_scalar(const void* src, float* dst) {
  for (int i = 0; i < 16; ++i) {
    uint16_t h;
    std::memcpy(&h, static_cast<const uint8_t*>(src) + 2 * i, 2);
    dst[i] = fp16_to_fp32(h);
  }
}

template <weight_type wt, class Tiles>
void amx_kq_panels_t(Tiles& tl, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                     const block_q8_K* a, const int8_t* qs_by_block, int64_t n_tok, float* y, int64_t ldy) {
  constexpr bool q6 = wt == weight_type::q6_k;
  constexpr int64_t lines = kq_lines(wt);
  constexpr int n_sc = q6 ? 16 : 8;
  constexpr int hi_shift = q6 ? 8 : wt == weight_type::q4_k ? 4 : 3;
  const int64_t nb = k / qk_k, n_panels = kq_n_panels(rows);
  alignas(64) line64 bh[4][16], bl[4][16];  // B tiles of the super-block: high and low parts
  // C of two token tiles (high 0, low 0, high 1, low 1), three in flight
  alignas(64) int32_t c[3][4][amx_tile_rows][16];
  alignas(64) int8_t tail[amx_tile_rows][64];              // A of a last tile of fewer tokens, zero-padded
  alignas(64) float acc[amx_kq_group][amx_kq_tokens][16];  // [panel in group][token][row]
  alignas(64) uint32_t mins[4][16];                        // q4_K/q5_K mins in pairs (kq_fold_scalar)
  alignas(64) float dw[16], dmw[16];
  std::memset(tail, 0, sizeof tail);
  tl.scratch(bh, sizeof bh);
  tl.scratch(bl, sizeof bl);
  tl.scratch(c, sizeof c);
  tl.scratch(tail, sizeof tail);
  tl.configure(amx_kq_config());
  // A of token tile `t0` (m tokens), 64 columns from `col` of super-block b, into tile T.
  auto load_a = [&](auto tile, int64_t t0, int64_t m, int64_t b, int col) {
    constexpr int T = decltype(tile)::value;
    const int8_t* xq = qs_by_block + (b * n_tok + t0) * qk_k + col;
    if (m == amx_tile_rows) return tl.template load<T>(xq, qk_k);
    for (int64_t t = 0; t < m; ++t) std::memcpy(tail[t], xq + t * qk_k, 64);
    tl.template load<T>(tail, 64);
  };
  // Groups of panels (the layout's, kquant_panels.hpp) outside, token passes inside: a panel is read
  // from memory once and stays in cache for every pass; the activations (k bytes a token) are the
  // part re-read, once per group. Within a pass, super-block b of each panel of the group in turn
  // (the same operations per row and token in the same order as panel by panel): the order the
  // layout keeps them in memory.
  static_assert(amx_kq_group == kq_group_panels);
  kq_panel ps[amx_kq_group];
  for (int64_t g0 = p0, g1; g0 < p1; g0 = g1) {
    g1 = kq_group_end(g0, p1);
    const int64_t n_g = g1 - g0;
    for (int64_t j = 0; j < n_g; ++j) ps[j] = kq_panel_of(panels, wt, nb, n_panels, g0 + j);
    for (int64_t c0 = 0; c0 < n_tok; c0 += amx_kq_tokens) {
      const int64_t n_c = n_tok - c0 < amx_kq_tokens ? n_tok - c0 : amx_kq_tokens;
      for (int64_t j = 0; j < n_g; ++j)
        for (int64_t t = 0; t < n_c; ++t)
          for (int i = 0; i < 16; ++i) acc[j][t][i] = 0.f;
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t j = 0; j < n_g; ++j) {
          const line64* blk = ps[j].block(b);
          const line64* scl = blk + kq_at(wt, q6 ? 48 : lines - 5);  // the 5 scale lines, in order
          // The weights stream from memory once per step (the first pass): keep the super-blocks
          // amx_kq_prefetch_blocks ahead in memory, which is the reading order (past the matrix a
          // prefetch is a no-op), on their way into L2, as the VNNI kernel does; without it a large
          // matrix (a 128k-row output head) was read at a fraction of the memory bandwidth, one
          // super-block's lines at a time.
          // The scale lines (and q5_K's fifth-bit lines) here; each nibble line (q6_K: and its top
          // bits) while the B tiles are built from the same line of this super-block (a burst of all
          // the lines at once filled the core's miss buffers, and the prefetches then stalled the
          // kernel waiting for memory).
          const bool pf = c0 == 0;
          const line64* ahead = blk + amx_kq_prefetch_blocks * lines;
          if (pf)
            for (int64_t l = q6 ? 48 : 32; l < lines; ++l) tl.prefetch(ahead + kq_at(wt, l));
          // Each row's scale of each sub-block in both 16-bit halves of its lane (q6_K: for the product
          // split; q4_K/q5_K: split into sl and sh), and the mins in pairs.
          kq_sub_scale ss[q6 ? 16 : 1];
          kq_scale_split sp[q6 ? 1 : 8];
          for (int q = 0; q < n_sc / 2; ++q) {
            const uint8_t* pb = scl[q / 2].b + 32 * (q % 2);
            kq_v16i lanes;  // row i: scale 2q in the low 16 bits, 2q + 1 in the high 16 bits
            if constexpr (q6)
              lanes = kq_cast<kq_v16i>(__builtin_convertvector(kq_load<kq_v32i8>(pb), kq_v32i16));
            else
              lanes = kq_cast<kq_v16i>(__builtin_convertvector(kq_load<kq_v32u8>(pb), kq_v32u16));
            const kq_v16i e = lanes & 0xffff, o = (lanes >> 16) & 0xffff;
            if constexpr (q6) {
              ss[2 * q] = kq_make_sub_scale(kq_cast<kq_v32i16>(e | (e << 16)), 32);
              ss[2 * q + 1] = kq_make_sub_scale(kq_cast<kq_v32i16>(o | (o << 16)), 32);
            } else {
              sp[2 * q] = kq_make_scale_split(kq_cast<kq_v32u16>(e | (e << 16)), hi_shift);
              sp[2 * q + 1] = kq_make_scale_split(kq_cast<kq_v32u16>(o | (o << 16)), hi_shift);
            }
          }
          if constexpr (!q6)
            for (int q = 0; q < 4; ++q) {
              const uint8_t* pb = scl[2 + q / 2].b + 32 * (q % 2);
              kq_store(mins[q], __builtin_convertvector(kq_load<kq_v32u8>(pb), kq_v32u16));
            }
          tl.fp16x16(blk[kq_at(wt, lines - 1)].b, dw);
          if constexpr (!q6) tl.fp16x16(blk[kq_at(wt, lines - 1)].b + 32, dmw);
          // B: group g covers columns 64g..64g+63, line r of it columns 64g + 4r..+3.
          if constexpr (q6) {
            // Lines L and L + 1 share their line of top bits: bits 0-3 of a byte are line L's (low
            // value's, then high value's), bits 4-7 line L + 1's; moved to bits 4-5 by constant shifts
            // (a shift by a run-time count of bytes has no single instruction).
            for (int L = 0; L < 32; L += 2) {
              if (pf) {
                tl.prefetch(ahead + kq_at(wt, L));
                tl.prefetch(ahead + kq_at(wt, L + 1));
                tl.prefetch(ahead + kq_at(wt, 32 + L / 2));
              }
              const auto h = kq_load<kq_v64u>(blk + kq_at(wt, 32 + L / 2));
              const auto v0 = kq_load<kq_v64u>(blk + kq_at(wt, L)), v1 = kq_load<kq_v64u>(blk + kq_at(wt, L + 1));
              const kq_v64u lo0 = (v0 & 15) | ((h << 4) & 0x30), hi0 = (v0 >> 4) | ((h << 2) & 0x30);
              const kq_v64u lo1 = (v1 & 15) | (h & 0x30), hi1 = (v1 >> 4) | ((h >> 2) & 0x30);
              tl.split_kq(lo0, ss[L / 4], &bh[L / 16][L % 16], &bl[L / 16][L % 16]);
              tl.split_kq(hi0, ss[8 + L / 4], &bh[2 + L / 16][L % 16], &bl[2 + L / 16][L % 16]);
              tl.split_kq(lo1, ss[L / 4], &bh[L / 16][L % 16 + 1], &bl[L / 16][L % 16 + 1]);
              tl.split_kq(hi1, ss[8 + L / 4], &bh[2 + L / 16][L % 16 + 1], &bl[2 + L / 16][L % 16 + 1]);
            }
          } else {
            for (int g = 0; g < 4; ++g)
              for (int cc = 0; cc < 8; ++cc) {
                if (pf) tl.prefetch(ahead + kq_at(wt, 8 * g + cc));
                const auto v = kq_load<kq_v64u>(blk + kq_at(wt, 8 * g + cc));
                kq_v64u lo = v & 15, hi = v >> 4;
                if constexpr (wt == weight_type::q5_k) {
                  const auto h = kq_load<kq_v64u>(blk + kq_at(wt, 32 + 2 * g + cc / 4));
                  lo |= ((h >> (2 * (cc % 4))) & 1) << 4;
                  hi |= ((h >> (2 * (cc % 4) + 1)) & 1) << 4;
                }
                kq_split_scale(lo, sp[2 * g], &bh[g][cc], &bl[g][cc]);
                kq_split_scale(hi, sp[2 * g + 1], &bh[g][8 + cc], &bl[g][8 + cc]);
              }
          }
          // Two token tiles at a time (the second may be absent): C = sum over the super-block. The
          // f32 fold of a pair runs two pairs later, while the tile unit computes, so that its loads
          // find the tile stores done instead of waiting for them (C stored to three rotating parts of
          // the scratch).
          const int64_t n_pairs_t = (n_c + 2 * amx_tile_rows - 1) / (2 * amx_tile_rows);
          auto tokens_of = [&](int64_t pi, int half) { return amx_pair_tokens(n_c, pi, half); };
          auto fold_pair = [&](int64_t pi) {
            for (int half = 0; half < 2; ++half) {
              const int64_t m = tokens_of(pi, half);
              const int32_t(*ch)[16] = c[pi % 3][2 * half];
              const int32_t(*cl)[16] = c[pi % 3][2 * half + 1];
              for (int64_t t = 0; t < m; ++t) {
                const int64_t tok = pi * 2 * amx_tile_rows + half * amx_tile_rows + t;
                const block_q8_K& x = a[(c0 + tok) * nb + b];
                tl.fold_kq(acc[j][tok], ch[t], cl[t], hi_shift, dw, x.d, q6 ? nullptr : mins, x.sums32, dmw);
              }
            }
          };
          for (int64_t pi = 0; pi <= n_pairs_t + 1; ++pi) {
            const int64_t m0 = tokens_of(pi, 0), m1 = tokens_of(pi, 1);
            if (pi < n_pairs_t) {
              const int64_t tt = pi * 2 * amx_tile_rows;
              tl.template zero<0>();
              tl.template zero<3>();
              if (m1 > 0) {
                tl.template zero<6>();
                tl.template zero<7>();
              }
              for (int g = 0; g < 4; ++g) {
                tl.template load<2>(bh[g], 64);
                tl.template load<5>(bl[g], 64);
                load_a(std::integral_constant<int, 1>{}, c0 + tt, m0, b, 64 * g);
                if constexpr (q6)
                  tl.template dot_s8s8<0, 1, 2>();
                else
                  tl.template dot_s8u8<0, 1, 2>();
                tl.template dot_s8u8<3, 1, 5>();
                if (m1 > 0) {
                  load_a(std::integral_constant<int, 4>{}, c0 + tt + amx_tile_rows, m1, b, 64 * g);
                  if constexpr (q6)
                    tl.template dot_s8s8<6, 4, 2>();
                  else
                    tl.template dot_s8u8<6, 4, 2>();
                  tl.template dot_s8u8<7, 4, 5>();
                }
              }
            }
            if (pi < n_pairs_t) {
              tl.template store<0>(c[pi % 3][0], 64);
              tl.template store<3>(c[pi % 3][1], 64);
              if (m1 > 0) {
                tl.template store<6>(c[pi % 3][2], 64);
                tl.template store<7>(c[pi % 3][3], 64);
              }
            }
            if (pi > 1) fold_pair(pi - 2);
          }
        }
      for (int64_t j = 0; j < n_g; ++j) {
        const int64_t row0 = (g0 + j) * panel_rows, n_rows = rows - row0 < panel_rows ? rows - row0 : panel_rows;
        for (int64_t t = 0; t < n_c; ++t) store_panel_rows(y + (c0 + t) * ldy + row0, acc[j][t], n_rows);
      }
    }
  }
  tl.release();
}

#pragma GCC diagnostic pop

// gemv_kq_panels_model's contract, bitwise its results.
template <class Tiles>
void amx_kq_panels(Tiles& tl, weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                   const block_q8_K* a, const int8_t* qs_by_block, int64_t n_tok, float* y, int64_t ldy) {
  if (p0 >= p1 || n_tok <= 0) return;
  switch (t) {
    case weight_type::q4_k:
      return amx_kq_panels_t<weight_type::q4_k>(tl, panels, rows, k, p0, p1, a, qs_by_block, n_tok, y, ldy);
    case weight_type::q5_k:
      return amx_kq_panels_t<weight_type::q5_k>(tl, panels, rows, k, p0, p1, a, qs_by_block, n_tok, y, ldy);
    case weight_type::q6_k:
      return amx_kq_panels_t<weight_type::q6_k>(tl, panels, rows, k, p0, p1, a, qs_by_block, n_tok, y, ldy);
    default:
      return;
  }
}

}  // namespace
}  // namespace sy::cpu
