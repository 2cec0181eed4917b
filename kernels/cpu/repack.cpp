// Weight layouts built from the GGUF rows (gemm_kernels.hpp): integer panels for the AVX-512 VNNI
// decode kernel (built once at load), and bf16 panels for the prompt GEMM (built per call into a
// small scratch, so no second full copy of the weights stays resident).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {

void repack_int_panels(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                       int64_t p1, line64* out) {
  const int64_t nb = k / qk, nl = n_int_lines(t), stride = int_panel_lines(t, k);
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t b = 0; b < nb; ++b) {
      line64* blk = out + p * stride + b * (nl + 2);
      std::memset(blk, 0, static_cast<size_t>(nl + 2) * sizeof(line64));
      float* d = reinterpret_cast<float*>(blk[nl].b);
      float* m = reinterpret_cast<float*>(blk[nl + 1].b);
      for (int i = 0; i < panel_rows; ++i) {
        const int64_t r = p * panel_rows + i;
        if (r >= rows) break;
        const uint8_t* row = w + r * row_bytes;
        uint8_t u[32];  // q4: the 16 GGUF nibble bytes; q8_0: 32 bytes q + 128
        if (t == weight_type::q4_0) {
          const auto& blk0 = reinterpret_cast<const block_q4_0*>(row)[b];
          d[i] = fp16_to_fp32(blk0.d);
          m[i] = -8.f * d[i];
          std::memcpy(u, blk0.qs, 16);
        } else if (t == weight_type::q4_1) {
          const auto& blk1 = reinterpret_cast<const block_q4_1*>(row)[b];
          d[i] = fp16_to_fp32(blk1.d);
          m[i] = fp16_to_fp32(blk1.m);
          std::memcpy(u, blk1.qs, 16);
        } else {
          const auto& blk8 = reinterpret_cast<const block_q8_0*>(row)[b];
          d[i] = fp16_to_fp32(blk8.d);
          m[i] = -128.f * d[i];
          for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(blk8.qs[j] + 128);
        }
        for (int64_t g = 0; g < nl; ++g) std::memcpy(blk[g].b + 4 * i, u + 4 * g, 4);
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

void pack_bf16_panels_from_int(weight_type t, const line64* int_panels, int64_t k, int64_t p0, int64_t p1,
                               uint16_t* out) {
  const int64_t nb = k / qk, nl = n_int_lines(t), stride = int_panel_lines(t, k);
  tls_row.resize(static_cast<size_t>(k));
  for (int64_t p = p0; p < p1; ++p) {
    uint16_t* panel = out + (p - p0) * panel_rows * k;
    for (int i = 0; i < panel_rows; ++i) {
      for (int64_t b = 0; b < nb; ++b) {
        const line64* blk = int_panels + p * stride + b * (nl + 2);
        float d, m;
        std::memcpy(&d, blk[nl].b + 4 * i, 4);
        std::memcpy(&m, blk[nl + 1].b + 4 * i, 4);
        float* x = tls_row.data() + b * qk;
        for (int64_t g = 0; g < nl; ++g)
          for (int c = 0; c < 4; ++c) {
            const uint8_t u = blk[g].b[4 * i + c];
            if (nl == 8) {
              x[4 * g + c] = d * u + m;
            } else {  // nibble byte 4g + c: low = element 4g + c, high = element 16 + 4g + c
              x[4 * g + c] = d * (u & 15) + m;
              x[16 + 4 * g + c] = d * (u >> 4) + m;
            }
          }
      }
      store_panel_row(tls_row.data(), k, i, panel);
    }
  }
}

}  // namespace sy::cpu
