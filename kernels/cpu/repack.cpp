// Weight layouts built from the GGUF rows (gemm_kernels.hpp): integer panels for the AVX-512 VNNI
// decode kernel (built once at load), and bf16 panels for the prompt GEMM (built per call into a
// small scratch, so no second full copy of the weights stays resident).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/cpu/kquant_panels.hpp"

namespace sy::cpu {

void repack_int_panels(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                       int64_t p1, line64* out) {
  const int64_t nb = k / qk, nl = n_int_lines(t), stride = int_panel_lines(t, k);
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t b = 0; b < nb; ++b) {
      line64* blk = out + p * stride + b * int_block_lines(t);
      std::memset(blk, 0, static_cast<size_t>(int_block_lines(t)) * sizeof(line64));
      float* d = reinterpret_cast<float*>(blk[nl].b);
      float* m = int_panel_has_m(t) ? reinterpret_cast<float*>(blk[nl + 1].b) : nullptr;  // q4_1, q5_1
      for (int i = 0; i < panel_rows; ++i) {
        const int64_t r = p * panel_rows + i;
        if (r >= rows) break;
        const uint8_t* row = w + r * row_bytes;
        uint8_t u[32];    // q4, q5: the 16 GGUF nibble bytes; q8_0: 32 bytes q + 128
        uint32_t qh = 0;  // q5: the fifth bits, bit j = column j's
        if (t == weight_type::q5_0) {
          const auto& blk5 = reinterpret_cast<const block_q5_0*>(row)[b];
          d[i] = fp16_to_fp32(blk5.d);
          std::memcpy(u, blk5.qs, 16);
          std::memcpy(&qh, blk5.qh, 4);
        } else if (t == weight_type::q5_1) {
          const auto& blk5 = reinterpret_cast<const block_q5_1*>(row)[b];
          d[i] = fp16_to_fp32(blk5.d);
          m[i] = fp16_to_fp32(blk5.m);
          std::memcpy(u, blk5.qs, 16);
          std::memcpy(&qh, blk5.qh, 4);
        } else if (t == weight_type::q4_0) {
          const auto& blk0 = reinterpret_cast<const block_q4_0*>(row)[b];
          d[i] = fp16_to_fp32(blk0.d);
          std::memcpy(u, blk0.qs, 16);
        } else if (t == weight_type::q4_1) {
          const auto& blk1 = reinterpret_cast<const block_q4_1*>(row)[b];
          d[i] = fp16_to_fp32(blk1.d);
          m[i] = fp16_to_fp32(blk1.m);
          std::memcpy(u, blk1.qs, 16);
        } else {
          const auto& blk8 = reinterpret_cast<const block_q8_0*>(row)[b];
          d[i] = fp16_to_fp32(blk8.d);
          for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(blk8.qs[j] + 128);
        }
        for (int64_t g = 0; g < int_byte_lines(t); ++g) std::memcpy(blk[g].b + 4 * i, u + 4 * g, 4);
        if (int_has_fifth_bits(t))
          for (int c = 0; c < 4; ++c) {
            uint8_t h = 0;
            for (int g = 0; g < 4; ++g)
              h |= static_cast<uint8_t>(((qh >> (4 * g + c)) & 1) << g | ((qh >> (16 + 4 * g + c)) & 1) << (4 + g));
            blk[4].b[4 * i + c] = h;
          }
      }
    }
}

namespace {

// Writes one row's k values (f32) into lane i of a bf16 panel, rounding to nearest even.
void store_panel_row(const float* row, int64_t k, int i, uint16_t* panel) {
  const __m256i round = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(row + j));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(round, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    // Four pairs of bf16 (two per 32-bit word after packing).
    const __m256i h = _mm256_srli_epi32(r, 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    alignas(16) uint32_t pairs[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(pairs), packed);
    for (int q = 0; q < 4; ++q) std::memcpy(panel + (j / 2 + q) * 32 + 2 * i, &pairs[q], 4);
  }
  for (; j < k; j += 2) {
    panel[(j / 2) * 32 + 2 * i] = fp32_to_bf16(row[j]);
    panel[(j / 2) * 32 + 2 * i + 1] = fp32_to_bf16(row[j + 1]);
  }
}

thread_local std::vector<float> tls_row;

}  // namespace

void pack_bf16_panels(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                      int64_t p1, uint16_t* out) {
  tls_row.resize(static_cast<size_t>(k));
  for (int64_t p = p0; p < p1; ++p) {
    uint16_t* panel = out + (p - p0) * panel_rows * k;
    for (int i = 0; i < panel_rows; ++i) {
      const int64_t r = p * panel_rows + i;
      if (r < rows) {
        dequantize_row(t, w + r * row_bytes, tls_row.data(), k);
      } else {
        std::fill(tls_row.begin(), tls_row.end(), 0.f);
      }
      store_panel_row(tls_row.data(), k, i, panel);
    }
  }
}

namespace {
// Rounds to bf16 (nearest even) as store_panel_row does, two values to one 32-bit lane.
uint32_t bf16_pair(float lo, float hi) {
  uint32_t a, b;
  std::memcpy(&a, &lo, 4);
  std::memcpy(&b, &hi, 4);
  a += 0x7fff + ((a >> 16) & 1);
  b += 0x7fff + ((b >> 16) & 1);
  return (a >> 16) | (b & 0xffff0000u);
}
}  // namespace

// Lane-parallel: an integer panel's line already holds the 16 rows side by side (4 bytes per
// row), so each 64-byte line of bf16 pairs comes out of one pass over the 16 lanes, with no
// per-row detour through f32 rows (the prompt GEMM pays this per step and panel; at AMX speed it
// rivals the products). Values: fma(d, u, m) rounded to nearest even, as the row-by-row
// dequantization gives (the test compares them bitwise).
void pack_bf16_panels_from_int(weight_type t, const line64* int_panels, int64_t k, int64_t p0, int64_t p1,
                               uint16_t* out) {
  const int64_t nb = k / qk, stride = int_panel_lines(t, k);
  for (int64_t p = p0; p < p1; ++p) {
    uint16_t* panel = out + (p - p0) * panel_rows * k;
    for (int64_t b = 0; b < nb; ++b) {
      const line64* blk = int_panels + p * stride + b * int_block_lines(t);
      float d[16], m[16];
      int_panel_scales(blk, t, d, m);
      // The block's 16 bf16 lines: line j = columns 2j, 2j+1 of the block, lane i = row i.
      alignas(64) uint32_t lines[16][16];
      // Lane i's 4 weight bytes of a group, columns c0..c0+3, into bf16 lines c0/2 and c0/2 + 1.
      auto put = [&](const uint8_t* bytes, int64_t c0) {
        for (int i = 0; i < 16; ++i) {
          const uint8_t* u = bytes + 4 * i;
          lines[c0 / 2][i] = bf16_pair(std::fma(d[i], float(u[0]), m[i]), std::fma(d[i], float(u[1]), m[i]));
          lines[c0 / 2 + 1][i] = bf16_pair(std::fma(d[i], float(u[2]), m[i]), std::fma(d[i], float(u[3]), m[i]));
        }
      };
      if (t == weight_type::q8_0) {  // byte c of lane i = column 4g + c
        for (int g = 0; g < 8; ++g) put(blk[g].b, 4 * g);
      } else {  // q4, q5: low nibbles = columns 4g + c, high = 16 + 4g + c
        for (int g = 0; g < 4; ++g) {
          uint8_t lo[64], hi[64];
          int_panel_group_bytes(blk, t, g, lo, hi);
          put(lo, 4 * g);
          put(hi, 16 + 4 * g);
        }
      }
      std::memcpy(panel + b * qk / 2 * 32, lines, sizeof lines);
    }
  }
}

void pack_bf16_panels_from_kq(weight_type t, const line64* kq_panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                              uint16_t* out) {
  if (use_avx512_kernels()) return pack_bf16_panels_from_kq_avx512(t, kq_panels, rows, k, p0, p1, out);
  tls_row.resize(static_cast<size_t>(k));
  for (int64_t p = p0; p < p1; ++p)
    for (int i = 0; i < panel_rows; ++i) {
      if (p * panel_rows + i < rows)
        dequantize_kq_panel_row(t, kq_panels, rows, k, p, i, tls_row.data());
      else
        std::fill(tls_row.begin(), tls_row.end(), 0.f);
      store_panel_row(tls_row.data(), k, i, out + (p - p0) * panel_rows * k);
    }
}

}  // namespace sy::cpu
