// Paged attention on the device, for decode tokens and prefill-chunk tokens alike. CPU reference:
// cpu::attend_head / cpu::attend_group over an f16 kv_layer_view (kernels/cpu/attention.hpp), as
// worker/model/cpu_forward.cpp calls it.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sy::cuda {

// One query per token, causal: the token at position pos attends keys [0, pos] of its sequence,
// so a prefill chunk is its tokens at consecutive positions (their K/V already written to the
// cache) and a decode token is one more. Query head h reads kv head h / (n_head / n_head_kv).
//
// q:   [n_tok][n_head][head_dim] fp32 (after RoPE).
// k_cache, v_cache: this layer's cache, [n_blocks][block_size][kv_dim] fp16 with
//      kv_dim = n_head_kv * head_dim; 16-byte aligned (cudaMalloc memory is).
// block_tables: [n_seq][max_blocks_per_seq] int32, block_tables[seq][i] = the physical block
//      holding the sequence's positions [i * block_size, (i + 1) * block_size).
// seq_of_token, pos_of_token: [n_tok] int32. A negative seq or pos marks a padding token (a CUDA graph
//      bucket's spare row): its output rows are written as zeros and nothing is read for it.
//      Otherwise pos < max_blocks_per_seq * block_size and the blocks exist (not checked on the device).
// out: [n_tok][n_head][head_dim] fp16, out = softmax(scale * q . K) V per head.
// head_dim must be 64 or 128; n_head a multiple of n_head_kv. All pointers in device memory;
// asynchronous on `stream`. Misuse throws std::invalid_argument; a launch failure
// std::runtime_error (cuda_check.cuh).
void paged_attention(const float* q, const __half* k_cache, const __half* v_cache, const int32_t* block_tables,
                     int64_t max_blocks_per_seq, const int32_t* seq_of_token, const int32_t* pos_of_token,
                     int64_t n_tok, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t block_size,
                     float scale, __half* out, cudaStream_t stream);

}  // namespace sy::cuda
