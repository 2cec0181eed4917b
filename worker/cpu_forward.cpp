#include "worker/cpu_forward.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <span>
#include <stdexcept>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace sy {

void cpu_forward::run(std::span<const batch_seq> batch, kv_arena& kv, std::vector<float>& logits) {
  const llama_hparams& hp = model_.hparams();
  const int64_t E = hp.n_embd, KV = hp.kv_dim(), F = hp.n_ff, HD = hp.head_dim;
  const int64_t bs = kv.block_size();

  // Rows of the activations: every token of the step, generated-token rows first, then
  // prompt-token rows. A token's role (position < n_prompt or not) picks its kernels, so its
  // numerics never depend on what else is in the batch (batching-invariant results).
  struct row_info {
    int32_t seq;
    int64_t pos;
    token_id token;
  };
  std::vector<row_info> rows;
  std::vector<int64_t> out_rows;  // rows whose logits are wanted, in batch order
  int64_t n_decode = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t s = 0; s < batch.size(); ++s) {
      const batch_seq& b = batch[s];
      const int64_t n = static_cast<int64_t>(b.tokens.size());
      if (pass == 0) {
        // Cheap checks that keep a caller's bug from writing outside the KV arena.
        if (static_cast<int64_t>(b.block_ids.size()) * bs < b.pos0 + n)
          throw std::invalid_argument("cpu_forward: block table too short for the sequence");
        for (int32_t id : b.block_ids)
          if (id < 0 || id >= kv.n_blocks()) throw std::invalid_argument("cpu_forward: block id out of range");
      }
      for (int64_t j = 0; j < n; ++j) {
        const bool generated = b.pos0 + j >= b.n_prompt;
        if (generated != (pass == 0)) continue;
        if (b.tokens[j] < 0 || b.tokens[j] >= hp.n_vocab)
          throw std::invalid_argument("cpu_forward: token id outside the vocabulary");
        n_decode += generated;
        rows.push_back({static_cast<int32_t>(s), b.pos0 + j, b.tokens[j]});
      }
    }
  {
    // Output rows in batch order: find each sequence's rows again.
    std::vector<std::vector<int64_t>> seq_rows(batch.size());
    for (size_t i = 0; i < rows.size(); ++i) seq_rows[rows[i].seq].push_back(static_cast<int64_t>(i));
    for (size_t s = 0; s < batch.size(); ++s) {
      auto& r = seq_rows[s];
      std::sort(r.begin(), r.end(), [&](int64_t a, int64_t b) { return rows[a].pos < rows[b].pos; });
      for (size_t j = 0; j < r.size(); ++j)
        if (batch[s].all_logits || (batch[s].logits && j + 1 == r.size())) out_rows.push_back(r[j]);
    }
  }
  const int64_t N = static_cast<int64_t>(rows.size());
  if (N == 0) {
    logits.clear();
    return;
  }
  // y = x W^T for all rows: integer kernels for generated-token rows, panel GEMM for prompt rows.
  // Layers sharing an input (Q/K/V, gate/up) run fused: one activation conversion, one job.
  auto linears = [&](std::initializer_list<cpu::linear_out> outs, const float* x, int64_t ldx) {
    const std::span<const cpu::linear_out> all(outs.begin(), outs.size());
    if (n_decode > 0) cpu::forward_gemv_fused(all, x, ldx, n_decode, pool_);
    if (N > n_decode) {
      std::vector<cpu::linear_out> prompt(outs);
      for (auto& o : prompt) o.y += n_decode * o.ldy;
      cpu::forward_gemm_fused(prompt, x + n_decode * ldx, ldx, N - n_decode, pool_);
    }
  };
  auto linear = [&](const cpu::linear& w, const float* x, int64_t ldx, float* y, int64_t ldy) {
    linears({{&w, y, ldy}}, x, ldx);
  };
  x_.resize(N * E);
  xn_.resize(N * E);
  q_.resize(N * E);
  attn_.resize(N * E);
  tmp_.resize(N * E);
  k_.resize(N * KV);
  v_.resize(N * KV);
  gate_.resize(N * F);
  up_.resize(N * F);
  int64_t max_keys = 0;
  for (const auto& b : batch) max_keys = std::max<int64_t>(max_keys, b.pos0 + static_cast<int64_t>(b.tokens.size()));
  const int64_t group = hp.n_head / hp.n_head_kv;
  const int64_t scratch = cpu::attend_group_scratch(group, max_keys, HD);
  scores_.resize(static_cast<size_t>(pool_.size() * scratch));

  for (int64_t i = 0; i < N; ++i) model_.embed(rows[i].token, x_.data() + i * E);

  const cpu::kv_layer_view layout{nullptr, nullptr, bs, KV, kv.type(), cpu::kv_layout::heads};
  // Per sequence, this layer's block pointers (rebuilt per layer; a few per sequence).
  std::vector<std::vector<const void*>> kb(batch.size()), vb(batch.size());
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  const cpu::rope_config rope = model_.rope();

  // Per-token work (norms, residual adds, RoPE, K/V stores, SwiGLU) split over the pool when the
  // step has enough tokens to pay for a job; the arithmetic per token is the same either way.
  auto per_token = [&](auto&& fn) { pool_.for_each(N, 16, fn); };
  // x += tmp (the residual of the block before), then xn = rms_norm(x) with `norm`'s weights.
  auto add_then_norm = [&](bool add, const std::vector<float>& norm) {
    per_token([&](int64_t i) {
      if (add) cpu::add_inplace(x_.data() + i * E, tmp_.data() + i * E, E);
      cpu::rms_norm(x_.data() + i * E, norm.data(), xn_.data() + i * E, E, hp.rms_eps);
    });
  };

  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const llama_layer& L = model_.layers()[static_cast<size_t>(l)];
    add_then_norm(l > 0, L.attn_norm);  // the previous layer's FFN output joins the residual here
    linears({{&L.wq, q_.data(), E}, {&L.wk, k_.data(), KV}, {&L.wv, v_.data(), KV}}, xn_.data(), E);
    per_token([&](int64_t i) {
      const int64_t pos = rows[i].pos;
      if (hp.qkv_bias) {
        cpu::add_inplace(q_.data() + i * E, L.bq.data(), E);
        cpu::add_inplace(k_.data() + i * KV, L.bk.data(), KV);
        cpu::add_inplace(v_.data() + i * KV, L.bv.data(), KV);
      }
      cpu::rope(q_.data() + i * E, hp.n_head, HD, pos, rope);
      cpu::rope(k_.data() + i * KV, hp.n_head_kv, HD, pos, rope);
      const batch_seq& b = batch[rows[i].seq];
      const int32_t block = b.block_ids[pos / bs];
      for (int64_t h = 0; h < hp.n_head_kv; ++h) {
        cpu::store_kv_head(k_.data() + i * KV + h * HD, kv.k_block(l, block), layout, pos % bs, h, HD, true);
        cpu::store_kv_head(v_.data() + i * KV + h * HD, kv.v_block(l, block), layout, pos % bs, h, HD, false);
      }
    });
    for (size_t s = 0; s < batch.size(); ++s) {
      kb[s].resize(batch[s].block_ids.size());
      vb[s].resize(batch[s].block_ids.size());
      for (size_t j = 0; j < batch[s].block_ids.size(); ++j) {
        kb[s][j] = kv.k_block(l, batch[s].block_ids[j]);
        vb[s][j] = kv.v_block(l, batch[s].block_ids[j]);
      }
    }
    // Attention; causal — token at pos sees keys [0, pos]. With enough tokens, one task per
    // (token, kv head) runs the query heads that share it together (K/V read once per group);
    // a few tokens (single-stream decode) split per query head so every thread has work.
    const bool grouped = N * hp.n_head_kv >= 4 * pool_.size();
    pool_.run([&](int ith, int nth) {
      // Interleaved: later tokens attend over more keys, so contiguous ranges would be uneven.
      float* sc = scores_.data() + ith * scratch;
      if (grouped) {
        for (int64_t task = ith; task < N * hp.n_head_kv; task += nth) {
          const int64_t i = task / hp.n_head_kv, kvh = task % hp.n_head_kv;
          const int32_t s = rows[i].seq;
          cpu::kv_layer_view view{kb[s].data(), vb[s].data(), bs, KV, kv.type(), cpu::kv_layout::heads};
          cpu::attend_group(q_.data() + i * E + kvh * group * HD, group, rows[i].pos + 1, view, kvh, HD, scale, sc,
                            attn_.data() + i * E + kvh * group * HD);
        }
        return;
      }
      for (int64_t task = ith; task < N * hp.n_head; task += nth) {
        const int64_t i = task / hp.n_head, h = task % hp.n_head;
        const int32_t s = rows[i].seq;
        cpu::kv_layer_view view{kb[s].data(), vb[s].data(), bs, KV, kv.type(), cpu::kv_layout::heads};
        // A group of one: the very same arithmetic per head as above, so results do not depend on
        // which split a batch size picked (batching invariance).
        cpu::attend_group(q_.data() + i * E + h * HD, 1, rows[i].pos + 1, view, h / group, HD, scale, sc,
                          attn_.data() + i * E + h * HD);
      }
    });
    linear(L.wo, attn_.data(), E, tmp_.data(), E);
    add_then_norm(true, L.ffn_norm);
    linears({{&L.w_gate, gate_.data(), F}, {&L.w_up, up_.data(), F}}, xn_.data(), E);
    per_token([&](int64_t i) { cpu::silu_mul(gate_.data() + i * F, up_.data() + i * F, gate_.data() + i * F, F); });
    linear(L.w_down, gate_.data(), F, tmp_.data(), E);
  }
  per_token([&](int64_t i) { cpu::add_inplace(x_.data() + i * E, tmp_.data() + i * E, E); });

  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  for (int64_t j = 0; j < n_out; ++j)
    cpu::rms_norm(x_.data() + out_rows[j] * E, model_.output_norm().data(), xn_.data() + j * E, E, hp.rms_eps);
  logits.resize(static_cast<size_t>(n_out * hp.n_vocab));
  // The output head always takes the integer path, whatever the number of rows: a row's logits
  // must not depend on how many other rows share the step.
  if (n_out > 0) model_.output().forward_gemv(xn_.data(), E, n_out, logits.data(), hp.n_vocab, pool_);
}

}  // namespace sy
