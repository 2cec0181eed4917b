// A linear layer's weight (rows = output features, cols = input features) and y = x W^T over a
// batch of tokens.
//
// One resident copy of the weights: the GGUF rows copied onto huge pages at load, or repacked:
// q4_K/q5_K/q6_K into K panels on every CPU, q4_0/q4_1/q5_0/q5_1/q8_0 into integer panels on
// AVX-512 VNNI machines; the map's pages are let go.
// Two paths; the caller picks one per token by its role (cpu_forward.hpp), never by the batch
// size, so a token's result does not depend on what else is in the step:
//  * forward_gemv (generated tokens, output head): for quantized weights, integer kernels against
//    activations quantized to 8 bits as llama.cpp does (per 32 for q4_0..q8_0, per 256 for the
//    K-quants); K-quants run on 16-row K panels on every CPU (kquant_panels.hpp), and with AVX-512
//    VNNI q4_0/q4_1/q5_0/q5_1/q8_0 on 16-row integer panels (gemm_kernels.hpp), from 12-16 tokens
//    on AMX tiles where the CPU has them (the same results).
//    Float weights (f32/f16/bf16): f32 FMAs on the rows as stored;
//  * forward_gemm (prompt tokens): a tiled GEMM (AMX tdpbf16ps, AVX-512 BF16 dot products, or f32 FMA)
//    over bf16 16-row panels built from the weights a few panels at a time into a per-thread
//    scratch, so the conversion is paid once per step and panel and no bf16 copy stays resident
//    (unless keep_prompt_panels() asked for one: then the panels are built once, at load);
//    except K-quants on CPUs without AMX, whose prompt tokens take the integer kernel (faster
//    there; see prompt_on_integer_kernel).
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
  // `data` (row-major, `type` blocks, in the model's memory map) must outlive this object.
  // `arena`: arena_bytes() of memory (64-byte aligned, outliving this object) for the layer's own
  // copy; null: the layer allocates it (a model gives all its layers one arena, so the huge-page
  // rounding is paid once, not per matrix).
  linear(weight_type type, const void* data, int64_t rows, int64_t cols, thread_pool& pool, void* arena = nullptr);
  // Bytes of memory of its own a layer of this shape holds on this machine (a multiple of 64): its
  // K panels (q4_K/q5_K/q6_K) or integer panels (AVX-512 VNNI, q4_0/q4_1/q5_0/q5_1/q8_0), else
  // the copy of its rows, or 0 with SY_HUGE_PAGES=0 (it then computes from the source rows).
  static size_t arena_bytes(weight_type type, int64_t rows, int64_t cols);
  // When the layer holds its own copy (huge-page rows or panels), returns the source rows'
  // pages to the kernel: only for a source in a file mapping (the model's), where they are re-read
  // from the page cache if touched again (the portable fallback of an int-panel layer).
  // SY_KEEP_MAPPED_WEIGHTS=1 keeps them.
  void release_source_pages() const;
  // Movable (the owned copy moves with its pointer), not copyable.
  linear(linear&&) noexcept = default;
  linear& operator=(linear&&) noexcept = default;
  linear(const linear&) = delete;
  linear& operator=(const linear&) = delete;

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  weight_type type() const { return type_; }
  // Bytes of the weights as stored in the file, and of what this layer holds in memory of its own
  // (the huge-page copy of the rows, or the integer panels).
  size_t file_bytes() const { return static_cast<size_t>(row_bytes_ * rows_); }
  size_t repacked_bytes() const { return held_bytes_; }
  // Whether forward_gemm runs on the integer kernel rather than the bf16 panel GEMM: for K-quants
  // on CPUs without AMX, where it is the faster of the two (AVX2: the K-panel kernel, q4_K ~90
  // GMAC/s per core at 32 tokens, against ~30 for the f32-FMA panel GEMM on a Zen 3 core; AVX-512: the
  // K-panel VNNI kernel, pp512 on the 1B Q4_K_M file 205-211 tok/s against 66 for the bf16 panels,
  // whose per-step dequantization dominates). With AMX the bf16 tiles win (238 tok/s).
  bool prompt_on_integer_kernel() const;
  // Opts this layer's prompt tokens into the integer kernel also where it has integer panels
  // (q4_0/q4_1/q5_0/q5_1/q8_0 on AVX-512 VNNI without AMX): 8-bit activations per 32, as decode
  // and llama.cpp use, instead of bf16. Faster (AMD Zen 4, pp512: a 1B-shaped Q8_0 file 187 ->
  // 240-255 tok/s, SmolLM2-135M Q4_1 1206-1305 -> 1441-1635, pp64 1082 -> 1967) and less exact
  // (SmolLM2 Q4_1, teacher-forced top-1 against exact arithmetic: 96.9 % against 98.4-99.0 %,
  // llama.cpp's level), so not the default. Returns whether the prompt tokens now take it.
  bool use_integer_prompts();
  // Keeps the bf16 panels of the prompt GEMM resident (built now, 2 bytes per weight) instead of
  // converting them in every step that has prompt rows: the conversion is a fixed cost per step
  // (~28 ms for the 135M model on 2 EPYC cores), which is what a small prompt chunk costs most under a
  // step-time budget (docs/worker.md, "Step-time budget"). The same panels, so the same results.
  // Nothing for a layer whose prompt tokens take the integer kernel. Returns the bytes it holds.
  size_t keep_prompt_panels(thread_pool& pool);
  size_t prompt_panel_bytes() const { return prompt_panels_.size() * sizeof(uint16_t); }

  // y[t * ldy + r] = sum_k W[r][k] x[t * ldx + k], t < n_tok, r < rows, by either path.
  void forward_gemv(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy, thread_pool& pool) const;
  void forward_gemm(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy, thread_pool& pool) const;

 private:
  friend void forward_gemv_fused(std::span<const linear_out>, const float*, int64_t, int64_t, thread_pool&);
  friend void forward_gemm_fused(std::span<const linear_out>, const float*, int64_t, int64_t, thread_pool&);
  template <class F>
  static void for_panels(std::span<const linear_out> outs, int64_t n_tok, thread_pool& pool, F&& fn);
  // Whether the AVX-512 VNNI kernel may run this layer now on its integer panels (built and not
  // forced portable); whether it has K panels (which every kernel family runs).
  bool vnni_ready() const;
  bool kq_ready() const;

  // bf16 panels [p0, p1) into out (prompt GEMM), from the integer panels where built.
  void pack_panels(int64_t p0, int64_t p1, uint16_t* out) const;

  weight_type type_ = weight_type::f32;
  const uint8_t* source_ = nullptr;  // the caller's rows (the model's memory map)
  const uint8_t* data_ = nullptr;    // the rows computed from: own_ or source_, row_bytes_ apart
  int64_t rows_ = 0, cols_ = 0;
  int64_t row_bytes_ = 0;
  int64_t n_panels_ = 0;  // 16-row groups
  // q4_0/q4_1/q5_0/q5_1/q8_0 repacked for the AVX-512 VNNI kernel (gemm_kernels.hpp), in the arena or own_;
  // else null. Otherwise the arena or own_ holds the copy of the rows data_ points to (none with
  // SY_HUGE_PAGES=0: data_ == source_).
  const line64* int_panels_ = nullptr;
  // q4_K/q5_K/q6_K repacked the same way into K panels (kquant_panels.hpp); else null.
  const line64* kq_panels_ = nullptr;
  bool integer_prompts_ = false;                                        // use_integer_prompts()
  size_t held_bytes_ = 0;                                               // arena_bytes() of this layer
  std::vector<uint8_t, huge_page_allocator<uint8_t>> own_;              // when no arena was given
  std::vector<uint16_t, huge_page_allocator<uint16_t>> prompt_panels_;  // keep_prompt_panels(), else empty
};

}  // namespace sy::cpu
