// A linear layer's weight (rows = output features, cols = input features) and y = x W^T over a
// batch of tokens.
//
// Two representations; the caller picks one per token by its role (cpu_forward.hpp), never by
// the batch size, so a token's result does not depend on what else is in the step:
//  * forward_gemv (generated tokens, output head): integer kernels straight on the GGUF blocks
//    (q4_0/q4_1/q8_0) against activations quantized to 8 bits per 32 (as llama.cpp does) —
//    reads the fewest bytes;
//  * forward_gemm (prompt tokens): a bf16 copy repacked into 16-row panels at load
//    (gemm_kernels.hpp), run as a register-tiled GEMM (AVX-512 BF16 dot products, or f32 FMA).
// Float weight types (f32/f16/bf16) always take the panel path.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/quant.hpp"

namespace sy::cpu {

class thread_pool;

class linear {
 public:
  linear() = default;
  // `data` (row-major, `type` blocks) must outlive this object (it points into the mmap).
  linear(weight_type type, const void* data, int64_t rows, int64_t cols, thread_pool& pool);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  weight_type type() const { return type_; }
  bool has_integer_path() const;
  size_t panel_bytes() const { return panels_.size() * sizeof(uint16_t); }

  // y[t * ldy + r] = sum_k W[r][k] x[t * ldx + k], t < n_tok, r < rows, by either path.
  void forward_gemv(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy, thread_pool& pool) const;
  void forward_gemm(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy, thread_pool& pool) const;

 private:
  weight_type type_ = weight_type::f32;
  const uint8_t* data_ = nullptr;
  int64_t rows_ = 0, cols_ = 0;
  int64_t row_bytes_ = 0;
  int64_t n_panels_ = 0;
  std::vector<uint16_t> panels_;  // n_panels_ * 16 * cols_ bf16 values
};

}  // namespace sy::cpu
