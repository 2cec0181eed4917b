// The Llama forward pass on a CUDA device (docs/cuda-backend.md), as a forward_backend of the
// engine: weights dequantized once at load to fp16 in device memory, every linear layer one cuBLAS
// GEMM (fp16 inputs, fp32 accumulation, tensor cores) over the whole ragged batch of the step, own
// kernels for the rest (kernels/cuda/), and the KV cache in device memory as fp16 blocks addressed
// by the same block tables the CPU engine uses.
//
// Serves what llama_model loads, with cpu_forward's semantics: architectures "llama" (Llama 2/3.x
// with rope_freqs.weight divisors, Mistral, SmolLM2) and "qwen2" (Q/K/V biases added before RoPE,
// neox RoPE), RoPE linear scaling, every weight type (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1,
// q8_0, q4_K, q5_K, q6_K). The embedding table stays on the device as stored in the file and the
// step's rows are dequantized to fp32 exactly as llama_model::embed does; every matrix (a tied
// output head included) is fp16, each weight the CPU's dequantized value rounded once.
//
// Two paths per step:
//   - decode-only steps (every sequence feeds one token and wants its logits, at most the
//     largest batch-size bucket of sequences, block tables within max_blocks_per_seq) run one
//     fixed launch sequence per bucket (1, 2, 4, ..., 256): the step is padded to the bucket with
//     dummy rows (token -1, position -1, KV slot -1: they gather a zero embedding, write no K/V,
//     read no K/V, and their outputs are ignored), its metadata (tokens, positions, KV slots,
//     block tables, sampling parameters) copied into fixed device buffers, then the sequence is
//     replayed from a CUDA graph captured at load (cuda_graphs), or launched as is (eager). Both
//     launch the very same kernels on the very same buffers, so they give identical results.
//   - any other step (prefill chunks, mixed steps) runs the ragged launch sequence eagerly.
// Rows with row_sampling::on_backend are sampled on the device (kernels/cuda/sampling) and only
// their token ids come back; the other rows' logits are copied back.
//
// Results depend on the batch shape (cuBLAS picks kernels per shape), unlike the CPU engine's
// batching-invariant kernels: a request can produce different tokens alone and batched.
//
// This header carries no CUDA types (pimpl), so host code can include it without nvcc. Built
// only where nvcc exists (SY_HAVE_CUDA); every CUDA/cuBLAS call is checked and fails with an
// exception naming the call (cuda_check.cuh). Owned by one thread at a time (the engine's); every
// call makes the configured device current on the calling thread first.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/model/forward_backend.hpp"
#include "worker/model/llama_model.hpp"

namespace sy {

struct cuda_forward_config {
  int device = 0;
  int32_t block_size = 16;
  int32_t n_kv_blocks = 0;  // 0: kv_memory_fraction of the device memory free after everything else
  double kv_memory_fraction = 0.5;
  int32_t max_tokens_per_step = 4096;  // activation buffers are sized for this many tokens
  int32_t max_seqs_per_step = 256;     // logits rows one step may ask for (the engine: one per sequence)
  // Block-table width of the decode path (positions up to max_blocks_per_seq * block_size);
  // 0: the model's training context. Longer sequences take the eager ragged path.
  int32_t max_blocks_per_seq = 0;
  bool cuda_graphs = true;  // replay decode steps from graphs captured at load (else launch them)
};

// What ran, since construction.
struct cuda_forward_counters {
  uint64_t ragged_steps = 0;    // steps through the ragged (prefill / mixed) path
  uint64_t decode_steps = 0;    // steps through a batch-size bucket
  uint64_t graph_replays = 0;   // decode steps replayed from a captured graph
  uint64_t padding_rows = 0;    // dummy rows added to reach a bucket
  uint64_t device_sampled = 0;  // rows sampled on the device
};

class cuda_forward final : public forward_backend {
 public:
  // Uploads and dequantizes the weights, allocates the buffers and the KV arena, captures the
  // decode graphs. Throws std::runtime_error with a message fit for a user (no device, no such
  // device index, a device older than sm_80, out of memory with the numbers, a CUDA error naming
  // the call). A failed graph capture is not fatal: decode steps then run eagerly and describe()
  // says why.
  cuda_forward(const llama_model& model, cuda_forward_config cfg);
  ~cuda_forward() override;
  cuda_forward(const cuda_forward&) = delete;
  cuda_forward& operator=(const cuda_forward&) = delete;

  void run(std::span<const batch_seq> batch, std::span<const row_sampling> sampling, step_output& out) override;
  // Every logits row back to the host, in batch order (like cpu_forward::run).
  void run(std::span<const batch_seq> batch, std::vector<float>& logits);

  bool samples() const override { return true; }
  int32_t n_kv_blocks() const override;
  // No sliding-window release on the device: every layer keeps every block (docs/worker.md,
  // "Sliding-window layers in the KV cache").
  int32_t n_window_blocks() const override { return 0; }
  int32_t block_size() const override;
  size_t kv_bytes() const override;  // device bytes held by the KV arena
  size_t weight_read_bytes() const override;
  size_t kv_bytes_per_token() const override;
  std::string describe() const override;

  size_t weight_bytes() const;  // device bytes held by the weights
  bool graphs_active() const;   // decode steps replay captured graphs
  cuda_forward_counters counters() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace sy
