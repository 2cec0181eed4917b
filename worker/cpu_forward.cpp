#include "worker/cpu_forward.hpp"

#include <cassert>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace sy {

void cpu_forward::run(std::span<const batch_seq> batch, kv_arena& kv, std::vector<float>& logits) {
  const llama_hparams& hp = model_.hparams();
  const int64_t E = hp.n_embd, KV = hp.kv_dim(), F = hp.n_ff, HD = hp.head_dim;
  const int64_t bs = kv.block_size();

  // Row i of the activations is token i of the concatenated batch.
  struct row_info { int32_t seq; int64_t pos; };
  std::vector<row_info> rows;
  std::vector<int64_t> out_rows;  // rows whose logits are wanted
  for (size_t s = 0; s < batch.size(); ++s) {
    const batch_seq& b = batch[s];
    const int64_t n = static_cast<int64_t>(b.tokens.size());
    // Cheap checks that keep a caller's bug from writing outside the KV arena.
    if (static_cast<int64_t>(b.block_ids.size()) * bs < b.pos0 + n)
      throw std::invalid_argument("cpu_forward: block table too short for the sequence");
    for (int32_t id : b.block_ids)
      if (id < 0 || id >= kv.n_blocks()) throw std::invalid_argument("cpu_forward: block id out of range");
    for (int64_t j = 0; j < n; ++j) {
      if (b.all_logits || j == n - 1) out_rows.push_back(static_cast<int64_t>(rows.size()));
      rows.push_back({static_cast<int32_t>(s), b.pos0 + j});
    }
  }
  const int64_t N = static_cast<int64_t>(rows.size());
  if (N == 0) {
    logits.clear();
    return;
  }
  x_.resize(N * E); xn_.resize(N * E); q_.resize(N * E); attn_.resize(N * E); tmp_.resize(N * E);
  k_.resize(N * KV); v_.resize(N * KV); gate_.resize(N * F); up_.resize(N * F);
  int64_t max_keys = 0;
  for (const auto& b : batch) max_keys = std::max<int64_t>(max_keys, b.pos0 + static_cast<int64_t>(b.tokens.size()));
  scores_.resize(static_cast<size_t>(pool_.size() * max_keys));

  {
    int64_t i = 0;
    for (const auto& b : batch)
      for (token_id t : b.tokens) {
        if (t < 0 || t >= hp.n_vocab) throw std::invalid_argument("cpu_forward: token id outside the vocabulary");
        model_.embed(t, x_.data() + (i++) * E);
      }
  }

  // Per sequence, this layer's block pointers (rebuilt per layer; a few per sequence).
  std::vector<std::vector<const float*>> kb(batch.size()), vb(batch.size());
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  const int64_t group = hp.n_head / hp.n_head_kv;

  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const llama_layer& L = model_.layers()[static_cast<size_t>(l)];
    for (int64_t i = 0; i < N; ++i)
      cpu::rms_norm(x_.data() + i * E, L.attn_norm.data(), xn_.data() + i * E, E, hp.rms_eps);
    L.wq.forward(xn_.data(), E, N, q_.data(), E, pool_);
    L.wk.forward(xn_.data(), E, N, k_.data(), KV, pool_);
    L.wv.forward(xn_.data(), E, N, v_.data(), KV, pool_);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t pos = rows[i].pos;
      cpu::rope_norm(q_.data() + i * E, hp.n_head, HD, hp.n_rot, pos, hp.rope_base);
      cpu::rope_norm(k_.data() + i * KV, hp.n_head_kv, HD, hp.n_rot, pos, hp.rope_base);
      const batch_seq& b = batch[rows[i].seq];
      const int32_t block = b.block_ids[pos / bs];
      std::memcpy(kv.k_block(l, block) + (pos % bs) * KV, k_.data() + i * KV, KV * sizeof(float));
      std::memcpy(kv.v_block(l, block) + (pos % bs) * KV, v_.data() + i * KV, KV * sizeof(float));
    }
    for (size_t s = 0; s < batch.size(); ++s) {
      kb[s].resize(batch[s].block_ids.size());
      vb[s].resize(batch[s].block_ids.size());
      for (size_t j = 0; j < batch[s].block_ids.size(); ++j) {
        kb[s][j] = kv.k_block(l, batch[s].block_ids[j]);
        vb[s][j] = kv.v_block(l, batch[s].block_ids[j]);
      }
    }
    // Attention: one task per (token, head); causal — token at pos sees keys [0, pos].
    pool_.run([&](int ith, int nth) {
      // Interleaved: later tokens attend over more keys, so contiguous ranges would be uneven.
      float* scores = scores_.data() + ith * max_keys;
      for (int64_t task = ith; task < N * hp.n_head; task += nth) {
        const int64_t i = task / hp.n_head, h = task % hp.n_head;
        const int32_t s = rows[i].seq;
        cpu::kv_layer_view view{kb[s].data(), vb[s].data(), bs, KV};
        cpu::attend_head(q_.data() + i * E + h * HD, rows[i].pos + 1, view, h / group, HD, scale,
                         scores, attn_.data() + i * E + h * HD);
      }
    });
    L.wo.forward(attn_.data(), E, N, tmp_.data(), E, pool_);
    cpu::add_inplace(x_.data(), tmp_.data(), N * E);

    for (int64_t i = 0; i < N; ++i)
      cpu::rms_norm(x_.data() + i * E, L.ffn_norm.data(), xn_.data() + i * E, E, hp.rms_eps);
    L.w_gate.forward(xn_.data(), E, N, gate_.data(), F, pool_);
    L.w_up.forward(xn_.data(), E, N, up_.data(), F, pool_);
    cpu::silu_mul(gate_.data(), up_.data(), gate_.data(), N * F);
    L.w_down.forward(gate_.data(), F, N, tmp_.data(), E, pool_);
    cpu::add_inplace(x_.data(), tmp_.data(), N * E);
  }

  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  for (int64_t j = 0; j < n_out; ++j)
    cpu::rms_norm(x_.data() + out_rows[j] * E, model_.output_norm().data(), xn_.data() + j * E, E, hp.rms_eps);
  logits.resize(static_cast<size_t>(n_out * hp.n_vocab));
  model_.output().forward(xn_.data(), E, n_out, logits.data(), hp.n_vocab, pool_);
}

}  // namespace sy
