// The Llama forward pass on a CUDA device (issue 6): weights dequantized once at load to fp16
// in device memory, every linear layer one cuBLAS GEMM (fp16 inputs, fp32 accumulation, tensor
// cores) over the whole ragged batch of the step, own kernels for the rest (kernels/cuda/), and
// the KV cache in device memory as fp16 blocks addressed by the same block tables the CPU
// engine uses. Same contract as cpu_forward::run, with the KV arena on the device.
//
// This header carries no CUDA types (pimpl), so host code can include it without nvcc. Built
// only where nvcc exists (SY_HAVE_CUDA); every CUDA/cuBLAS call is checked and fails with an
// exception naming the call (cuda_check.cuh); running out of device memory at load names the
// numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "worker/cpu_forward.hpp"
#include "worker/llama_model.hpp"

namespace sy {

struct cuda_forward_config {
  int device = 0;
  int32_t block_size = 16;
  int32_t n_kv_blocks = 0;  // 0: kv_memory_fraction of the free device memory after weights
  double kv_memory_fraction = 0.5;
  int32_t max_tokens_per_step = 4096;  // activation buffers are sized for this many tokens
  int32_t max_seqs_per_step = 256;
};

class cuda_forward {
 public:
  // Uploads and dequantizes the weights, allocates the KV arena. Throws std::runtime_error (no
  // device, out of memory with the numbers, a CUDA error naming the call).
  cuda_forward(const llama_model& model, cuda_forward_config cfg);
  ~cuda_forward();
  cuda_forward(const cuda_forward&) = delete;
  cuda_forward& operator=(const cuda_forward&) = delete;

  // Runs the batch, writes K/V of the new tokens into the device arena, and fills `logits` with
  // one row of n_vocab per requested token, in batch order (like cpu_forward::run).
  void run(std::span<const batch_seq> batch, std::vector<float>& logits);

  int32_t n_kv_blocks() const;
  int32_t block_size() const;
  size_t weight_bytes() const;  // device bytes held by the weights
  size_t kv_bytes() const;      // device bytes held by the KV arena

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace sy
