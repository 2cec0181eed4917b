// A linear layer's weight (rows = output features, cols = input features) and y = x W^T over a
// batch of tokens.
//
// Two representations; the caller picks one per token by its role (cpu_forward.hpp), never by
// the batch size, so a token's result does not depend on what else is in the step:
//  * forward_gemv (generated tokens, output head): integer kernels on the q4_0/q4_1/q8_0 weights
//    against activations quantized to 8 bits per 32 (as llama.cpp does). With AVX-512 VNNI the
//    weights are repacked at load into 16-row integer panels (gemm_kernels.hpp: one vpdpbusd
//    serves 16 rows, ~3.5x faster than dotting row by row); the portable AVX2 kernel reads the
//    GGUF blocks as they are;
//  * forward_gemm (prompt tokens): a bf16 copy repacked into 16-row panels at load
//    (gemm_kernels.hpp), run as a register-tiled GEMM (AVX-512 BF16 dot products, or f32 FMA).
// Float weight types (f32/f16/bf16) always take the panel path.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/cpu/huge_pages.hpp"

namespace sy::cpu {

class thread_pool;
class linear;

// One output of a fused product: y[t * ldy + r] = sum_k W[r][k] x[t][k] with W = *w.
struct linear_out {
  const linear* w;
  float* y;
  int64_t ldy;
};
// Several layers on the same input (Q, K, V; gate, up) in one pass: the activations are
// converted once and one pool job covers all their panels. Each output is exactly what the
// layer's own forward_gemv / forward_gemm gives. All layers must have the same cols.
void forward_gemv_fused(std::span<const linear_out> outs, const float* x, int64_t ldx, int64_t n_tok,
                        thread_pool& pool);
void forward_gemm_fused(std::span<const linear_out> outs, const float* x, int64_t ldx, int64_t n_tok,
                        thread_pool& pool);

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
  friend void forward_gemv_fused(std::span<const linear_out>, const float*, int64_t, int64_t, thread_pool&);
  friend void forward_gemm_fused(std::span<const linear_out>, const float*, int64_t, int64_t, thread_pool&);
  template <class F>
  static void for_panels(std::span<const linear_out> outs, thread_pool& pool, F&& fn);
  // The AVX2 integer kernel straight on the GGUF blocks (no AVX-512 VNNI, or forced portable).
  void forward_gemv_portable(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy,
                             thread_pool& pool) const;

  weight_type type_ = weight_type::f32;
  const uint8_t* data_ = nullptr;
  int64_t rows_ = 0, cols_ = 0;
  int64_t row_bytes_ = 0;
  int64_t n_panels_ = 0;
  std::vector<uint16_t, huge_page_allocator<uint16_t>> panels_;  // n_panels_ * 16 * cols_ bf16 values
  std::vector<line64, huge_page_allocator<line64>>
      int_panels_;  // integer weights for the AVX-512 VNNI kernel (gemm_kernels.hpp)
};

}  // namespace sy::cpu
