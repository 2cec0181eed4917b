// The CPU forward_backend: cpu_forward over a host kv_arena. It never samples (every logits row
// goes back to the engine's host samplers), so results are exactly cpu_forward's.
#pragma once

#include <string>

#include "worker/model/forward_backend.hpp"
#include "worker/model/kv_arena.hpp"
#include "worker/model/kv_window.hpp"

namespace sy {

class cpu_backend final : public forward_backend {
 public:
  // `type` must suit the model's head size (cpu::kv_type_error is empty); the caller checks.
  // `max_context`: the context served (cpu_forward's n_ctx). `split` (worker/model/kv_window.hpp):
  // with a window, n_kv_blocks blocks of the global layers plus split.n_window_blocks of the
  // windowed ones; else n_kv_blocks blocks of every layer.
  cpu_backend(const llama_model& model, cpu::thread_pool& pool, int32_t n_kv_blocks, int32_t block_size,
              cpu::kv_type type, int64_t max_context, const kv_window_split& split = {});

  void run(std::span<const batch_seq> batch, std::span<const row_sampling> sampling, step_output& out) override;
  bool samples() const override { return false; }
  void run_hidden(std::span<const batch_seq> batch, std::vector<float>& hidden) override;
  bool has_hidden_states() const override { return true; }
  int32_t n_kv_blocks() const override { return static_cast<int32_t>(arena_.n_blocks()); }
  int32_t n_window_blocks() const override { return static_cast<int32_t>(window_.n_blocks()); }
  int32_t block_size() const override { return static_cast<int32_t>(arena_.block_size()); }
  size_t kv_bytes() const override { return arena_.bytes() + window_.bytes(); }
  // The quantized weights as stored in the file (what the decode kernels read).
  size_t weight_read_bytes() const override { return model_.weight_bytes(); }
  size_t kv_bytes_per_token() const override {
    return static_cast<size_t>(2 * model_.hparams().n_layer * arena_.row_bytes());
  }
  std::string describe() const override { return "cpu"; }

 private:
  const llama_model& model_;
  kv_arena arena_;   // every layer, or the global layers with a window arena
  kv_arena window_;  // the windowed layers (worker/model/kv_window.hpp); empty without the release
  cpu_forward forward_;
};

}  // namespace sy
