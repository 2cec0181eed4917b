#include "worker/kv_window.hpp"

#include "worker/llama_model.hpp"

namespace sy {

kv_window_split split_kv_budget(const llama_model& model, int32_t n_full_blocks, int32_t block_size,
                                int64_t max_context, int32_t max_step_tokens, bool release) {
  kv_window_split s;
  const llama_hparams& hp = model.hparams();
  for (const llama_layer& L : model.layers()) ++(L.windowed ? s.n_layer_window : s.n_layer_global);
  s.n_global_blocks = n_full_blocks;
  if (!release || hp.sliding_window <= 0 || s.n_layer_window == 0 || s.n_layer_global == 0) {
    s.n_layer_global = static_cast<int32_t>(hp.n_layer);
    s.n_layer_window = 0;
    return s;
  }
  const int64_t bs = block_size, W = hp.sliding_window;
  const int64_t per_seq_global = (max_context + bs - 1) / bs;
  const int64_t per_seq_window = std::min(per_seq_global, window_blocks_per_seq(W, bs, 1));
  const int64_t chunk = window_blocks_per_seq(W, bs, max_step_tokens);
  // Budget in layer-blocks; n max-context sequences take n * (g * Lg + w * Lw) of it.
  const int64_t budget = int64_t{n_full_blocks} * hp.n_layer;
  const int64_t n_seq = budget / (per_seq_global * s.n_layer_global + per_seq_window * s.n_layer_window);
  int64_t n_window = std::min<int64_t>(n_full_blocks, std::max<int64_t>(n_seq * per_seq_window, 0) + chunk);
  const int64_t n_global = (budget - n_window * s.n_layer_window) / s.n_layer_global;
  if (n_global < per_seq_global || n_window < chunk) {  // too small a budget to split: no release
    s.n_layer_global = static_cast<int32_t>(hp.n_layer);
    s.n_layer_window = 0;
    return s;
  }
  s.window = W;
  s.n_global_blocks = static_cast<int32_t>(std::min<int64_t>(n_global, 1 << 30));
  s.n_window_blocks = static_cast<int32_t>(n_window);
  return s;
}

}  // namespace sy
