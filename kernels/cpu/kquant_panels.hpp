// K-quant weights (q4_K, q5_K, q6_K) repacked at load into 16-row panels ("K panels") for the
// AVX2, AVX-512 VNNI and AMX integer kernels, on every CPU, and the one arithmetic they share.
//
// Layout. Rows are grouped 16 at a time into panels (rows past the matrix are zero), and panels 4
// at a time into groups (kq_group_panels; the last group may hold fewer): a group holds super-block
// 0 of each of its panels in turn, then super-block 1 of each, and so on (kq_panel_of says where a
// panel's super-blocks lie), so that a kernel taking the super-blocks of a group's panels in that
// order reads memory front to back in one stream. Per panel and 256-column super-block, 64-byte
// lines (line64), numbered below by what they hold; kq_at (below) says where each lies in the
// super-block. "lane i" is bytes 4i..4i+3 of a line, which belong to row
// 16p + i, so one vpdpbusd against 4 broadcast activation bytes gives 16 rows' partial sums and 8
// (or 4) consecutive lines are a tdpbsud B tile as they are:
//  * q4_K (37 lines): lines 8g + c (g < 4 sub-block pairs, c < 8): lane i byte k = the GGUF qs byte
//    32g + 4c + k of the row: its low nibble is column 64g + 4c + k (sub-block 2g), its high nibble
//    column 64g + 32 + 4c + k (sub-block 2g + 1). Lines 32-33: the 8 six-bit scales in pairs, byte
//    32q + 2i + e = scale 2q + e of row i; lines 34-35 the 8 mins, the same way; line 36: the rows'
//    d as fp16 (bytes 2i, 2i + 1), then their dmin (bytes 32 + 2i).
//  * q5_K (45 lines): nibble lines as q4_K (from the GGUF qs); lines 32 + 2g + h hold the fifth bits
//    of nibble lines 8g + 4h + c' (c' < 4): byte 4i + k bit 2c' is the low value's, bit 2c' + 1 the
//    high value's; lines 40-44 as q4_K's 32-36.
//  * q6_K (53 lines): lines L < 32: lane i byte k holds the low 4 bits of the row's 6-bit value of
//    column 4L + k (low nibble, sub-block L / 4) and of column 128 + 4L + k (high nibble, sub-block
//    8 + L / 4); lines 32 + 2j + h hold the top 2 bits of nibble lines 4j + 2h + c' (c' < 2): byte
//    4i + k bits 4c', 4c' + 1 the low value's, 4c' + 2, 4c' + 3 the high value's; lines 48-51 the
//    16 int8 scales in pairs (byte 32q + 2i + e = scale 2q + e of row i); line 52 the rows' d (fp16).
// About 3 % more bytes than the GGUF rows (q4_K 2368 vs 2304 per 16 x 256, q5_K 2880 vs 2816,
// q6_K 3392 vs 3360), streamed once per step for every token of the step.
//
// Arithmetic (kq_dot below is its definition, the kernels reproduce it bit for bit): against the
// q8_K activations (quant.hpp: per 256 a scale d_x, int8 values q_x, sums of each 16 and 32), per
// row and super-block the exact integer sums
//   q4_K/q5_K: isum = sum_j sc_j * sum_{l in j} q_l q_x,l      msum = sum_j m_j * sums32_j
//   q6_K:      isum = sum_j sc_j * sum_{l in j} q_l q_x,l  -  32 * sum_j sc_j * bsums_j   (q = stored 0..63)
// (int32: at most ~2.6e8 in magnitude), folded into the row's f32 sum in super-block order:
//   acc = fma(float(isum), d_w * d_x, acc);  q4_K/q5_K then acc = fma(-float(msum), dmin_w * d_x, acc)
// starting from 0. The integer part is exactly the reference dot product's (dot_row_q8_K_ref);
// only the f32 rounding differs from its double sum. A (row, token) result depends on nothing
// but that row and token, so batching cannot change it, and the AVX2 kernel, the AVX-512 kernel,
// the AMX kernel and the scalar model agree bitwise (tests/unit/test_kquant_panels.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {

// Lines per panel and super-block, and per panel for a k-column matrix.
constexpr int64_t kq_lines(weight_type t) {
  return t == weight_type::q4_k ? 37 : t == weight_type::q5_k ? 45 : t == weight_type::q6_k ? 53 : 0;
}
constexpr int64_t kq_panel_lines(weight_type t, int64_t k) { return k / qk_k * kq_lines(t); }

// Panels per group (the layout above). The AMX kernel takes super-block b of each panel of a group
// in turn (amx_loops.hpp), and so do the one- and two-token kernels: with the group's super-blocks
// adjacent, that order is one stream through memory instead of four (a q4_K tile kernel reading
// its weights from DRAM was 5-10 % faster with the addressing of this layout;
// docs/cpu-backend.md, "Why the tile kernels lose a quarter on weights streamed from DRAM").
constexpr int64_t kq_group_panels = 4;
constexpr int64_t kq_n_panels(int64_t rows) { return (rows + panel_rows - 1) / panel_rows; }

// The end of the group panel p lies in, clipped to p1: [p, kq_group_end(p, p1)) are panels of one
// group.
constexpr int64_t kq_group_end(int64_t p, int64_t p1) {
  return std::min(p1, (p / kq_group_panels + 1) * kq_group_panels);
}

// Where panel p's super-blocks lie: super-block b at line `first + b * step` of the matrix's
// panels, for a matrix of n_panels panels and nb super-blocks a row.
struct kq_where {
  int64_t first, step;
};
constexpr kq_where kq_where_of(weight_type t, int64_t nb, int64_t n_panels, int64_t p) {
  const int64_t g0 = p / kq_group_panels * kq_group_panels;
  const int64_t in_group = std::min(kq_group_panels, n_panels - g0);
  return {g0 * nb * kq_lines(t) + (p - g0) * kq_lines(t), in_group * kq_lines(t)};
}
// A panel's super-blocks in memory.
struct kq_panel {
  const line64* first;
  int64_t step;  // lines from one super-block of the panel to its next
  const line64* block(int64_t b) const { return first + b * step; }
};
inline kq_panel kq_panel_of(const line64* panels, weight_type t, int64_t nb, int64_t n_panels, int64_t p) {
  const kq_where at = kq_where_of(t, nb, n_panels, p);
  return {panels + at.first, at.step};
}
// The lines panels [p0, p1) occupy: from the start of p0's group to the end of (p1 - 1)'s.
inline void kq_span_of(weight_type t, int64_t nb, int64_t n_panels, int64_t p0, int64_t p1, int64_t& first,
                       int64_t& count) {
  const int64_t g0 = p0 / kq_group_panels * kq_group_panels;
  const int64_t g1 = kq_group_end(p1 - 1, n_panels);
  first = g0 * nb * kq_lines(t);
  count = (g1 - g0) * nb * kq_lines(t);
}

// Where line L of a super-block (the numbering above) lies in memory, 0 .. kq_lines(t) - 1: the
// five lines of scales, mins and d first, then each sub-block group's lines together in the order
// the kernels read them (q4_K: 8 nibble lines per group; q5_K: 8 nibble lines and their 2 lines of
// fifth bits; q6_K: 4 nibble lines and their 2 lines of top bits), so that a kernel reads a
// super-block front to back.
// Read in an order that jumped between the data lines and their bit and scale lines, the panels
// streamed at 60 % of the memory bandwidth on AMD Zen 4 (docs/cpu-backend.md, "What limits
// single-stream decode").
constexpr int64_t kq_at(weight_type t, int64_t L) {
  const int64_t scales = kq_lines(t) - 5;                  // first of the five head lines
  const int64_t nib = t == weight_type::q6_k ? 4 : 8;      // nibble lines per group,
  const int64_t group = nib + (scales - 32) / (32 / nib);  // then its share of the high-bit lines
  if (L >= scales) return L - scales;
  if (L >= 32) return 5 + group * ((L - 32) / 2) + nib + (L - 32) % 2;  // group (L - 32) / 2's high bits
  return 5 + group * (L / nib) + L % nib;
}
// kq_at places every line once.
constexpr bool kq_at_is_permutation(weight_type t) {
  bool seen[64] = {};
  for (int64_t L = 0; L < kq_lines(t); ++L) {
    const int64_t at = kq_at(t, L);
    if (at < 0 || at >= kq_lines(t) || seen[at]) return false;
    seen[at] = true;
  }
  return true;
}
static_assert(kq_at_is_permutation(weight_type::q4_k) && kq_at_is_permutation(weight_type::q5_k) &&
              kq_at_is_permutation(weight_type::q6_k));

// Fills panels [p0, p1) of `out` from the GGUF rows (row_bytes apart) of a `rows` x k K-quant matrix.
void repack_kq_panels(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                      int64_t p1, line64* out);
// The same panels by the slow, obviously-right route (unpack every value, place it), for tests.
void repack_kq_panels_reference(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                                int64_t p1, line64* out);

// One row of one panel of a `rows` x k matrix, dequantized (the values the reference
// dequantization gives), for tests and the bf16 prompt panels: `out` gets k floats of row `i` (< 16)
// of panel `p`.
void dequantize_kq_panel_row(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p, int i,
                             float* out);

// y[t * ldy + r] = the K-panel dot product of row r with token t, for rows in panels [p0, p1)
// (clipped to `rows`) and tokens t < n_tok; `a` holds each token's k / 256 q8_K blocks in a row.
// The scalar model (any CPU), the AVX-512 VNNI kernel (kquant_avx512.cpp) and the AMX kernel
// (gemm_amx.cpp; only called when use_amx_kernels()) give bitwise equal results.
void gemv_kq_panels_model(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                          const block_q8_K* a, int64_t n_tok, float* y, int64_t ldy);
// The AVX2 kernel (kquant_avx2.cpp), bitwise the model's results too: what CPUs without the
// AVX-512 kernels (use_avx512_vnni_kernels) run, and SY_CPU_ISA=avx2.
void gemv_kq_panels_avx2(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                         const block_q8_K* a, int64_t n_tok, float* y, int64_t ldy);
void gemv_kq_panels_avx512(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                           const block_q8_K* a, int64_t n_tok, float* y, int64_t ldy);
// The AMX kernel also takes the activations' int8 values block-major, [k / 256][n_tok][256]
// (kq_qs_by_block), so that a tile of 16 tokens' 64 columns is 16 rows 256 bytes apart, in one
// small area, instead of 16 rows a whole token apart.
void gemv_kq_panels_amx(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                        const block_q8_K* a, const int8_t* qs_by_block, int64_t n_tok, float* y, int64_t ldy);
void kq_qs_by_block(const block_q8_K* a, int64_t n_tok, int64_t k, int8_t* out);
// Token t's part of it (each token's activation quantization job copies its own).
void kq_qs_by_block_token(const block_q8_K* a, int64_t t, int64_t n_tok, int64_t k, int8_t* out);

// Where kq_line_prefetch() (cpu_features.hpp) says so, the one-token and two-token kernels ask each
// line of a super-block into L1 this many lines ahead of its load (past its end into the next
// super-block in memory: they take a group's panels a super-block each in turn, so the one they
// read next); the hardware streamer brings them into L2 further ahead.
// Measured on Sapphire Rapids against 16 KiB ahead into L2 (the engine's one-token step on a 1B
// Q4_K_M file, AVX-512: 34.1-34.5 against 37.0-37.1 ms); on AMD Zen 4 the kernels stream faster
// without it (docs/cpu-backend.md, "What limits single-stream decode").
constexpr int64_t kq_prefetch_lines = 8;
inline void kq_prefetch_ahead(const line64* blk, int64_t lines) {
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(blk + kq_prefetch_lines + l, 0, 3);
}

// A super-block's lines on their way into L2, for a kernel that reads one panel's super-blocks,
// a group apart in memory (kq_for_panels).
inline void kq_prefetch_block(const line64* blk, int64_t lines) {
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(blk + l, 0, 2);
}

// f(std::integral_constant<weight_type, t>{}) for a K-quant type t (nothing for any other).
template <class F>
inline void kq_for_type(weight_type t, F&& f) {
  if (t == weight_type::q4_k) f(std::integral_constant<weight_type, weight_type::q4_k>{});
  if (t == weight_type::q5_k) f(std::integral_constant<weight_type, weight_type::q5_k>{});
  if (t == weight_type::q6_k) f(std::integral_constant<weight_type, weight_type::q6_k>{});
}

// How the AVX2 and AVX-512 K-panel kernels take tokens [b0, b1): in groups of `group` (8: where
// there are at least 16), then of 4, and a rest of 1-3; f(std::integral_constant<int, T>{}, t0)
// for tokens [t0, t0 + T).
template <int group, class F>
inline void kq_token_groups(int64_t b0, int64_t b1, F&& f) {
  static_assert(group == 4 || group == 8);
  int64_t t0 = b0;
  if constexpr (group == 8)
    if (b1 - b0 >= 16)
      for (; t0 + 8 <= b1; t0 += 8) f(std::integral_constant<int, 8>{}, t0);
  for (; t0 + 4 <= b1; t0 += 4) f(std::integral_constant<int, 4>{}, t0);
  const int64_t rest = b1 - t0;
  if (rest == 1) f(std::integral_constant<int, 1>{}, t0);
  if (rest == 2) f(std::integral_constant<int, 2>{}, t0);
  if (rest == 3) f(std::integral_constant<int, 3>{}, t0);
}

// How the AVX-512 K-panel kernel takes tokens [b0, b1) (kq_for_panels): in groups of 8, and a
// rest of 5-7 as one group, else of 4 and 1-3. One pass of 5-8 tokens over a panel against two
// passes of at most 4 over a group's panels (kq_group): two threads, AMD Zen 4, 131,072 x 2048
// matrices from memory, medians of three runs alternating, at 6 / 8 tokens q4_K 222 / 208 -> 282 /
// 288 GMAC/s, q5_K 150 / 158 -> 191 / 231, q6_K 167 / 182 -> 183 / 232 (docs/cpu-backend.md, "K panels").
template <class F>
inline void kq_token_groups_wide(int64_t b0, int64_t b1, F&& f) {
  int64_t t0 = b0;
  for (; t0 + 8 <= b1; t0 += 8) f(std::integral_constant<int, 8>{}, t0);
  const int64_t rest = b1 - t0;
  if (rest == 7) f(std::integral_constant<int, 7>{}, t0);
  if (rest == 6) f(std::integral_constant<int, 6>{}, t0);
  if (rest == 5) f(std::integral_constant<int, 5>{}, t0);
  if (rest < 5) kq_token_groups<4>(t0, b1, f);
}

// The groups of the layout over panels [p0, p1), for a kernel that takes a group's panels
// together, a super-block of each in turn (memory order): fn(ps, n_ps, p) for panels
// p .. p + n_ps - 1 (ps: where each lies). The next group's first lines are prefetched while one
// is multiplied. The AVX2 kernel takes every token count this way, the AVX-512 one up to
// kq_group_tokens (decode of up to 4 sequences; above, kq_for_panels, panel by panel: with the
// sums of every token group on the stack, GCC's code for 8-token groups ran at two thirds of the
// speed of the per-panel loop's, and two 4-token passes over a group's panels for 5-8 tokens were
// slower than one pass of all of them over each panel, kq_token_groups_wide).
constexpr int64_t kq_group_tokens = 4;
template <class F>
inline void kq_for_panel_groups(const line64* panels, weight_type t, int64_t rows, int64_t nb, int64_t p0, int64_t p1,
                                F&& fn) {
  const int64_t n_panels = kq_n_panels(rows);
  kq_panel ps[kq_group_panels];
  for (int64_t g = p0; g < p1;) {
    const int64_t g1 = kq_group_end(g, p1);
    for (int64_t p = g; p < g1; ++p) ps[p - g] = kq_panel_of(panels, t, nb, n_panels, p);
    if (g1 < p1) {
      const line64* next = kq_panel_of(panels, t, nb, n_panels, g1).first;
      for (int l = 0; l < 8; ++l) __builtin_prefetch(next + l, 0, 3);
    }
    fn(static_cast<const kq_panel*>(ps), static_cast<int>(g1 - g), g);
    g = g1;
  }
}

// The AVX-512 kernel above kq_group_tokens: one panel at a time over panels [p0, p1), the next
// panel's first lines prefetched while one is multiplied, against the tokens in kq_token_groups_wide:
// tokens(std::integral_constant<int, T>{}, panel, t0, row0, n_rows, first) for tokens [t0, t0 + T),
// `first` for the first token group of a block (the one that reads the panel from memory; the
// kernels then prefetch each next super-block of the panel, kq_prefetch_block).
// The tokens go in blocks of kq_token_block(nb), every panel of the range against one block before
// the next: each panel pass then reads its tokens from L2 instead of streaming all of them from L3
// (the results are the same). Blocks are at least 16 tokens, two groups of 8: for the 8192-wide
// down projections of a 1B model, 12-token blocks otherwise, that took q6_K on Zen 4 from 268 to
// 286-296 GMAC/s at 512 tokens.
constexpr int64_t kq_token_block_bytes = int64_t{128} << 10;
// Tokens (a multiple of 4, at least 4) whose q8_K activations of `nb` super-blocks each fit
// kq_token_block_bytes.
constexpr int64_t kq_token_block(int64_t nb) {
  const int64_t fit = kq_token_block_bytes / (std::max<int64_t>(1, nb) * int64_t{sizeof(block_q8_K)});
  return std::max<int64_t>(4, fit / 4 * 4);
}
template <class Tokens>
inline void kq_for_panels(const line64* panels, weight_type t, int64_t rows, int64_t nb, int64_t p0, int64_t p1,
                          int64_t n_tok, Tokens&& tokens) {
  const int64_t n_panels = kq_n_panels(rows);
  const int64_t block = std::max<int64_t>(kq_token_block(nb), 16);
  for (int64_t b0 = 0; b0 < n_tok; b0 += block) {
    const int64_t b1 = std::min(n_tok, b0 + block);
    for (int64_t p = p0; p < p1; ++p) {
      const kq_panel panel = kq_panel_of(panels, t, nb, n_panels, p);
      if (p + 1 < p1) {
        const line64* next = kq_panel_of(panels, t, nb, n_panels, p + 1).first;
        for (int l = 0; l < 8; ++l) __builtin_prefetch(next + l, 0, 3);
      }
      const int64_t row0 = p * panel_rows, n_rows = std::min<int64_t>(panel_rows, rows - row0);
      kq_token_groups_wide(b0, b1, [&](auto tc, int64_t t0) { tokens(tc, panel, t0, row0, n_rows, t0 == b0); });
    }
  }
}
// quantize_row_q8_K (quant.hpp) with AVX-512: bitwise its blocks; only where use_avx512_vnni_kernels().
void quantize_row_q8_K_avx512(const float* x, block_q8_K* y, int64_t n);
// The same with AVX2 (every CPU this builds for), bitwise the scalar rule's blocks too.
void quantize_row_q8_K_avx2(const float* x, block_q8_K* y, int64_t n);

}  // namespace sy::cpu
