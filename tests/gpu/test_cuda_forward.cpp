// End to end: the CUDA forward pass and the CPU forward pass on SmolLM2 agree on the top-1
// token at >= 99 % of positions under teacher forcing (issue 6), for a prefill of whole
// sequences and for batched one-token decode steps through paged KV blocks in shuffled order.
// Exits 77 without a device (or without the model file).
#include <algorithm>
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
    s.check(lc.size() == lg.size(), "prefill: same number of logits rows");
    int64_t agree = 0, total = 0;
    for (size_t r = 0; r < lc.size() / V; ++r) {
      agree += top1(lc.data() + r * V, V) == top1(lg.data() + r * V, V);
      ++total;
    }
    std::printf("prefill top-1 agreement %lld / %lld\n", static_cast<long long>(agree), static_cast<long long>(total));
    s.check(agree * 100 >= total * 99, "prefill: top-1 agreement >= 99 %");

    // 2. Batched decode: positions 64..79 one token per sequence per step.
    agree = total = 0;
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
      for (size_t r = 0; r < seqs.size(); ++r) {
        agree += top1(lc.data() + r * V, V) == top1(lg.data() + r * V, V);
        ++total;
      }
    }
    std::printf("decode top-1 agreement %lld / %lld\n", static_cast<long long>(agree), static_cast<long long>(total));
    s.check(agree * 100 >= total * 99, "decode: top-1 agreement >= 99 %");
  });
}
