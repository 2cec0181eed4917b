#include "kernels/cuda/sampling.cuh"

#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"

// One block per row. A greedy row is one pass: a block argmax. A sampled row:
//   1. block argmax -> max logit (and the answer for the degenerate rows);
//   2. one pass writes e_i = exp((l_i - max) / T) into the workspace (-1 for NaN / -inf: not a
//      candidate) and counts the candidates;
//   3. each of top-k, top-p and the draw is one "prefix select" over the candidates in descending
//      order of the 56-bit key (bits of e_i << 24 | (2^24 - 1 - index)): it finds the element at
//      which a running count (top-k) or running mass (top-p, draw) first reaches a target, by
//      radix select on 8-bit digits (at most 7 passes; it stops as soon as the chosen digit bucket
//      holds one element). The candidate set is always a prefix of that order, so it is carried
//      between steps as one number: the key of its last element (`lo_key`). min-p keeps
//      e_i >= min_p, also a prefix, applied to the draw only (the CPU applies it after top-p).
//   4. Once the set has at most k_cand_cap elements it is copied into shared memory and the
//      remaining selects read that instead of the whole row.
// Histograms use integer shared-memory atomics only, so every count and sum is exact and the
// result does not depend on thread scheduling.

namespace sy::cuda {
namespace {

using u64 = unsigned long long;

constexpr int k_threads = 512;
constexpr int k_warps = k_threads / 32;
constexpr int k_cand_cap = 1024;
constexpr int k_index_bits = 24;
constexpr uint32_t k_index_mask = (1u << k_index_bits) - 1;
constexpr float k_mass_scale = 1099511627776.f;  // 2^40: fixed-point unit of e_i (e_i <= 1)
constexpr unsigned k_full = 0xffffffffu;

static_assert(int64_t{1} << k_index_bits == k_sampling_max_vocab, "index bits of the key");
// Mass sums: at most 2^24 elements of at most 2^40 each fit in 64 bits.
static_assert(k_index_bits + 40 <= 64, "fixed-point mass must not overflow");

// ---- counter-based draw ------------------------------------------------------------------------

// The splitmix64 finaliser: a bijection on 64 bits with good avalanche.
__device__ __forceinline__ u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 64 uniform bits for (seed, step). For a fixed seed, distinct steps give distinct inputs to the
// outer bijection (the odd multiplier is invertible mod 2^64), hence distinct outputs.
__device__ __forceinline__ u64 draw_bits(u64 seed, u64 step) {
  return mix64(mix64(seed ^ 0x6a09e667f3bcc909ull) + step * 0x9e3779b97f4a7c15ull);
}

// ---- keys and masses -----------------------------------------------------------------------------

// Descending order of candidates: larger e first, then lower index. e in [0, 1], so its bits are
// at most 0x3f800000 and the key is below 2^54; every key is distinct.
__device__ __forceinline__ u64 candidate_key(float e, uint32_t index) {
  return (static_cast<u64>(__float_as_uint(e)) << k_index_bits) | (k_index_mask - index);
}
__device__ __forceinline__ uint32_t key_index(u64 key) {
  return k_index_mask - static_cast<uint32_t>(key & k_index_mask);
}
__device__ __forceinline__ u64 mass_of(float e) { return __float2ull_rz(e * k_mass_scale); }

// ---- argmax ----------------------------------------------------------------------------------------

// Whether (av, ai) wins over (bv, bi) in sy::argmax's order: any number beats NaN; among numbers
// the larger, then the lower index; among NaNs the higher index (an all-NaN row gives the last
// index, as the CPU loop does). A total order, so a tree reduction in any shape gives the same
// winner. The identity is (NaN, -1).
__device__ __forceinline__ bool beats(float av, int ai, float bv, int bi) {
  const bool an = isnan(av), bn = isnan(bv);
  if (an != bn) return bn;
  if (an) return ai > bi;
  if (av != bv) return av > bv;
  return ai < bi;
}

// The warp's winner of (bv, bi) by `beats`, in every lane.
__device__ __forceinline__ void warp_argmax(float& bv, int& bi) {
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(k_full, bv, off);
    const int oi = __shfl_xor_sync(k_full, bi, off);
    if (beats(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
}

// ---- shared state ----------------------------------------------------------------------------------

enum class select_rule { top_k, top_p, draw };

// The state of one prefix select, written by warp 0 between barriers.
struct select_state {
  u64 prefix;       // digits chosen so far: a key is in the current bucket iff key >> (shift + 8) == prefix
  u64 count_above;  // elements of the set whose key is above the current bucket
  u64 mass_above;   // their mass
  u64 target;       // running count or mass to reach
  u64 key;          // result: the key of the element where the target is reached
  int shift;        // bit position of the digit the next pass histograms
  int done;         // the result is known
  int whole;        // the target covers the whole set: nothing selected, the set is unchanged
};

struct block_shared {
  uint32_t hist_count[256];
  u64 hist_mass[256];
  u64 hist_key[256];  // the largest key in each bucket (its only key when the count is 1)
  select_state sel;
  float cand_e[k_cand_cap];  // the compacted set (order irrelevant: selects work on keys)
  uint32_t cand_index[k_cand_cap];
  uint32_t n_cand;
  float red_v[k_warps];
  int red_i[k_warps];
  float arg_v;
  int arg_i;
  int n_valid;
};

// Candidates straight from the workspace row: position == token index.
struct row_source {
  const float* e;
  uint32_t n;
  __device__ float e_at(uint32_t i) const { return e[i]; }
  __device__ uint32_t index_at(uint32_t i) const { return i; }
};

// The compacted set in shared memory.
struct cand_source {
  const float* e;
  const uint32_t* index;
  uint32_t n;
  __device__ float e_at(uint32_t i) const { return e[i]; }
  __device__ uint32_t index_at(uint32_t i) const { return index[i]; }
};

struct select_result {
  bool whole;  // set unchanged
  u64 key;     // the last element of the selected prefix
  u64 count;   // elements in the selected prefix
};

// ---- block primitives ------------------------------------------------------------------------------

// sy::argmax of row[0, n): every thread gets the winner; index -1 when n == 0.
__device__ void block_argmax(const float* __restrict__ row, int64_t n, block_shared& sh, float& v_out, int& i_out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float bv = __int_as_float(0x7fc00000);
  int bi = -1;
  for (int64_t i = threadIdx.x; i < n; i += k_threads) {
    const float v = row[i];
    if (beats(v, static_cast<int>(i), bv, bi)) {
      bv = v;
      bi = static_cast<int>(i);
    }
  }
  warp_argmax(bv, bi);
  if (lane == 0) {
    sh.red_v[warp] = bv;
    sh.red_i[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    bv = lane < k_warps ? sh.red_v[lane] : __int_as_float(0x7fc00000);
    bi = lane < k_warps ? sh.red_i[lane] : -1;
    warp_argmax(bv, bi);
    if (lane == 0) {
      sh.arg_v = bv;
      sh.arg_i = bi;
    }
  }
  __syncthreads();
  v_out = sh.arg_v;
  i_out = sh.arg_i;
}

// Sum of `v` over the block, every thread gets it (reuses sh.red_i).
__device__ int block_count(int v, block_shared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(k_full, v, off);
  __syncthreads();  // earlier readers of red_i are done
  if (lane == 0) sh.red_i[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int t = lane < k_warps ? sh.red_i[lane] : 0;
    for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(k_full, t, off);
    if (lane == 0) sh.n_valid = t;
  }
  __syncthreads();
  return sh.n_valid;
}

// Copies the set (candidates with key >= lo_key) of the workspace row into shared memory. The
// caller knows the set has at most k_cand_cap elements.
__device__ void compact_set(const row_source& src, u64 lo_key, block_shared& sh) {
  __syncthreads();
  if (threadIdx.x == 0) sh.n_cand = 0;
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < src.n; i += k_threads) {
    const float e = src.e_at(i);
    if (e >= 0.f && candidate_key(e, i) >= lo_key) {
      const uint32_t slot = atomicAdd(&sh.n_cand, 1u);
      if (slot < k_cand_cap) {
        sh.cand_e[slot] = e;
        sh.cand_index[slot] = i;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && sh.n_cand > k_cand_cap) sh.n_cand = k_cand_cap;  // unreachable; keeps reads in bounds
  __syncthreads();
}

// The target of a select once the totals of the set are known (pass 0); 0 means "whole set".
__device__ __forceinline__ u64 select_target(select_rule rule, u64 total_count, u64 total_mass, u64 k, float top_p,
                                             u64 bits) {
  switch (rule) {
    case select_rule::top_k:
      return k >= total_count ? 0 : k;
    case select_rule::top_p: {
      if (total_mass == 0) return 0;
      double t = ceil(static_cast<double>(top_p) * static_cast<double>(total_mass));
      if (!(t >= 1.0)) t = 1.0;  // also top_p <= 0: keep the top element
      if (t >= static_cast<double>(total_mass)) return total_mass;
      return static_cast<u64>(t);
    }
    case select_rule::draw:
      // r uniform in [0, total_mass); the drawn element is where the running mass first exceeds r.
      return total_mass == 0 ? 0 : __umul64hi(bits, total_mass) + 1;
  }
  return 0;
}

// Warp 0, after a histogram pass: picks the digit bucket holding the element where the running
// count (top-k) or mass (top-p, draw) over the descending order first reaches the target.
__device__ void select_decide(select_rule rule, bool first_pass, u64 k, float top_p, u64 bits, block_shared& sh) {
  const int lane = threadIdx.x % 32;
  select_state& st = sh.sel;
  // Lane l holds buckets 255 - 8l down to 248 - 8l, so lanes in order walk the buckets downwards.
  u64 vc[8], vm[8];
  u64 sum_c = 0, sum_m = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int b = 255 - 8 * lane - j;
    vc[j] = sh.hist_count[b];
    vm[j] = sh.hist_mass[b];
    sum_c += vc[j];
    sum_m += vm[j];
  }
  u64 inc_c = sum_c, inc_m = sum_m;  // inclusive scans over lanes
  for (int off = 1; off < 32; off <<= 1) {
    const u64 tc = __shfl_up_sync(k_full, inc_c, off);
    const u64 tm = __shfl_up_sync(k_full, inc_m, off);
    if (lane >= off) {
      inc_c += tc;
      inc_m += tm;
    }
  }
  u64 target = st.target;
  if (first_pass) {
    const u64 total_c = __shfl_sync(k_full, inc_c, 31), total_m = __shfl_sync(k_full, inc_m, 31);
    target = select_target(rule, total_c, total_m, k, top_p, bits);
    if (lane == 0) {
      st.target = target;
      st.whole = target == 0;
    }
    if (target == 0) return;
  }
  const bool by_mass = rule != select_rule::top_k;
  const u64 above = by_mass ? st.mass_above : st.count_above;
  const u64 other_above = by_mass ? st.count_above : st.mass_above;
  const u64 inc = by_mass ? inc_m : inc_c, sum = by_mass ? sum_m : sum_c;
  const u64 inc_o = by_mass ? inc_c : inc_m, sum_o = by_mass ? sum_c : sum_m;
  const unsigned hit = __ballot_sync(k_full, above + inc >= target);
  const int at = hit ? __ffs(hit) - 1 : 31;  // hit != 0 whenever the target lies in this bucket
  if (lane != at) return;
  u64 acc = above + inc - sum, acc_o = other_above + inc_o - sum_o;
  int digit = 248 - 8 * at;  // fallback: the lane's last bucket
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const u64 v = by_mass ? vm[j] : vc[j], o = by_mass ? vc[j] : vm[j];
    if (acc + v >= target) {
      digit = 255 - 8 * at - j;
      break;
    }
    acc += v;
    acc_o += o;
  }
  st.count_above = by_mass ? acc_o : acc;
  st.mass_above = by_mass ? acc : acc_o;
  st.prefix = (st.prefix << 8) | static_cast<u64>(digit);
  if (sh.hist_count[digit] <= 1 || st.shift == 0) {
    st.done = 1;
    st.key = sh.hist_key[digit];
  }
  st.shift -= 8;
}

// Over the set {candidates of `src` with e >= e_floor and key >= lo_key} in descending key order,
// finds the element where the running count (top_k: target k) or mass (top_p: ceil(top_p * total);
// draw: uniform from `bits`) first reaches the target. Called by the whole block.
template <class Source>
__device__ select_result select_prefix(const Source& src, float e_floor, u64 lo_key, select_rule rule, u64 k,
                                       float top_p, u64 bits, block_shared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  select_state& st = sh.sel;
  __syncthreads();  // readers of the previous select's state are done
  if (threadIdx.x == 0) {
    st.prefix = 0;
    st.count_above = 0;
    st.mass_above = 0;
    st.target = 0;
    st.key = 0;
    st.shift = 48;  // digits at bits 48, 40, ..., 0 of a key below 2^56
    st.done = 0;
    st.whole = 0;
  }
  for (int pass = 0;; ++pass) {
    for (int b = threadIdx.x; b < 256; b += k_threads) {
      sh.hist_count[b] = 0;
      sh.hist_mass[b] = 0;
      sh.hist_key[b] = 0;
    }
    __syncthreads();
    const int shift = st.shift;
    const u64 prefix = st.prefix;
    // `base` is warp-uniform, so the whole warp reaches __match_any_sync together.
    for (uint32_t base = static_cast<uint32_t>(warp) * 32; base < src.n; base += k_threads) {
      const uint32_t i = base + lane;
      uint32_t digit = 256;  // 256: not in this bucket
      u64 key = 0;
      float e = 0.f;
      if (i < src.n) {
        e = src.e_at(i);
        if (e >= e_floor) {  // also drops the -1 of a non-candidate (e_floor >= 0)
          key = candidate_key(e, src.index_at(i));
          if (key >= lo_key && (key >> (shift + 8)) == prefix) digit = static_cast<uint32_t>(key >> shift) & 255u;
        }
      }
      // Lanes with the same digit add their count once: the first digit pass sees most of the row
      // in a handful of buckets (e.g. every e that underflowed to 0).
      const unsigned same = __match_any_sync(k_full, digit);
      if (digit < 256) {
        if (lane == __ffs(same) - 1) {
          atomicAdd(&sh.hist_count[digit], static_cast<uint32_t>(__popc(same)));
          atomicMax(&sh.hist_key[digit], key);
        }
        const u64 w = mass_of(e);
        if (w != 0) atomicAdd(&sh.hist_mass[digit], w);
      }
    }
    __syncthreads();
    if (warp == 0) select_decide(rule, pass == 0, k, top_p, bits, sh);
    __syncthreads();
    if (st.done || st.whole) break;
  }
  select_result r;
  r.whole = st.whole != 0;
  r.key = st.key;
  r.count = st.count_above + 1;
  return r;
}

// Runs a select over the compacted set when there is one, else over the workspace row.
__device__ select_result select_in_set(bool compacted, const row_source& row, float e_floor, u64 lo_key,
                                       select_rule rule, u64 k, float top_p, u64 bits, block_shared& sh) {
  if (compacted) {
    const cand_source cand{sh.cand_e, sh.cand_index, sh.n_cand};
    return select_prefix(cand, e_floor, lo_key, rule, k, top_p, bits, sh);
  }
  return select_prefix(row, e_floor, lo_key, rule, k, top_p, bits, sh);
}

// ---- the kernel --------------------------------------------------------------------------------------

__global__ void __launch_bounds__(k_threads)
    sample_tokens_kernel(const float* __restrict__ logits, int64_t n_vocab, const device_sampling* __restrict__ params,
                         int32_t* __restrict__ out_ids, float* __restrict__ probs) {
  __shared__ block_shared sh;
  const int64_t row = blockIdx.x;
  const float* lrow = logits + row * n_vocab;

  float mx;
  int best;
  block_argmax(lrow, n_vocab, sh, mx, best);
  if (best < 0) best = 0;  // empty row
  const device_sampling p = params[row];
  // Greedy, and the rows with one sensible answer (no finite maximum: all NaN/-inf, or +inf).
  if (!(p.temperature > 0.f) || !isfinite(mx)) {
    if (threadIdx.x == 0) out_ids[row] = best;
    return;
  }

  // e_i relative to the maximum (which gets exactly 1); -1 marks a non-candidate.
  float* erow = probs + row * n_vocab;
  int n_valid = 0;
  for (int64_t i = threadIdx.x; i < n_vocab; i += k_threads) {
    const float l = lrow[i];
    float e = -1.f;
    if (l > -INFINITY) {  // false for NaN too
      e = expf((l - mx) / p.temperature);
      ++n_valid;
    }
    erow[i] = e;
  }
  n_valid = block_count(n_valid, sh);  // its barriers also publish erow to the block

  const row_source src{erow, static_cast<uint32_t>(n_vocab)};
  u64 lo_key = 0;  // the set: candidates with key >= lo_key (0: all)
  u64 set_count = static_cast<u64>(n_valid);
  bool compacted = false;
  auto maybe_compact = [&] {
    if (!compacted && set_count <= static_cast<u64>(k_cand_cap)) {
      compact_set(src, lo_key, sh);
      compacted = true;
    }
  };
  maybe_compact();

  if (p.top_k > 0 && static_cast<u64>(p.top_k) < set_count) {
    const select_result r =
        select_in_set(compacted, src, 0.f, lo_key, select_rule::top_k, static_cast<u64>(p.top_k), 1.f, 0, sh);
    if (!r.whole) {
      lo_key = r.key;
      set_count = r.count;
      maybe_compact();
    }
  }
  if (p.top_p < 1.f) {  // NaN: off
    const select_result r = select_in_set(compacted, src, 0.f, lo_key, select_rule::top_p, 0, p.top_p, 0, sh);
    if (!r.whole) {
      lo_key = r.key;
      set_count = r.count;
      maybe_compact();
    }
  }
  // min-p relative to the maximum, whose e is 1: keep e >= min_p (capped at 1 so the maximum stays).
  const float e_floor = p.min_p > 0.f ? fminf(p.min_p, 1.f) : 0.f;
  const select_result r =
      select_in_set(compacted, src, e_floor, lo_key, select_rule::draw, 0, 1.f, draw_bits(p.seed, p.step), sh);
  if (threadIdx.x == 0) {
    const uint32_t id = key_index(r.key);
    out_ids[row] = !r.whole && id < static_cast<uint64_t>(n_vocab) ? static_cast<int32_t>(id) : best;
  }
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

size_t sample_tokens_workspace(int64_t n_rows, int64_t n_vocab) {
  if (n_rows <= 0 || n_vocab <= 0) return 0;
  return round_up(static_cast<size_t>(n_rows) * static_cast<size_t>(n_vocab) * sizeof(float), 256);
}

void sample_tokens(const float* logits, int64_t n_rows, int64_t n_vocab, const device_sampling* params,
                   int32_t* out_ids, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (n_rows <= 0) return;
  if (n_vocab < 0 || n_vocab > k_sampling_max_vocab)
    throw std::invalid_argument("sample_tokens: n_vocab " + std::to_string(n_vocab) + " outside [0, " +
                                std::to_string(k_sampling_max_vocab) + "]");
  if (n_rows > INT_MAX) throw std::invalid_argument("sample_tokens: " + std::to_string(n_rows) + " rows");
  const size_t need = sample_tokens_workspace(n_rows, n_vocab);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr))
    throw std::invalid_argument("sample_tokens: workspace of " + std::to_string(workspace_bytes) + " bytes, need " +
                                std::to_string(need));
  sample_tokens_kernel<<<static_cast<unsigned>(n_rows), k_threads, 0, stream>>>(logits, n_vocab, params, out_ids,
                                                                                static_cast<float*>(workspace));
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace sy::cuda
