// The Llama forward pass on the CPU over a ragged batch: every token of every sequence in the
// step goes through each weight matrix together; attention reads K/V through each sequence's
// block table in the kv_arena.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "common/tokenizer/tokenizer.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "worker/model/kv_arena.hpp"
#include "worker/model/llama_model.hpp"

namespace sy {

struct batch_seq {
  std::span<const token_id> tokens;    // new tokens of this step
  int64_t pos0 = 0;                    // position of tokens[0]; K/V for [0, pos0) are cached
  std::span<const int32_t> block_ids;  // block table covering [0, pos0 + tokens.size())
  bool all_logits = false;             // logits for every token, else only the last
  bool logits = true;                  // false: no logits at all (a mid-prompt chunk)
  // Positions < n_prompt are prompt tokens (prefill kernels: bf16 panel GEMM), the rest are
  // generated tokens (integer GEMV on the quantized weights) — fixed per position, so a
  // token's numerics are the same alone, batched, chunked, cached or recomputed.
  int64_t n_prompt = 0;
  // With the sliding-window release (worker/model/kv_window.hpp), the windowed layers' table into the
  // window arena: as long as block_ids, entries behind the window k_released_block. Empty
  // without the release (every layer reads block_ids).
  std::span<const int32_t> window_block_ids{};
};

class cpu_forward {
 public:
  // `n_ctx`: the context the worker serves (LongRoPE picks its factors by it; llama_model::rope).
  cpu_forward(const llama_model& model, cpu::thread_pool& pool, int64_t n_ctx);

  // Runs the batch, writes K/V of the new tokens into `kv`, and fills `logits` with one row of
  // n_vocab per requested token, in batch order. Token ids must be < n_vocab (checked by the
  // caller at admission; asserted here). With `window_kv` (the sliding-window release), `kv`
  // holds the global layers in their order and `window_kv` the windowed ones, read through
  // each sequence's window_block_ids; without it `kv` holds every layer.
  void run(std::span<const batch_seq> batch, kv_arena& kv, std::vector<float>& logits, kv_arena* window_kv = nullptr);
  // As run(), but `hidden` gets the final hidden state after the output norm (what the output
  // head would read) of each of those rows, [n][n_embd]: embeddings (forward_backend::run_hidden).
  void run_hidden(std::span<const batch_seq> batch, kv_arena& kv, std::vector<float>& hidden,
                  kv_arena* window_kv = nullptr);

 private:
  // One row of the activations: a token of the step.
  struct row_info {
    int32_t seq;  // index into the batch
    int64_t pos;
    token_id token;
  };

  // Where layer l's K/V live this run: the arena, the layer's index in it, and whether the
  // sequences' window tables address it.
  struct layer_kv {
    kv_arena* arena;
    int64_t layer;
    bool window_table;
  };
  layer_kv kv_of(int64_t l) const;
  static std::span<const int32_t> table_of(const batch_seq& b, const layer_kv& at) {
    return at.window_table ? b.window_block_ids : b.block_ids;
  }

  // The steps of run(), in order; each reads the rows planned by plan_rows.
  void plan_rows(std::span<const batch_seq> batch);
  void size_buffers(std::span<const batch_seq> batch);
  // Throws std::invalid_argument when a table is too short, or an id out of range or released
  // where the step reads or writes it.
  void check_tables(std::span<const batch_seq> batch) const;
  void attention_block(int64_t l, std::span<const batch_seq> batch);
  void store_qkv(int64_t l, const llama_layer& L, std::span<const batch_seq> batch);
  void attend(int64_t l, std::span<const batch_seq> batch);
  void ffn_block(const llama_layer& L);
  void post_norm(const std::vector<float>& norm);
  // Every layer over the planned rows; false when the batch has no rows.
  bool run_layers(std::span<const batch_seq> batch, kv_arena& kv, kv_arena* window_kv);
  // The last residual, then the output norm of the wanted rows into xn_ (rows 0..n_out).
  void final_norm();
  void output_logits(std::vector<float>& logits);
  // y = x W^T for every row, several layers sharing the input `x` at once.
  void linears(std::initializer_list<cpu::linear_out> outs, const float* x, int64_t ldx);
  // x += tmp (the residual of the block before) when `add`, then xn = rms_norm(x) with `norm`.
  void add_then_norm(bool add, const std::vector<float>& norm);
  // fn(i) for every row i, split over the pool when the step has enough rows to pay for a job.
  template <class F>
  void per_row(F&& fn) {
    pool_.for_each(static_cast<int64_t>(rows_.size()), 16, fn);
  }

  const llama_model& model_;
  cpu::thread_pool& pool_;
  int64_t n_ctx_ = 0;
  // Per layer: its index among the global layers, or among the windowed ones when windowed.
  std::vector<int64_t> kind_index_;
  kv_arena* kv_ = nullptr;         // this run's arenas
  kv_arena* window_kv_ = nullptr;  // null: kv_ holds every layer
  // The step's rows: generated-token rows first (n_decode_ of them), then prompt-token rows;
  // out_rows_: the rows whose logits are wanted, in batch order. Rebuilt by every run().
  std::vector<row_info> rows_;
  std::vector<int64_t> out_rows_;
  int64_t n_decode_ = 0;
  // Activations, [n_tokens][width]; reused across steps.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, tmp_, gate_, up_;
  std::vector<float> scores_;  // per thread: attend_group_scratch floats
  int64_t scratch_ = 0;        // floats of scores_ per thread
  // Per sequence, the current layer's K and V block pointers (rebuilt per layer).
  std::vector<std::vector<const void*>> kb_, vb_;
};

}  // namespace sy
