#include "worker/model/cpu_backend.hpp"

namespace sy {

cpu_backend::cpu_backend(const llama_model& model, cpu::thread_pool& pool, int32_t n_kv_blocks, int32_t block_size,
                         cpu::kv_type type, int64_t max_context, const kv_window_split& split)
    : model_(model),
      arena_(split.window > 0 ? split.n_layer_global : model.hparams().n_layer, n_kv_blocks, block_size,
             model.hparams().kv_dim(), type, &pool),
      forward_(model, pool, max_context) {
  if (split.window > 0)
    window_ = kv_arena(split.n_layer_window, split.n_window_blocks, block_size, model.hparams().kv_dim(), type, &pool);
}

void cpu_backend::run_hidden(std::span<const batch_seq> batch, std::vector<float>& hidden) {
  forward_.run_hidden(batch, arena_, hidden, window_.n_blocks() > 0 ? &window_ : nullptr);
}

void cpu_backend::run(std::span<const batch_seq> batch, std::span<const row_sampling> /*sampling*/, step_output& out) {
  forward_.run(batch, arena_, out.logits, window_.n_blocks() > 0 ? &window_ : nullptr);
  out.tokens.assign(out.logits.size() / static_cast<size_t>(model_.hparams().n_vocab), step_output::k_not_sampled);
}

}  // namespace sy
