// ggml block formats as stored in GGUF files, plus the activation format the integer kernels
// use. Reference (scalar) conversions live here; they define what the fast kernels must match.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sy::cpu {

constexpr int qk = 32;     // elements per block for q4_0, q4_1, q5_0, q5_1, q8_0
constexpr int qk_k = 256;  // elements per super-block of the K-quants (q4_K, q5_K, q6_K)

struct block_q4_0 {
  uint16_t d;
  uint8_t qs[16];
};  // x = d * (q - 8)
struct block_q4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};  // x = d * q + m
struct block_q5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit j of the little-endian u32: fifth bit of element j
  uint8_t qs[16];
};  // x = d * (q - 16)
struct block_q5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};  // x = d * q + m
struct block_q8_0 {
  uint16_t d;
  int8_t qs[32];
};  // x = d * q
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q5_0) == 22 && sizeof(block_q5_1) == 24);
// In q4/q5 blocks, byte j holds element j in its low nibble and element j + 16 in its high nibble.

// K-quants: 256 elements per super-block, sub-blocks with their own scales.
// q4_K / q5_K: 8 sub-blocks of 32, each with a 6-bit scale sc and 6-bit min m packed in `scales`
// (get_scale_min_k4); x = d * sc * q - dmin * m. Elements 64g..64g+31 are the low nibbles of
// qs[32g..32g+31], elements 64g+32..64g+63 their high nibbles; q5_K adds bit 2g (low half) or
// 2g+1 (high half) of qh[l] as the fifth bit of element 64g+l (+32).
struct block_q4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct block_q5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// q6_K: 16 sub-blocks of 16 with int8 scales; x = d * scales[e / 16] * (q - 32), q 6 bits: per
// half n (128 elements), element 128n + 32c + l (c < 4, l < 32) has its low 4 bits in
// ql[64n + l + 32 (c & 1)] (low nibble for c < 2, high nibble otherwise) and its top 2 bits at
// bit 2c of qh[32n + l].
struct block_q6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210);
// The 6-bit (scale, min) pair j < 8 of a q4_K / q5_K super-block.
inline void k_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Activations quantized for the integer dot products: per 32 elements an int8 vector, its
// scale d and s = d * sum(q) (the term that q4_0/q4_1/q5_0/q5_1 offsets multiply).
struct block_q8_act {
  float d;
  float s;
  int8_t qs[32];
};
// Activations for the K-quant products, as ggml's q8_K: per 256 elements one scale, int8 values
// and the sums of each 16 (for the q6_K offset), plus the sums of each 32 (for the mins).
struct block_q8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
  int16_t sums32[8];  // sums of each 32 (bsums pairwise): the q4_K / q5_K mins term
};
// A q8_K block with nothing to scale, as every quantizer writes it: all zeros with d = 0, or, where
// a value was not finite, a NaN scale that shows in the output of a diverged model.
inline void set_q8_K_unscaled(block_q8_K& b, bool finite) {
  b.d = finite ? 0.f : __builtin_nanf("");
  std::memset(b.qs, 0, sizeof b.qs);
  std::memset(b.bsums, 0, sizeof b.bsums);
  std::memset(b.sums32, 0, sizeof b.sums32);
}

enum class weight_type { f32, f16, bf16, q4_0, q4_1, q8_0, q5_0, q5_1, q4_k, q5_k, q6_k };
const char* weight_type_name(weight_type t);
// Elements per block (1 for f32/f16/bf16, 32, or 256 for K-quants) and bytes of a row of n.
int64_t block_elements(weight_type t);
size_t row_bytes(weight_type t, int64_t n_cols);
inline bool is_float_type(weight_type t) {
  return t == weight_type::f32 || t == weight_type::f16 || t == weight_type::bf16;
}
inline bool is_k_quant(weight_type t) {
  return t == weight_type::q4_k || t == weight_type::q5_k || t == weight_type::q6_k;
}

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t fp32_to_bf16(float f);  // round to nearest even

// The 32 unsigned 5-bit values of a q5_0/q5_1 block from its qh (4 bytes) followed by qs (16).
void unpack_q5(const uint8_t* qh_qs, uint8_t* q);
// The values, sub-block scales and mins of one K-quant super-block as stored: q4_K/q5_K 256
// unsigned values (0..15 / 0..31) with 8 six-bit scales and 8 mins; q6_K the 256 values q + 32
// (0..63) with 16 int8 scales (mins unused). The definition every repacked layout is checked against.
void unpack_k_block(weight_type t, const void* blk, uint8_t* q, int8_t* sc, uint8_t* mn);
// dequantize_row for the K-quants (kernels/cpu/quant_k.cpp).
void dequantize_row_k(weight_type t, const void* row, float* out, int64_t n);

// Dequantize one row of `n` elements (n a multiple of the block size).
void dequantize_row(weight_type t, const void* row, float* out, int64_t n);
// Activation quantization (as ggml's q8_1): n a multiple of 32.
void quantize_row_q8_act(const float* x, block_q8_act* out, int64_t n);
// Activation quantization for K-quant weights (ggml's q8_K, same rounding): n a multiple of 256.
void quantize_row_q8_K(const float* x, block_q8_K* out, int64_t n);
// Reference dot products of a weight row with quantized activations (scalar, exact integer sums
// per block, then the block's scale): q4_0/q4_1/q5_0/q5_1/q8_0 with q8_act, K-quants with q8_K.
float dot_row_q8_act_ref(weight_type t, const void* row, const block_q8_act* a, int64_t n);
float dot_row_q8_K_ref(weight_type t, const void* row, const block_q8_K* a, int64_t n);

}  // namespace sy::cpu
