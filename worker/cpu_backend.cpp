#include "worker/cpu_backend.hpp"

namespace sy {

cpu_backend::cpu_backend(const llama_model& model, cpu::thread_pool& pool, int32_t n_kv_blocks, int32_t block_size,
                         cpu::kv_type type, int64_t max_context)
    : model_(model),
      arena_(model.hparams().n_layer, n_kv_blocks, block_size, model.hparams().kv_dim(), type),
      forward_(model, pool, max_context) {}

void cpu_backend::run_hidden(std::span<const batch_seq> batch, std::vector<float>& hidden) {
  forward_.run_hidden(batch, arena_, hidden);
}

void cpu_backend::run(std::span<const batch_seq> batch, std::span<const row_sampling> /*sampling*/, step_output& out) {
  forward_.run(batch, arena_, out.logits);
  out.tokens.assign(out.logits.size() / static_cast<size_t>(model_.hparams().n_vocab), step_output::k_not_sampled);
}

}  // namespace sy
