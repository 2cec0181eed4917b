#include "worker/model/cpu_forward.hpp"

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
#include "worker/model/kv_window.hpp"

namespace sy {

cpu_forward::cpu_forward(const llama_model& model, cpu::thread_pool& pool, int64_t n_ctx)
    : model_(model), pool_(pool), n_ctx_(n_ctx) {
  int64_t n_global = 0, n_window = 0;
  for (const llama_layer& L : model_.layers()) kind_index_.push_back(L.windowed ? n_window++ : n_global++);
}

cpu_forward::layer_kv cpu_forward::kv_of(int64_t l) const {
  if (window_kv_ == nullptr) return {kv_, l, false};
  const bool windowed = model_.layers()[static_cast<size_t>(l)].windowed;
  return {windowed ? window_kv_ : kv_, kind_index_[static_cast<size_t>(l)], windowed};
}

void cpu_forward::check_tables(std::span<const batch_seq> batch) const {
  const int64_t bs = kv_->block_size();
  if (window_kv_ != nullptr && window_kv_->block_size() != bs)
    throw std::invalid_argument("cpu_forward: the window arena's block size differs");
  const int64_t window = model_.hparams().sliding_window;
  for (const batch_seq& b : batch) {
    const int64_t end = b.pos0 + static_cast<int64_t>(b.tokens.size());
    if (static_cast<int64_t>(b.block_ids.size()) * bs < end)
      throw std::invalid_argument("cpu_forward: block table too short for the sequence");
    for (int32_t id : b.block_ids)
      if (id < 0 || id >= kv_->n_blocks()) throw std::invalid_argument("cpu_forward: block id out of range");
    if (window_kv_ == nullptr) continue;
    if (b.window_block_ids.size() != b.block_ids.size())
      throw std::invalid_argument("cpu_forward: window table and block table differ in length");
    // Released entries only behind what the step's first token can see.
    const auto live = static_cast<size_t>(first_live_block(b.pos0, window, bs));
    for (size_t j = 0; j < b.window_block_ids.size(); ++j) {
      const int32_t id = b.window_block_ids[j];
      if (id == k_released_block && j < live) continue;
      if (id < 0 || id >= window_kv_->n_blocks())
        throw std::invalid_argument("cpu_forward: window block id out of range or released inside the window");
    }
  }
}

// Rows of the activations: every token of the step, generated-token rows first, then
// prompt-token rows. A token's role (position < n_prompt or not) picks its kernels, so its
// numerics never depend on what else is in the batch (batching-invariant results).
void cpu_forward::plan_rows(std::span<const batch_seq> batch) {
  const int64_t n_vocab = model_.hparams().n_vocab;
  rows_.clear();
  out_rows_.clear();
  n_decode_ = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t s = 0; s < batch.size(); ++s) {
      const batch_seq& b = batch[s];
      const int64_t n = static_cast<int64_t>(b.tokens.size());
      for (int64_t j = 0; j < n; ++j) {
        const bool generated = b.pos0 + j >= b.n_prompt;
        if (generated != (pass == 0)) continue;
        if (b.tokens[j] < 0 || b.tokens[j] >= n_vocab)
          throw std::invalid_argument("cpu_forward: token id outside the vocabulary");
        n_decode_ += generated;
        rows_.push_back({static_cast<int32_t>(s), b.pos0 + j, b.tokens[j]});
      }
    }
  // Output rows in batch order: find each sequence's rows again.
  std::vector<std::vector<int64_t>> seq_rows(batch.size());
  for (size_t i = 0; i < rows_.size(); ++i) seq_rows[rows_[i].seq].push_back(static_cast<int64_t>(i));
  for (size_t s = 0; s < batch.size(); ++s) {
    auto& r = seq_rows[s];
    std::sort(r.begin(), r.end(), [&](int64_t a, int64_t b) { return rows_[a].pos < rows_[b].pos; });
    for (size_t j = 0; j < r.size(); ++j)
      if (batch[s].all_logits || (batch[s].logits && j + 1 == r.size())) out_rows_.push_back(r[j]);
  }
}

void cpu_forward::size_buffers(std::span<const batch_seq> batch) {
  const llama_hparams& hp = model_.hparams();
  const int64_t N = static_cast<int64_t>(rows_.size()), E = hp.n_embd, Q = hp.q_dim(), KV = hp.kv_dim(), F = hp.n_ff;
  x_.resize(N * E);
  xn_.resize(N * E);
  q_.resize(N * Q);
  attn_.resize(N * Q);
  tmp_.resize(N * E);
  k_.resize(N * KV);
  v_.resize(N * KV);
  gate_.resize(N * F);
  up_.resize(N * F);
  int64_t max_keys = 0;
  for (const auto& b : batch) max_keys = std::max<int64_t>(max_keys, b.pos0 + static_cast<int64_t>(b.tokens.size()));
  scratch_ = cpu::attend_group_scratch(hp.n_head / hp.n_head_kv, max_keys, hp.head_dim);
  scores_.resize(static_cast<size_t>(pool_.size() * scratch_));
  kb_.resize(batch.size());
  vb_.resize(batch.size());
}

// Integer kernels for generated-token rows, panel GEMM for prompt rows. Layers sharing an input
// (Q/K/V, gate/up) run fused: one activation conversion, one job.
void cpu_forward::linears(std::initializer_list<cpu::linear_out> outs, const float* x, int64_t ldx) {
  const int64_t N = static_cast<int64_t>(rows_.size());
  const std::span<const cpu::linear_out> all(outs.begin(), outs.size());
  if (n_decode_ > 0) cpu::forward_gemv_fused(all, x, ldx, n_decode_, pool_);
  if (N > n_decode_) {
    std::vector<cpu::linear_out> prompt(outs);
    for (auto& o : prompt) o.y += n_decode_ * o.ldy;
    cpu::forward_gemm_fused(prompt, x + n_decode_ * ldx, ldx, N - n_decode_, pool_);
  }
}

// The arithmetic per token is the same whether per_row splits the rows over the pool or not.
void cpu_forward::add_then_norm(bool add, const std::vector<float>& norm) {
  const int64_t E = model_.hparams().n_embd;
  const float eps = model_.hparams().rms_eps;
  per_row([&](int64_t i) {
    if (add) cpu::add_inplace(x_.data() + i * E, tmp_.data() + i * E, E);
    cpu::rms_norm(x_.data() + i * E, norm.data(), xn_.data() + i * E, E, eps);
  });
}

// Q, K, V of every row (biases, per-head norms, RoPE), and the new K/V into their KV blocks.
void cpu_forward::store_qkv(int64_t l, const llama_layer& L, std::span<const batch_seq> batch) {
  const llama_hparams& hp = model_.hparams();
  const layer_kv at = kv_of(l);
  kv_arena& kv = *at.arena;
  const int64_t E = hp.n_embd, Q = hp.q_dim(), KV = hp.kv_dim(), HD = hp.head_dim, bs = kv.block_size();
  const cpu::kv_layer_view layout{nullptr, nullptr, bs, KV, kv.type(), cpu::kv_layout::heads};
  const cpu::rope_config rope = model_.rope(L.windowed, n_ctx_);
  linears({{&L.wq, q_.data(), Q}, {&L.wk, k_.data(), KV}, {&L.wv, v_.data(), KV}}, xn_.data(), E);
  per_row([&](int64_t i) {
    const int64_t pos = rows_[i].pos;
    if (hp.qkv_bias) {
      cpu::add_inplace(q_.data() + i * Q, L.bq.data(), Q);
      cpu::add_inplace(k_.data() + i * KV, L.bk.data(), KV);
      cpu::add_inplace(v_.data() + i * KV, L.bv.data(), KV);
    }
    if (hp.qk_norm) {
      for (int64_t h = 0; h < hp.n_head; ++h) {
        float* qh = q_.data() + i * Q + h * HD;
        cpu::rms_norm(qh, L.q_norm.data(), qh, HD, hp.rms_eps);
      }
      for (int64_t h = 0; h < hp.n_head_kv; ++h) {
        float* kh = k_.data() + i * KV + h * HD;
        cpu::rms_norm(kh, L.k_norm.data(), kh, HD, hp.rms_eps);
      }
    }
    cpu::rope(q_.data() + i * Q, hp.n_head, HD, pos, rope);
    cpu::rope(k_.data() + i * KV, hp.n_head_kv, HD, pos, rope);
    const batch_seq& b = batch[rows_[i].seq];
    const int32_t block = table_of(b, at)[pos / bs];
    for (int64_t h = 0; h < hp.n_head_kv; ++h) {
      cpu::store_kv_head(k_.data() + i * KV + h * HD, kv.k_block(at.layer, block), layout, pos % bs, h, HD, true);
      cpu::store_kv_head(v_.data() + i * KV + h * HD, kv.v_block(at.layer, block), layout, pos % bs, h, HD, false);
    }
  });
}

// Attention into attn_; causal — token at pos sees keys [0, pos], or on a sliding-window layer
// [pos - window + 1, pos]: the view then starts at the block holding the window's first key and
// masks the keys of that block before it (with the window release, the blocks before it may be
// released: their pointers are never read). With enough tokens, one task per (token, kv head) runs
// the query heads that share it together (K/V read once per group); a few tokens (single-stream
// decode) split per query head so every thread has work.
void cpu_forward::attend(int64_t l, std::span<const batch_seq> batch) {
  const llama_hparams& hp = model_.hparams();
  const layer_kv at = kv_of(l);
  kv_arena& kv = *at.arena;
  const int64_t Q = hp.q_dim(), KV = hp.kv_dim(), HD = hp.head_dim, bs = kv.block_size();
  const int64_t N = static_cast<int64_t>(rows_.size()), group = hp.n_head / hp.n_head_kv;
  const float scale = hp.attn_scale;
  const int64_t window = model_.layers()[static_cast<size_t>(l)].windowed ? hp.sliding_window : 0;
  // Row i's keys: the first block of its view, how many keys it reads, how many of them are masked.
  struct span_of_keys {
    int64_t first_block, n_keys, n_masked;
  };
  auto keys_of = [&](int64_t i) {
    const int64_t pos = rows_[i].pos, first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
    const int64_t fb = first / bs;
    return span_of_keys{fb, pos + 1 - fb * bs, first - fb * bs};
  };
  for (size_t s = 0; s < batch.size(); ++s) {
    const std::span<const int32_t> table = table_of(batch[s], at);
    kb_[s].resize(table.size());
    vb_[s].resize(table.size());
    for (size_t j = 0; j < table.size(); ++j) {
      const bool live = table[j] != k_released_block;
      kb_[s][j] = live ? kv.k_block(at.layer, table[j]) : nullptr;
      vb_[s][j] = live ? kv.v_block(at.layer, table[j]) : nullptr;
    }
  }
  const bool grouped = N * hp.n_head_kv >= 4 * pool_.size();
  pool_.run([&](int ith, int nth) {
    // Interleaved: later tokens attend over more keys, so contiguous ranges would be uneven.
    float* sc = scores_.data() + ith * scratch_;
    if (grouped) {
      auto view_of = [&](int64_t i, const span_of_keys& k) {
        const int32_t s = rows_[i].seq;
        return cpu::kv_layer_view{kb_[s].data() + k.first_block, vb_[s].data() + k.first_block, bs, KV, kv.type(),
                                  cpu::kv_layout::heads};
      };
      for (int64_t task = ith; task < N * hp.n_head_kv; task += nth) {
        const int64_t i = task / hp.n_head_kv, kvh = task % hp.n_head_kv;
        const span_of_keys k = keys_of(i);
        const cpu::kv_layer_view view = view_of(i, k);
        if (const int64_t next = task + nth; next < N * hp.n_head_kv) {  // its first keys arrive meanwhile
          const int64_t ni = next / hp.n_head_kv;
          const span_of_keys nk = keys_of(ni);
          cpu::prefetch_attend_group(view_of(ni, nk), next % hp.n_head_kv, HD, nk.n_keys);
        }
        cpu::attend_group(q_.data() + i * Q + kvh * group * HD, group, k.n_keys, view, kvh, HD, scale, sc,
                          attn_.data() + i * Q + kvh * group * HD, k.n_masked);
      }
      return;
    }
    for (int64_t task = ith; task < N * hp.n_head; task += nth) {
      const int64_t i = task / hp.n_head, h = task % hp.n_head;
      const int32_t s = rows_[i].seq;
      const span_of_keys k = keys_of(i);
      cpu::kv_layer_view view{kb_[s].data() + k.first_block, vb_[s].data() + k.first_block, bs, KV, kv.type(),
                              cpu::kv_layout::heads};
      // A group of one: the very same arithmetic per head as above, so results do not depend on
      // which split a batch size picked (batching invariance).
      cpu::attend_group(q_.data() + i * Q + h * HD, 1, k.n_keys, view, h / group, HD, scale, sc,
                        attn_.data() + i * Q + h * HD, k.n_masked);
    }
  });
}

// tmp_ = rms_norm(tmp_) with `norm` (Gemma 3's norms of a block's output), when it has one.
void cpu_forward::post_norm(const std::vector<float>& norm) {
  if (norm.empty()) return;
  const int64_t E = model_.hparams().n_embd;
  const float eps = model_.hparams().rms_eps;
  per_row([&](int64_t i) { cpu::rms_norm(tmp_.data() + i * E, norm.data(), tmp_.data() + i * E, E, eps); });
}

// Layer l's attention: its output projection lands in tmp_ (joined to the residual by the next
// add_then_norm).
void cpu_forward::attention_block(int64_t l, std::span<const batch_seq> batch) {
  const llama_layer& L = model_.layers()[static_cast<size_t>(l)];
  const int64_t E = model_.hparams().n_embd, Q = model_.hparams().q_dim();
  add_then_norm(l > 0, L.attn_norm);  // the previous layer's FFN output joins the residual here
  store_qkv(l, L, batch);
  attend(l, batch);
  linears({{&L.wo, tmp_.data(), E}}, attn_.data(), Q);
  post_norm(L.post_attn_norm);
}

// Gated feed-forward (SiLU, or GELU for Gemma); its output lands in tmp_.
void cpu_forward::ffn_block(const llama_layer& L) {
  const int64_t E = model_.hparams().n_embd, F = model_.hparams().n_ff;
  add_then_norm(true, L.ffn_norm);
  linears({{&L.w_gate, gate_.data(), F}, {&L.w_up, up_.data(), F}}, xn_.data(), E);
  if (model_.hparams().act == ffn_activation::gelu_tanh)
    per_row([&](int64_t i) { cpu::gelu_mul(gate_.data() + i * F, up_.data() + i * F, gate_.data() + i * F, F); });
  else
    per_row([&](int64_t i) { cpu::silu_mul(gate_.data() + i * F, up_.data() + i * F, gate_.data() + i * F, F); });
  linears({{&L.w_down, tmp_.data(), E}}, gate_.data(), F);
  post_norm(L.post_ffn_norm);
}

// The last residual, then the output norm of the wanted rows (into xn_'s first rows).
void cpu_forward::final_norm() {
  const llama_hparams& hp = model_.hparams();
  const int64_t E = hp.n_embd;
  per_row([&](int64_t i) { cpu::add_inplace(x_.data() + i * E, tmp_.data() + i * E, E); });
  const int64_t n_out = static_cast<int64_t>(out_rows_.size());
  for (int64_t j = 0; j < n_out; ++j)
    cpu::rms_norm(x_.data() + out_rows_[j] * E, model_.output_norm().data(), xn_.data() + j * E, E, hp.rms_eps);
}

// The output head over the normed rows. The head always takes the integer path, whatever the
// number of rows: a row's logits must not depend on how many other rows share the step.
void cpu_forward::output_logits(std::vector<float>& logits) {
  const llama_hparams& hp = model_.hparams();
  const int64_t E = hp.n_embd;
  final_norm();
  const int64_t n_out = static_cast<int64_t>(out_rows_.size());
  logits.resize(static_cast<size_t>(n_out * hp.n_vocab));
  if (n_out > 0) model_.output().forward_gemv(xn_.data(), E, n_out, logits.data(), hp.n_vocab, pool_);
  if (const float cap = hp.final_logit_softcap; cap > 0)
    for (float& v : logits) v = cap * std::tanh(v / cap);
}

bool cpu_forward::run_layers(std::span<const batch_seq> batch, kv_arena& kv, kv_arena* window_kv) {
  kv_ = &kv;
  window_kv_ = window_kv;
  check_tables(batch);  // cheap checks that keep a caller's bug from writing outside the arenas
  plan_rows(batch);
  if (rows_.empty()) return false;
  size_buffers(batch);
  const int64_t E = model_.hparams().n_embd;
  for (size_t i = 0; i < rows_.size(); ++i) model_.embed(rows_[i].token, x_.data() + static_cast<int64_t>(i) * E);
  for (int64_t l = 0; l < model_.hparams().n_layer; ++l) {
    attention_block(l, batch);
    ffn_block(model_.layers()[static_cast<size_t>(l)]);
  }
  return true;
}

void cpu_forward::run(std::span<const batch_seq> batch, kv_arena& kv, std::vector<float>& logits, kv_arena* window_kv) {
  if (!run_layers(batch, kv, window_kv)) {
    logits.clear();
    return;
  }
  output_logits(logits);
}

void cpu_forward::run_hidden(std::span<const batch_seq> batch, kv_arena& kv, std::vector<float>& hidden,
                             kv_arena* window_kv) {
  if (!run_layers(batch, kv, window_kv)) {
    hidden.clear();
    return;
  }
  final_norm();
  const int64_t E = model_.hparams().n_embd;
  hidden.assign(xn_.begin(), xn_.begin() + static_cast<int64_t>(out_rows_.size()) * E);
}

}  // namespace sy
