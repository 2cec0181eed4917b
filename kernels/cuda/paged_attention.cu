// Paged attention: one thread block per (token, kv head), serving the query heads of that kv
// head's group together, so each K/V row is read from device memory once per group.
//
// Algorithm (flash-attention style, one pass over the keys):
//   - The block's query heads are loaded once into shared memory as fp32, pre-multiplied by
//     scale * log2(e) so that scores live in the log2 domain and exp2f is the exponential.
//   - Keys [0, pos] are walked in tiles of kTile rows. Each tile's K and V rows (head_dim fp16
//     each, found through the block table) are copied into shared memory with cp.async, two
//     stages deep: tile i + 1 is in flight while tile i is computed.
//   - Per tile: scores s[g][t] = q_g . k_t (lanes_per_dot lanes per dot product, combined by
//     shuffles); then one warp per query head takes the tile's maximum, the new running max
//     m' = max(m, tile max), p = exp2(s - m'), alpha = exp2(m - m'), l = l * alpha + sum(p);
//     then every thread rescales its fp32 accumulator by alpha and adds sum_t p_t v_t for its
//     two output elements over every key_splits-th key of the tile.
//   - At the end the key_splits partial accumulators of an output pair are summed through shared
//     memory and divided by l; the result is rounded to fp16.
// Everything after the fp16 loads is fp32. Limits: head_dim 64 or 128; a group larger than
// 1024 / head_dim query heads is split over several blocks (each re-reads K/V); shared memory
// stays under the 48 KB a block gets without opting in. One block walks all of a token's keys,
// so a batch with few (token, kv head) pairs and long contexts leaves most SMs idle (splitting
// the keys over blocks, "flash decoding", would be the next step there).
#include "kernels/cuda/paged_attention.cuh"

#include <cuda_pipeline.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"

namespace sy::cuda {
namespace {

constexpr int k_max_threads = 512;     // a block's threads: heads_per_block * head_dim / 2 * key_splits
constexpr int k_min_threads = 128;     // fewer output pairs than this: split the keys in the PV sum
constexpr int k_max_smem = 48 * 1024;  // the default dynamic shared-memory limit of a block
constexpr float k_log2e = 1.4426950408889634f;

// Keys per tile: 64 rows of 128 bytes (head_dim 64) or 32 rows of 256 bytes (head_dim 128): 8 KB
// of K and 8 KB of V per stage, two stages.
__host__ __device__ constexpr int tile_keys(int head_dim) { return head_dim == 64 ? 64 : 32; }

// How one launch lays out its blocks; computed on the host, read by every block.
struct launch_config {
  int heads_per_block = 0;  // query heads per block (the whole group unless it is too large)
  int n_sub = 0;            // blocks per kv head: ceil(group / heads_per_block)
  int key_splits = 0;       // threads per output pair in the PV sum, each over every key_splits-th key
  int lanes_per_dot = 0;    // lanes per score dot product (a power of two <= 8)
  int row_stride = 0;       // halves per staged K/V row: head_dim + 8 * (lanes_per_dot % 8)
  int threads = 0;          // heads_per_block * head_dim / 2 * key_splits
  int kv_bytes = 0;         // two stages of K and V tiles, at the start of shared memory
  int smem_bytes = 0;       // kv_bytes + q, scores, running max / sum / rescale factor
};

// Bank conflicts: a 16-byte shared load is served 8 threads at a time. Score lane l of a dot
// reads 16-byte chunks l, l + L, ... of its key row; 8 consecutive threads are 8 / L keys times L
// lanes. With a row stride of (head_dim / 8 + L % 8) chunks, chunk index mod 8 is L * t + l for key
// t: all distinct, so each 8-thread phase touches every bank once.
launch_config make_config(int head_dim, int group) {
  launch_config c;
  const int chunks = head_dim / 8, tile = tile_keys(head_dim);
  const int max_heads = 2 * k_max_threads / head_dim;
  c.n_sub = (group + max_heads - 1) / max_heads;
  c.heads_per_block = (group + c.n_sub - 1) / c.n_sub;
  const int n_pairs = c.heads_per_block * head_dim / 2;  // a multiple of 32
  c.key_splits = std::max(1, (k_min_threads + n_pairs - 1) / n_pairs);
  c.threads = n_pairs * c.key_splits;
  c.lanes_per_dot = 1;
  while (c.lanes_per_dot * 2 <= std::min(chunks, 8) && c.heads_per_block * tile * c.lanes_per_dot * 2 <= c.threads)
    c.lanes_per_dot *= 2;
  c.row_stride = head_dim + 8 * (c.lanes_per_dot % 8);
  c.kv_bytes = 2 * 2 * tile * c.row_stride * static_cast<int>(sizeof(__half));
  c.smem_bytes = c.kv_bytes + (c.heads_per_block * head_dim + c.heads_per_block * tile + 3 * c.heads_per_block) *
                                  static_cast<int>(sizeof(float));
  return c;
}

struct attn_params {
  const float* q;
  const __half* k_cache;
  const __half* v_cache;
  const int32_t* block_tables;
  const int32_t* seq_of_token;
  const int32_t* pos_of_token;
  __half* out;
  int64_t max_blocks_per_seq;
  int64_t kv_dim;
  int n_head;
  int group;  // n_head / n_head_kv
  int block_size;
  float q_scale;  // scale * log2(e)
  launch_config cfg;
};

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// acc + q[0, 8) . k[0, 8): q fp32 (32-byte aligned), k fp16 (16-byte aligned), both in shared memory.
__device__ __forceinline__ float dot8(const float* q, const __half* k, float acc) {
  const uint4 raw = *reinterpret_cast<const uint4*>(k);
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
  const float4 qa = *reinterpret_cast<const float4*>(q);
  const float4 qb = *reinterpret_cast<const float4*>(q + 4);
  float2 f = __half22float2(h[0]);
  acc = fmaf(qa.x, f.x, acc);
  acc = fmaf(qa.y, f.y, acc);
  f = __half22float2(h[1]);
  acc = fmaf(qa.z, f.x, acc);
  acc = fmaf(qa.w, f.y, acc);
  f = __half22float2(h[2]);
  acc = fmaf(qb.x, f.x, acc);
  acc = fmaf(qb.y, f.y, acc);
  f = __half22float2(h[3]);
  acc = fmaf(qb.z, f.x, acc);
  acc = fmaf(qb.w, f.y, acc);
  return acc;
}

// grid: x = token, y = kv head * n_sub + sub-group; block: cfg.threads.
// Shared memory: [2 stages][K, V][kTile][row_stride] fp16, then q [heads][HD] fp32,
// scores / probabilities [heads][kTile] fp32, running max, running sum and this tile's rescale
// factor [heads] fp32 each. After the key loop the K/V area holds the partial accumulators.
template <int HD>
__global__ void __launch_bounds__(k_max_threads) paged_attention_kernel(const attn_params p) {
  constexpr int kTile = tile_keys(HD);
  constexpr int kChunks = HD / 8;  // 16-byte chunks per K/V row
  extern __shared__ __align__(16) unsigned char smem[];

  const launch_config& cfg = p.cfg;
  const int tid = threadIdx.x, n_threads = blockDim.x;
  const int64_t tok = blockIdx.x;
  const int kv_head = static_cast<int>(blockIdx.y) / cfg.n_sub;
  const int g0 = (static_cast<int>(blockIdx.y) % cfg.n_sub) * cfg.heads_per_block;  // first head in the group
  const int n_heads = min(cfg.heads_per_block, p.group - g0);                       // heads of this block
  const int64_t head0 = static_cast<int64_t>(kv_head) * p.group + g0;               // its first query head
  __half* out = p.out + (tok * p.n_head + head0) * HD;                              // [n_heads][HD]

  const int seq = p.seq_of_token[tok], pos = p.pos_of_token[tok];
  if (seq < 0 || pos < 0) {  // padding token (the whole block returns: no barrier is skipped)
    for (int i = tid; i < n_heads * HD; i += n_threads) out[i] = __float2half(0.f);
    return;
  }
  const int n_keys = pos + 1;
  const int32_t* table = p.block_tables + seq * p.max_blocks_per_seq;

  const int rs = cfg.row_stride;
  __half* kv_s = reinterpret_cast<__half*>(smem);
  float* q_s = reinterpret_cast<float*>(smem + cfg.kv_bytes);
  float* s_s = q_s + cfg.heads_per_block * HD;
  float* m_s = s_s + cfg.heads_per_block * kTile;
  float* l_s = m_s + cfg.heads_per_block;
  float* a_s = l_s + cfg.heads_per_block;
  auto k_tile = [&](int stage) { return kv_s + (2 * stage) * kTile * rs; };
  auto v_tile = [&](int stage) { return kv_s + (2 * stage + 1) * kTile * rs; };

  // Tile `tile`'s K and V rows into stage `stage`, one cp.async group per call (empty past the end).
  const __half* k_src = p.k_cache + static_cast<int64_t>(kv_head) * HD;
  const __half* v_src = p.v_cache + static_cast<int64_t>(kv_head) * HD;
  auto load_tile = [&](int tile, int stage) {
    __half* kd = k_tile(stage);
    __half* vd = v_tile(stage);
    const int j0 = tile * kTile;
    for (int c = tid; c < kTile * kChunks; c += n_threads) {
      const int t = c / kChunks, part = c % kChunks, j = j0 + t;
      if (j < n_keys) {
        const int64_t row = static_cast<int64_t>(table[j / p.block_size]) * p.block_size + j % p.block_size;
        const int64_t off = row * p.kv_dim + part * 8;
        __pipeline_memcpy_async(kd + t * rs + part * 8, k_src + off, 16);
        __pipeline_memcpy_async(vd + t * rs + part * 8, v_src + off, 16);
      }
    }
    __pipeline_commit();
  };

  const int n_tiles = (n_keys + kTile - 1) / kTile;
  load_tile(0, 0);

  const float* q = p.q + (tok * p.n_head + head0) * HD;
  for (int i = tid; i < n_heads * HD; i += n_threads) q_s[i] = q[i] * p.q_scale;
  for (int g = tid; g < n_heads; g += n_threads) {
    m_s[g] = -INFINITY;
    l_s[g] = 0.f;
  }

  // This thread's output pair (elements 2 * d2, 2 * d2 + 1 of head g_pv) and key subset ks.
  const int n_pairs = cfg.heads_per_block * (HD / 2);
  const int pair = tid % n_pairs, ks = tid / n_pairs;
  const int g_pv = pair / (HD / 2), d2 = pair % (HD / 2);
  float2 acc = make_float2(0.f, 0.f);

  const int L = cfg.lanes_per_dot;
  const int n_dot_threads = n_heads * kTile * L;
  const int warp = tid / 32, lane = tid % 32, n_warps = n_threads / 32;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < n_tiles)
      load_tile(tile + 1, stage ^ 1);
    else
      __pipeline_commit();
    __pipeline_wait_prior(1);  // this thread's copies of `tile` have landed
    __syncthreads();           // everyone's have (and q_s, m_s, l_s on the first tile)

    const int nt = min(kTile, n_keys - tile * kTile);  // valid keys in this tile
    const __half* ks_tile = k_tile(stage);
    const __half* vs_tile = v_tile(stage);

    // Scores: L lanes per (head, key), lane l summing chunks l, l + L, ...; uniform trip count
    // so that every lane reaches the shuffles.
    for (int base = 0; base < n_dot_threads; base += n_threads) {
      const int idx = base + tid;
      const int dot_id = idx / L, l = idx % L;
      const int g = dot_id / kTile, t = dot_id % kTile;
      const bool valid = idx < n_dot_threads && t < nt;
      float a0 = 0.f, a1 = 0.f;
      if (valid) {
        const float* qg = q_s + g * HD;
        const __half* kr = ks_tile + t * rs;
        for (int c = l; c < kChunks; c += 2 * L) {
          a0 = dot8(qg + 8 * c, kr + 8 * c, a0);
          if (c + L < kChunks) a1 = dot8(qg + 8 * (c + L), kr + 8 * (c + L), a1);
        }
      }
      float s = a0 + a1;
      for (int o = L / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (valid && l == 0) s_s[g * kTile + t] = s;
    }
    __syncthreads();

    // Online softmax, one warp per query head.
    for (int g = warp; g < n_heads; g += n_warps) {
      float* sg = s_s + g * kTile;
      float mx = -INFINITY;
      for (int t = lane; t < nt; t += 32) mx = fmaxf(mx, sg[t]);
      mx = warp_max(mx);
      const float m_old = m_s[g], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int t = lane; t < nt; t += 32) {
        const float e = exp2f(sg[t] - m_new);
        sg[t] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      __syncwarp();  // every lane has read m_s[g] before lane 0 overwrites it
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        a_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();

    // Accumulate p V for this thread's pair over keys ks, ks + key_splits, ...
    if (g_pv < n_heads) {
      const float alpha = a_s[g_pv];
      acc.x *= alpha;
      acc.y *= alpha;
      const float* pg = s_s + g_pv * kTile;
      for (int t = ks; t < nt; t += cfg.key_splits) {
        const float pr = pg[t];
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(vs_tile + t * rs + 2 * d2));
        acc.x = fmaf(pr, v.x, acc.x);
        acc.y = fmaf(pr, v.y, acc.y);
      }
    }
    __syncthreads();  // stage `stage` and s_s are free for the next tile
  }
  __pipeline_wait_prior(0);

  // Sum the key_splits partial accumulators of each pair, normalise, store fp16.
  float2* partial = reinterpret_cast<float2*>(smem);  // [key_splits][n_pairs], inside the K/V area
  partial[ks * n_pairs + pair] = acc;
  __syncthreads();
  if (tid < n_pairs && g_pv < n_heads) {
    float2 sum = partial[pair];
    for (int k = 1; k < cfg.key_splits; ++k) {
      const float2 o = partial[k * n_pairs + pair];
      sum.x += o.x;
      sum.y += o.y;
    }
    const float inv = 1.f / l_s[g_pv];
    *reinterpret_cast<__half2*>(out + g_pv * HD + 2 * d2) = __floats2half2_rn(sum.x * inv, sum.y * inv);
  }
}

template <int HD>
void launch_paged_attention(const attn_params& p, int64_t n_tok, int64_t n_head_kv, cudaStream_t stream) {
  const launch_config& c = p.cfg;
  const dim3 grid(static_cast<unsigned>(n_tok), static_cast<unsigned>(n_head_kv * c.n_sub));
  paged_attention_kernel<HD><<<grid, c.threads, c.smem_bytes, stream>>>(p);
  SY_CUDA_CHECK_LAUNCH();
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("cuda::paged_attention: " + what);
}

}  // namespace

void paged_attention(const float* q, const __half* k_cache, const __half* v_cache, const int32_t* block_tables,
                     int64_t max_blocks_per_seq, const int32_t* seq_of_token, const int32_t* pos_of_token,
                     int64_t n_tok, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t block_size,
                     float scale, __half* out, cudaStream_t stream) {
  if (n_tok <= 0) return;
  require(head_dim == 64 || head_dim == 128, "head_dim must be 64 or 128 (got " + std::to_string(head_dim) + ")");
  require(n_head_kv > 0 && n_head > 0 && n_head % n_head_kv == 0, "n_head (" + std::to_string(n_head) +
                                                                      ") must be a positive multiple of n_head_kv (" +
                                                                      std::to_string(n_head_kv) + ")");
  require(block_size > 0 && block_size <= INT32_MAX, "block_size must be positive");
  require(max_blocks_per_seq > 0, "max_blocks_per_seq must be positive");
  require(max_blocks_per_seq * block_size <= INT32_MAX, "positions must fit in int32");
  require(n_tok <= INT32_MAX, "too many tokens for one launch");
  require(n_head <= INT32_MAX, "too many heads");
  require(q && k_cache && v_cache && block_tables && seq_of_token && pos_of_token && out, "null pointer");
  require(reinterpret_cast<uintptr_t>(k_cache) % 16 == 0 && reinterpret_cast<uintptr_t>(v_cache) % 16 == 0,
          "k_cache and v_cache must be 16-byte aligned");
  require(reinterpret_cast<uintptr_t>(out) % 4 == 0, "out must be 4-byte aligned");

  const int group = static_cast<int>(n_head / n_head_kv);
  attn_params p{};
  p.q = q;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.block_tables = block_tables;
  p.seq_of_token = seq_of_token;
  p.pos_of_token = pos_of_token;
  p.out = out;
  p.max_blocks_per_seq = max_blocks_per_seq;
  p.kv_dim = n_head_kv * head_dim;
  p.n_head = static_cast<int>(n_head);
  p.group = group;
  p.block_size = static_cast<int>(block_size);
  p.q_scale = scale * k_log2e;
  p.cfg = make_config(static_cast<int>(head_dim), group);
  const launch_config& c = p.cfg;
  require(n_head_kv * c.n_sub <= 65535, "too many kv heads for the grid's y dimension");
  // Both hold for every head_dim / group make_config accepts; checked so a change to the tile
  // sizes cannot silently overrun the block's shared memory.
  require(c.threads <= k_max_threads && c.threads % 32 == 0, "block of " + std::to_string(c.threads) + " threads");
  require(c.smem_bytes <= k_max_smem, "needs " + std::to_string(c.smem_bytes) + " bytes of shared memory per block");
  require(c.threads * static_cast<int>(sizeof(float2)) <= c.kv_bytes, "partial sums do not fit the K/V area");

  if (head_dim == 64)
    launch_paged_attention<64>(p, n_tok, n_head_kv, stream);
  else
    launch_paged_attention<128>(p, n_tok, n_head_kv, stream);
}

}  // namespace sy::cuda
