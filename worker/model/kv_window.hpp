// The sliding-window KV release (docs/worker.md, "Sliding-window layers in the KV cache"): with
// it, a model's windowed layers keep their K/V in a second block pool and arena, and a sequence's
// window table holds only the blocks a future query of it can still see; blocks wholly behind
// the window go back to the window pool as it moves. Global layers keep the whole sequence in
// the main pool, as every layer does without the release.
//
// This header holds the geometry both the scheduler and the backends share: which blocks are
// live, how many a sequence can hold at most, and how a KV budget splits between the two pools.
#pragma once

#include <algorithm>
#include <cstdint>

namespace sy {

class llama_model;

// A window table's entry for a block already released (behind the window).
inline constexpr int32_t k_released_block = -1;

// The first block a query at `pos` or later can see on a layer with window `window` (keys
// [pos - window + 1, pos]): blocks before it are dead for a sequence whose next token is at pos.
inline int64_t first_live_block(int64_t pos, int64_t window, int64_t block_size) {
  return std::max<int64_t>(0, pos - window + 1) / block_size;
}

// The most window blocks one sequence holds while a step feeds it `n_tokens` tokens from any
// position: the blocks of keys [pos - window + 1, pos + n_tokens).
inline int64_t window_blocks_per_seq(int64_t window, int64_t block_size, int64_t n_tokens) {
  return (window - 1 + n_tokens + block_size - 1) / block_size + 1;
}

// How a KV budget of `n_full_blocks` blocks of every layer splits when the release is on.
struct kv_window_split {
  int64_t window = 0;           // 0: no release (no windowed layer, or the release is off)
  int32_t n_layer_global = 0;   // layers in the main pool
  int32_t n_layer_window = 0;   // layers in the window pool
  int32_t n_global_blocks = 0;  // main pool (all layers when window == 0)
  int32_t n_window_blocks = 0;  // window pool (0 when window == 0)
};

// The same bytes as n_full_blocks blocks of every layer, split so that as many sequences of
// `max_context` tokens fit in the main pool as in the window pool (the window pool also holds one
// step's chunk of `max_step_tokens` more): sized for the longest sequences the worker serves.
// `release` false, or a model without windowed (or without global) layers: no split.
kv_window_split split_kv_budget(const llama_model& model, int32_t n_full_blocks, int32_t block_size,
                                int64_t max_context, int32_t max_step_tokens, bool release);
// The same for a model of n_layer_global + n_layer_window layers (no split when either is 0).
kv_window_split split_kv_budget(int32_t n_layer_global, int32_t n_layer_window, int64_t window, int32_t n_full_blocks,
                                int32_t block_size, int64_t max_context, int32_t max_step_tokens);

}  // namespace sy
