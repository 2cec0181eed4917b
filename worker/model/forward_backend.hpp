// The engine's view of where the model runs (docs/cuda-backend.md, "The engine on the device"):
// one forward over a ragged batch per step, the KV storage its block ids address, and optionally
// sampling where the logits are.
//
// The engine keeps everything else on the host and identical for every backend: the scheduler,
// the block pool (bookkeeping only), the per-request samplers, detokenizer and stop strings.
// A backend owns the K/V bytes (its own layout inside a block): block ids in a batch_seq's table
// index its storage, and it holds exactly n_kv_blocks() blocks of block_size() positions.
//
// Implementations: cpu_backend (worker/model/cpu_backend: cpu_forward over a host kv_arena, never
// samples) and cuda_forward (worker/model/cuda_forward: device arena, samples rows on the device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/sampling_draw.hpp"
#include "worker/model/cpu_forward.hpp"

namespace sy {

// How one logits row of a step is consumed. With on_backend the backend samples the row where
// it computed it with `draw` (common/sampling_draw.hpp, the device sampler's parameters as they
// are) and returns only the token; without it the row comes back for the host sampler.
struct row_sampling {
  bool on_backend = false;
  sampling_draw draw;  // meaningful with on_backend; the engine fills it with draw_of()
};

// What one step produced. Logits rows are the rows the batch asks for (the last token of each
// batch_seq with `logits`, or all its tokens with `all_logits`), in batch order.
struct step_output {
  static constexpr token_id k_not_sampled = -1;
  // One per logits row: the token the backend sampled, or k_not_sampled (the row is in `logits`).
  std::vector<token_id> tokens;
  // The rows not sampled by the backend, [n][n_vocab] fp32, in batch order.
  std::vector<float> logits;
};

class forward_backend {
 public:
  virtual ~forward_backend() = default;

  // Runs the batch (the contract of cpu_forward::run: K/V of the new tokens written through the
  // block tables, causal attention over [0, pos]). `sampling` holds one entry per logits row, or
  // is empty: every row comes back as logits. Throws std::invalid_argument on a malformed batch
  // (block table too short, block or token id out of range), std::runtime_error on a device error.
  virtual void run(std::span<const batch_seq> batch, std::span<const row_sampling> sampling, step_output& out) = 0;

  // True when run() honours row_sampling::on_backend; else every row comes back as logits.
  virtual bool samples() const = 0;
  // Embeddings (docs/worker.md, "Embeddings"): runs the batch as run() does (K/V written through
  // the block tables) but, instead of logits, fills `hidden` with the final hidden state after
  // the output norm (before the output head) of each row run() would return logits for,
  // [n][n_embd] fp32, in batch order. Backends without it (has_hidden_states() false) throw
  // std::logic_error.
  virtual void run_hidden(std::span<const batch_seq> batch, std::vector<float>& hidden);
  virtual bool has_hidden_states() const { return false; }
  virtual int32_t n_kv_blocks() const = 0;
  // Blocks of the windowed layers' own arena (the sliding-window release, worker/model/kv_window.hpp),
  // addressed by batch_seq::window_block_ids; 0: every layer lives in the n_kv_blocks() blocks
  // (a backend without the release, e.g. CUDA). A wrapping backend passes its inner one's on.
  virtual int32_t n_window_blocks() const = 0;
  virtual int32_t block_size() const = 0;
  virtual size_t kv_bytes() const = 0;
  // Bytes of weights one decode step reads (every matrix and norm; the embedding table only as the
  // rows it gathers, not counted): the numerator of a memory-bandwidth figure.
  virtual size_t weight_read_bytes() const = 0;
  // Bytes of K and V one cached token takes, all layers.
  virtual size_t kv_bytes_per_token() const = 0;
  // "cpu", "cuda:0 (NVIDIA H200, graphs on)": for logs and benchmarks.
  virtual std::string describe() const = 0;
};

inline void forward_backend::run_hidden(std::span<const batch_seq>, std::vector<float>&) {
  throw std::logic_error(describe() + ": this backend does not compute embeddings");
}

}  // namespace sy
