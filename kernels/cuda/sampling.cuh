// Logits -> token ids on the device, so that only the ids come back to the host
// (docs/cuda-backend.md).
// CPU reference: worker/engine/sampler (sy::argmax and sy::sampler). The repetition penalty is not part
// of this op: it is applied to the logits before, where the history lives.
//
// Per row, in the CPU sampler's order:
//   - temperature <= 0 (or NaN), or a row whose maximum is +inf / has no finite logit: argmax,
//     exactly sy::argmax (ties -> lowest index, NaN never wins unless the row is all NaN, in which
//     case the last index, as the CPU loop gives).
//   - else: probabilities e_i = exp((l_i - max) / temperature) in fp32 over the finite logits
//     (NaN and -inf are dropped), then top-k, then top-p over the renormalised top-k set (the
//     smallest prefix of the descending order whose mass >= top_p), then min-p (keep
//     p_i >= min_p * p_max), then one draw proportional to e_i over what is left.
//     The descending order is by probability, ties by lower index (as the CPU sorts for top-p).
//     Any top_k works (there is no cap); values outside [1, n_valid) mean off.
//   - Masses are summed as 64-bit fixed point (e_i * 2^40, rounded toward zero), so every sum is
//     exact and independent of thread order: a token whose probability relative to the maximum is
//     below 2^-40 (~1e-12) is never drawn.
//   - The draw uses one 64-bit value from a counter-based hash of (seed, step): the same logits,
//     parameters, seed and step always give the same token, on any launch shape or batch. Seeded
//     sampling is reproducible per backend: it does not reproduce the CPU sampler's mt19937 draws.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/sampling_draw.hpp"

namespace sy::cuda {

// Per-row sampling parameters, one per row, in device memory (uploaded with the step): the
// engine's sampling_draw, declared once in common/ (plain data, no host-only members).
using device_sampling = sy::sampling_draw;

// The largest vocabulary the op accepts (token indices are packed into 24 bits of a sort key).
constexpr int64_t k_sampling_max_vocab = int64_t{1} << 24;

// Bytes of device workspace sample_tokens needs for this shape (0 when there is nothing to do):
// one fp32 probability per logit.
size_t sample_tokens_workspace(int64_t n_rows, int64_t n_vocab);

// out_ids[r] = the token sampled from logits[r][0, n_vocab) with params[r], for r < n_rows.
// `logits` [n_rows][n_vocab] fp32, `params` [n_rows], `out_ids` [n_rows] and the workspace are
// device memory; the workspace must hold sample_tokens_workspace(n_rows, n_vocab) bytes and is
// scratch owned by the call until it completes on `stream`. Asynchronous, no allocation, so it
// can be captured in a CUDA graph. Throws std::invalid_argument for a vocabulary over
// k_sampling_max_vocab or a workspace too small, and std::runtime_error if the launch fails.
void sample_tokens(const float* logits, int64_t n_rows, int64_t n_vocab, const device_sampling* params,
                   int32_t* out_ids, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace sy::cuda
