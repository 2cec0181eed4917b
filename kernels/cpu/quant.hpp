// ggml block formats as stored in GGUF files, plus the activation format the integer kernels
// use. Reference (scalar) conversions live here; they define what the fast kernels must match.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sy::cpu {

constexpr int qk = 32;  // elements per block for q4_0, q4_1, q8_0

struct block_q4_0 {
  uint16_t d;
  uint8_t qs[16];
};  // x = d * (q - 8)
struct block_q4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};  // x = d * q + m
struct block_q8_0 {
  uint16_t d;
  int8_t qs[32];
};  // x = d * q
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q8_0) == 34);
// In q4 blocks, byte j holds element j in its low nibble and element j + 16 in its high nibble.

// Activations quantized for the integer dot products: per 32 elements an int8 vector, its
// scale d and s = d * sum(q) (the term that q4_0/q4_1 offsets multiply).
struct block_q8_act {
  float d;
  float s;
  int8_t qs[32];
};

enum class weight_type { f32, f16, bf16, q4_0, q4_1, q8_0 };
const char* weight_type_name(weight_type t);
size_t row_bytes(weight_type t, int64_t n_cols);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t fp32_to_bf16(float f);  // round to nearest even

// Dequantize one row of `n` elements (n a multiple of the block size).
void dequantize_row(weight_type t, const void* row, float* out, int64_t n);
// Activation quantization (as ggml's q8_1): n a multiple of 32.
void quantize_row_q8_act(const float* x, block_q8_act* out, int64_t n);
// Reference dot product of a weight row with quantized activations (scalar).
float dot_row_q8_act_ref(weight_type t, const void* row, const block_q8_act* a, int64_t n);

}  // namespace sy::cpu
