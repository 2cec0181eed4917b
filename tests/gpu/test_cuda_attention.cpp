// Parity of cuda::paged_attention with the CPU reference cpu::attend_head (f16 KV view; every op
// has one: docs/cuda-backend.md, "Layout").
// K/V live in shuffled physical blocks reached through block tables; each case is a batch of
// tokens (seq, pos) attending keys [0, pos] of their sequence: pure decode, prefill chunks,
// mixed batches with a padding token, and GQA shapes that exercise every launch layout.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/paged_attention.cuh"
#include "tests/gpu/gpu_check.hpp"

namespace {

using namespace sy;

constexpr uint16_t k_poison = 0x7e00;  // fp16 NaN: any output left unwritten fails the comparison
constexpr uint16_t k_guard = 0x5a5a;   // fp16 bits around the output; must survive the launch
constexpr size_t k_guard_halves = 1024;
constexpr double k_tolerance = 1e-5;  // normalised MSE; fp16 rounding of the output alone is ~1e-7

template <class T>
class device_buffer {
 public:
  explicit device_buffer(size_t n) : n_(n) { SY_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) { upload(host); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(ptr_); }
  void upload(const std::vector<T>& host) {
    SY_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    SY_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

struct attn_case {
  std::string name;
  int64_t n_head, n_head_kv, head_dim, block_size;
  std::vector<int64_t> seq_len;                     // cached positions of each sequence
  std::vector<std::pair<int32_t, int32_t>> tokens;  // (seq, pos); seq -1 is a padding token
};

std::vector<std::pair<int32_t, int32_t>> decode_tokens(const std::vector<int64_t>& lens) {
  std::vector<std::pair<int32_t, int32_t>> t;
  for (size_t s = 0; s < lens.size(); ++s) t.emplace_back(static_cast<int32_t>(s), static_cast<int32_t>(lens[s] - 1));
  return t;
}

// Tokens of sequence `seq` at positions [first, last].
void add_chunk(std::vector<std::pair<int32_t, int32_t>>& tokens, int32_t seq, int32_t first, int32_t last) {
  for (int32_t p = first; p <= last; ++p) tokens.emplace_back(seq, p);
}

void run_case(gpu_test::suite& s, const attn_case& c, uint32_t seed) {
  const int64_t hd = c.head_dim, bs = c.block_size, kv_dim = c.n_head_kv * hd, group = c.n_head / c.n_head_kv;
  const int64_t n_seq = static_cast<int64_t>(c.seq_len.size()), n_tok = static_cast<int64_t>(c.tokens.size());
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));

  // Block tables over a shuffled pool with a few spare blocks, so the mapping matters.
  int64_t max_blocks = 1, used = 0;
  for (int64_t len : c.seq_len) {
    max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
    used += (len + bs - 1) / bs;
  }
  const int64_t n_blocks = used + 5;
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(n_seq * max_blocks), -1);
  size_t next = 0;
  for (int64_t q = 0; q < n_seq; ++q)
    for (int64_t i = 0; i < (c.seq_len[q] + bs - 1) / bs; ++i) tables[q * max_blocks + i] = perm[next++];

  // K/V arena as fp16 bits, through the same conversion the CPU cache uses.
  const size_t arena = static_cast<size_t>(n_blocks * bs * kv_dim);
  std::vector<uint16_t> k_host(arena), v_host(arena);
  cpu::store_kv_row(gpu_test::random_floats(arena, seed + 1).data(), k_host.data(), static_cast<int64_t>(arena),
                    cpu::kv_type::f16);
  cpu::store_kv_row(gpu_test::random_floats(arena, seed + 2).data(), v_host.data(), static_cast<int64_t>(arena),
                    cpu::kv_type::f16);
  const std::vector<float> q = gpu_test::random_floats(static_cast<size_t>(n_tok * c.n_head * hd), seed + 3, 2.f);

  std::vector<int32_t> seq_of(static_cast<size_t>(n_tok)), pos_of(static_cast<size_t>(n_tok));
  for (int64_t t = 0; t < n_tok; ++t) {
    seq_of[t] = c.tokens[t].first;
    pos_of[t] = c.tokens[t].second;
  }

  // CPU reference, head by head.
  const size_t n_out = static_cast<size_t>(n_tok * c.n_head * hd);
  std::vector<float> want(n_out, 0.f), scores;
  for (int64_t t = 0; t < n_tok; ++t) {
    const int32_t sq = seq_of[t], pos = pos_of[t];
    if (sq < 0) continue;
    std::vector<const void*> kb(static_cast<size_t>(max_blocks), nullptr), vb(static_cast<size_t>(max_blocks), nullptr);
    for (int64_t i = 0; i < max_blocks; ++i) {
      const int32_t b = tables[sq * max_blocks + i];
      if (b < 0) continue;
      kb[i] = k_host.data() + b * bs * kv_dim;
      vb[i] = v_host.data() + b * bs * kv_dim;
    }
    const cpu::kv_layer_view view{kb.data(), vb.data(), bs, kv_dim, cpu::kv_type::f16};
    scores.assign(static_cast<size_t>(pos + 1), 0.f);
    for (int64_t h = 0; h < c.n_head; ++h) {
      const size_t at = static_cast<size_t>((t * c.n_head + h) * hd);
      cpu::attend_head(q.data() + at, pos + 1, view, h / group, hd, scale, scores.data(), want.data() + at);
    }
  }

  // Device run: output poisoned, guards on both sides.
  const device_buffer<float> q_dev(q);
  const device_buffer<uint16_t> k_dev(k_host), v_dev(v_host);
  const device_buffer<int32_t> tables_dev(tables), seq_dev(seq_of), pos_dev(pos_of);
  std::vector<uint16_t> out_host(n_out + 2 * k_guard_halves, k_guard);
  std::fill(out_host.begin() + k_guard_halves, out_host.begin() + k_guard_halves + n_out, k_poison);
  const device_buffer<uint16_t> out_dev(out_host);
  cuda::paged_attention(q_dev.get(), reinterpret_cast<const __half*>(k_dev.get()),
                        reinterpret_cast<const __half*>(v_dev.get()), tables_dev.get(), max_blocks, seq_dev.get(),
                        pos_dev.get(), n_tok, c.n_head, c.n_head_kv, hd, bs, scale,
                        reinterpret_cast<__half*>(out_dev.get() + k_guard_halves), nullptr);
  SY_CUDA_CHECK(cudaDeviceSynchronize());
  out_host = out_dev.download();

  bool guards_ok = true;
  for (size_t i = 0; i < k_guard_halves; ++i)
    guards_ok &= out_host[i] == k_guard && out_host[k_guard_halves + n_out + i] == k_guard;
  s.check(guards_ok, c.name + ": guard halves around the output unchanged");

  std::vector<float> got(n_out);
  for (size_t i = 0; i < n_out; ++i) got[i] = cpu::fp16_to_fp32(out_host[k_guard_halves + i]);

  // Whole batch, then the worst single token (a wrong short row must not hide among long ones),
  // and padding tokens exactly zero.
  std::vector<float> got_live, want_live;
  double worst = 0;
  int64_t worst_tok = -1;
  bool padding_zero = true;
  const size_t per_tok = static_cast<size_t>(c.n_head * hd);
  for (int64_t t = 0; t < n_tok; ++t) {
    const auto g0 = got.begin() + t * per_tok, w0 = want.begin() + t * per_tok;
    if (seq_of[t] < 0) {
      padding_zero &= std::all_of(g0, g0 + per_tok, [](float x) { return x == 0.f; });
      continue;
    }
    const std::vector<float> gt(g0, g0 + per_tok), wt(w0, w0 + per_tok);
    got_live.insert(got_live.end(), gt.begin(), gt.end());
    want_live.insert(want_live.end(), wt.begin(), wt.end());
    bool finite = std::all_of(gt.begin(), gt.end(), [](float x) { return std::isfinite(x); });
    const double e = finite ? gpu_test::suite::nmse(gt, wt) : INFINITY;
    if (e > worst || worst_tok < 0) {
      worst = e;
      worst_tok = t;
    }
  }
  s.check_nmse(got_live, want_live, k_tolerance, c.name + ": batch");
  if (worst_tok >= 0)
    s.check(worst <= k_tolerance, c.name + ": worst token " + std::to_string(worst_tok) + " (seq " +
                                      std::to_string(seq_of[worst_tok]) + ", pos " + std::to_string(pos_of[worst_tok]) +
                                      ") nmse " + std::to_string(worst));
  s.check(padding_zero, c.name + ": padding tokens give zeros");
}

std::vector<attn_case> cases() {
  std::vector<attn_case> all;
  const std::vector<int64_t> decode_lens{1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257, 1000, 2000};
  for (auto [n_head, n_head_kv, hd] : {std::tuple<int64_t, int64_t, int64_t>{9, 3, 64}, {8, 8, 128}}) {
    const std::string shape =
        std::to_string(n_head) + "/" + std::to_string(n_head_kv) + " heads, head_dim " + std::to_string(hd);
    all.push_back({"decode, " + shape, n_head, n_head_kv, hd, 16, decode_lens, decode_tokens(decode_lens)});

    attn_case first{"prefill first chunk, " + shape, n_head, n_head_kv, hd, 16, {80}, {}};
    add_chunk(first.tokens, 0, 0, 79);
    all.push_back(first);

    attn_case later{"prefill later chunk, " + shape, n_head, n_head_kv, hd, 16, {300}, {}};
    add_chunk(later.tokens, 0, 237, 299);
    all.push_back(later);

    attn_case mixed{"mixed batch, " + shape, n_head, n_head_kv, hd, 16, {1, 33, 700, 150, 2000}, {}};
    mixed.tokens = {{0, 0}, {1, 32}, {-1, 0}, {2, 699}};
    add_chunk(mixed.tokens, 3, 100, 149);
    mixed.tokens.emplace_back(4, 1999);
    all.push_back(mixed);

    attn_case odd_blocks = mixed;  // any block size
    odd_blocks.name = "mixed batch, block_size 7, " + shape;
    odd_blocks.block_size = 7;
    all.push_back(odd_blocks);

    attn_case longest{"8192 keys, " + shape, n_head, n_head_kv, hd, 16, {8192, 8192}, {{0, 8191}}};
    add_chunk(longest.tokens, 1, 8170, 8191);
    all.push_back(longest);
  }
  // Other group sizes: one kv head per block with key splits, odd pair counts, and groups too
  // large for one block (split over sub-blocks, the last one smaller).
  const std::vector<int64_t> lens{1, 70, 300, 1500};
  for (auto [n_head, n_head_kv, hd] : {std::tuple<int64_t, int64_t, int64_t>{4, 4, 64},
                                       {15, 3, 64},
                                       {32, 2, 64},
                                       {34, 2, 64},
                                       {12, 4, 128},
                                       {32, 4, 128},
                                       {24, 1, 128},
                                       {18, 2, 128}}) {
    attn_case gqa{"decode + chunk, " + std::to_string(n_head) + "/" + std::to_string(n_head_kv) + " heads, head_dim " +
                      std::to_string(hd),
                  n_head,
                  n_head_kv,
                  hd,
                  16,
                  lens,
                  decode_tokens(lens)};
    add_chunk(gqa.tokens, 2, 280, 299);
    all.push_back(gqa);
  }
  return all;
}

}  // namespace

int main() {
  return sy::gpu_test::run("cuda_attention", [](sy::gpu_test::suite& s) {
    uint32_t seed = 1234;
    for (const auto& c : cases()) run_case(s, c, seed += 17);
  });
}
