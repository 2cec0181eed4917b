// How a backend's sampler draws the token of one logits row (kernels/cuda/sampling.cuh, where it
// is named device_sampling): greedy at temperature 0, else top-k -> top-p -> min-p -> one draw
// from a counter-based hash of (seed, step). Plain data, uploaded to device memory as it is, so
// this header includes nothing a .cu file cannot. The engine derives it from a request's
// sampling_params with draw_of() (common/sampling_params.hpp), the one place the fields are copied.
#pragma once

#include <cstdint>

namespace sy {

struct sampling_draw {
  float temperature = 0.f;  // 0: greedy
  int32_t top_k = 0;        // 0: off
  float top_p = 1.f;        // 1: off
  float min_p = 0.f;        // 0: off
  uint64_t seed = 0;        // per request; combined with `step` for a counter-based draw
  uint64_t step = 0;        // tokens sampled so far for this request
};

}  // namespace sy
