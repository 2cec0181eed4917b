#include "worker/model/kv_window.hpp"

#include "worker/model/llama_model.hpp"

namespace sy {

kv_window_split split_kv_budget(int32_t n_layer_global, int32_t n_layer_window, int64_t window, int32_t n_full_blocks,
                                int32_t block_size, int64_t max_context, int32_t max_step_tokens) {
  kv_window_split s;
  s.n_layer_global = n_layer_global + n_layer_window;  // until a split is made
  s.n_global_blocks = n_full_blocks;
  if (window <= 0 || n_layer_window == 0 || n_layer_global == 0) return s;
  const int64_t bs = block_size, n_layer = n_layer_global + n_layer_window;
  const int64_t per_seq_global = (max_context + bs - 1) / bs;
  const int64_t per_seq_window = std::min(per_seq_global, window_blocks_per_seq(window, bs, 1));
  const int64_t chunk = window_blocks_per_seq(window, bs, max_step_tokens);
  // Budget in layer-blocks; n max-context sequences take n * (g * Lg + w * Lw) of it.
  const int64_t budget = int64_t{n_full_blocks} * n_layer;
  const int64_t n_seq = budget / (per_seq_global * n_layer_global + per_seq_window * n_layer_window);
  const int64_t n_window = std::min<int64_t>(n_full_blocks, n_seq * per_seq_window + chunk);
  const int64_t n_global = (budget - n_window * n_layer_window) / n_layer_global;
  if (n_global < per_seq_global || n_window < chunk) return s;  // too small a budget to split
  s.window = window;
  s.n_layer_global = n_layer_global;
  s.n_layer_window = n_layer_window;
  s.n_global_blocks = static_cast<int32_t>(std::min<int64_t>(n_global, 1 << 30));
  s.n_window_blocks = static_cast<int32_t>(n_window);
  return s;
}

kv_window_split split_kv_budget(const llama_model& model, int32_t n_full_blocks, int32_t block_size,
                                int64_t max_context, int32_t max_step_tokens, bool release) {
  int32_t n_window = 0;
  for (const llama_layer& L : model.layers()) n_window += L.windowed;
  const auto n_global = static_cast<int32_t>(model.hparams().n_layer) - n_window;
  return split_kv_budget(n_global, release ? n_window : 0, model.hparams().sliding_window, n_full_blocks, block_size,
                         max_context, max_step_tokens);
}

}  // namespace sy
