// End to end: the CUDA forward pass against the CPU forward pass on SmolLM2 under teacher forcing
// (issue 6), for a prefill of whole sequences and for batched one-token decode steps through paged
// KV blocks in shuffled order. Per phase: logits close (normalised MSE <= 1e-3), the device's
// top-1 never more than 1 logit below the CPU's best, and top-1 agreement >= 85 %.
// Why not ">= 99 % top-1": the CPU reference itself is quantized (bf16 activation panels for
// prompt positions, q8 activations for generated ones) and the tails below are random tokens, so
// about 10 % of rows are near-ties (top-2 margin < 0.05). An fp16-weight / fp32-accumulation
// emulation of this backend on the CPU (even with no fp16 rounding at all) agrees with it on
// 485/512 prefill and 117/128 decode rows, at most 0.22 logit below the CPU's best, logits
// nmse 4e-5 to 7e-5; a layout or indexing bug gives nmse ~1 and gaps of several logits.
// Exits 77 without a device (or without the model file).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>

#include "kernels/cpu/thread_pool.hpp"
#include "tests/gpu/gpu_check.hpp"
#include "worker/cpu_forward.hpp"
#include "worker/cuda_forward.hpp"
#include "worker/kv_arena.hpp"
#include "worker/llama_model.hpp"

namespace {

int64_t top1(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

// Device rows against CPU rows of one phase.
struct agreement {
  int64_t agree = 0, total = 0;
  double max_gap = 0;  // largest cpu[cpu top-1] - cpu[device top-1]
  double num = 0, den = 0;
  void add(const float* cpu, const float* gpu, int64_t n) {
    const int64_t a = top1(cpu, n), b = top1(gpu, n);
    agree += a == b;
    ++total;
    max_gap = std::max(max_gap, static_cast<double>(cpu[a]) - cpu[b]);
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(gpu[i]) - cpu[i];
      num += std::isfinite(d) ? d * d : 1e30;
      den += static_cast<double>(cpu[i]) * cpu[i];
    }
  }
  void report(sy::gpu_test::suite& s, const std::string& phase) const {
    const double nmse = den > 0 ? num / den : 1e30;
    std::printf("%s top-1 agreement %lld / %lld, largest gap %.4f, logits nmse %.3g\n", phase.c_str(),
                static_cast<long long>(agree), static_cast<long long>(total), max_gap, nmse);
    s.check(total > 0 && nmse <= 1e-3, phase + ": logits nmse " + std::to_string(nmse) + " <= 1e-3");
    s.check(max_gap <= 1.0,
            phase + ": device top-1 within 1 logit of the CPU's best (gap " + std::to_string(max_gap) + ")");
    s.check(agree * 100 >= total * 85, phase + ": top-1 agreement >= 85 %");
  }
};

}  // namespace

int main() {
  if (!std::filesystem::exists(SY_MODEL_PATH)) {
    std::printf("SKIP cuda_forward: model file %s not found\n", SY_MODEL_PATH);
    return 77;
  }
  return sy::gpu_test::run("cuda_forward", [](sy::gpu_test::suite& s) {
    sy::cpu::thread_pool pool(0);
    auto model = sy::llama_model::load(SY_MODEL_PATH, pool);
    const auto& hp = model->hparams();
    const int64_t V = hp.n_vocab, bs = 16;
    const std::vector<std::string> texts = {
        "The capital of France is Paris, and the capital of Germany is",
        "def fibonacci(n):\n    if n < 2:\n        return n\n",
        "<|im_start|>user\nHow do I register an account?<|im_end|>\n<|im_start|>assistant\n",
        "Once upon a time, in a small village by the sea, there lived",
        "1, 2, 3, 5, 8, 13, 21,",
        "Les chats dorment beaucoup parce que",
        "Water boils at 100 degrees Celsius at sea level because",
        "List three prime numbers: 2, 3,"};
    std::vector<std::vector<sy::token_id>> seqs;
    std::mt19937 rng(5);
    for (const auto& t : texts) {
      auto ids = model->vocab().encode(t, true, true);
      // Teacher forcing: the reference continuation is a fixed pseudo-random tail.
      std::uniform_int_distribution<int> d(300, 20000);
      while (ids.size() < 80) ids.push_back(d(rng));
      seqs.push_back(ids);
    }
    const int32_t n_blocks = 8 * 6 + 8;
    sy::cuda_forward_config cfg;
    cfg.n_kv_blocks = n_blocks;
    cfg.block_size = static_cast<int32_t>(bs);
    cfg.max_seqs_per_step = 8 * 64;  // the prefill asks for every position's logits
    sy::cuda_forward gpu(*model, cfg);
    sy::cpu_forward cpu(*model, pool);
    sy::kv_arena arena(hp.n_layer, n_blocks, bs, hp.kv_dim());
    // Shuffled physical blocks: 6 per sequence.
    std::vector<int32_t> perm(n_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<std::vector<int32_t>> tables(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) tables[i].assign(perm.begin() + 6 * i, perm.begin() + 6 * i + 6);

    // 1. Prefill of the first 64 tokens of every sequence in one batch, logits everywhere.
    std::vector<sy::batch_seq> batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      sy::batch_seq b;
      b.tokens = std::span<const sy::token_id>(seqs[i].data(), 64);
      b.pos0 = 0;
      b.block_ids = tables[i];
      b.all_logits = true;
      b.n_prompt = 64;
      batch.push_back(b);
    }
    std::vector<float> lc, lg;
    cpu.run(batch, arena, lc);
    gpu.run(batch, lg);
    s.check(lc.size() == lg.size() && lc.size() == 8 * 64 * static_cast<size_t>(V), "prefill: a logits row per token");
    agreement prefill;
    for (size_t r = 0; r < std::min(lc.size(), lg.size()) / V; ++r)
      prefill.add(lc.data() + r * V, lg.data() + r * V, V);
    prefill.report(s, "prefill");

    // 2. Batched decode: positions 64..79 one token per sequence per step.
    agreement decode;
    for (int64_t p = 64; p < 80; ++p) {
      batch.clear();
      for (size_t i = 0; i < seqs.size(); ++i) {
        sy::batch_seq b;
        b.tokens = std::span<const sy::token_id>(seqs[i].data() + p, 1);
        b.pos0 = p;
        b.block_ids = tables[i];
        b.n_prompt = 64;
        batch.push_back(b);
      }
      cpu.run(batch, arena, lc);
      gpu.run(batch, lg);
      s.check(lg.size() == seqs.size() * static_cast<size_t>(V), "decode: a logits row per sequence");
      for (size_t r = 0; r < seqs.size() && (r + 1) * V <= lg.size(); ++r)
        decode.add(lc.data() + r * V, lg.data() + r * V, V);
    }
    decode.report(s, "decode");
  });
}
