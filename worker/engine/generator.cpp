#include "worker/engine/generator.hpp"

#include <chrono>
#include <numeric>
#include <stdexcept>

#include "common/tokenizer/stream_decoder.hpp"
#include "worker/engine/stop_matcher.hpp"

namespace sy {
namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

generator::generator(const llama_model& model, cpu::thread_pool& pool, int64_t n_ctx, int64_t block_size,
                     cpu::kv_type kv)
    : model_(model), fwd_(model, pool, n_ctx), n_ctx_(n_ctx) {
  const auto& hp = model.hparams();
  const int64_t n_blocks = (n_ctx + block_size - 1) / block_size;
  kv_ = kv_arena(hp.n_layer, n_blocks, block_size, hp.kv_dim(), kv);
  block_ids_.resize(static_cast<size_t>(n_blocks));
  std::iota(block_ids_.begin(), block_ids_.end(), 0);
}

generation_result generator::generate(std::span<const token_id> prompt, const sampling_params& params,
                                      const std::function<bool(std::string_view)>& on_text) {
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt == 0) throw std::invalid_argument("the prompt is empty");
  if (n_prompt >= n_ctx_)
    throw std::invalid_argument("the prompt has " + std::to_string(n_prompt) + " tokens; the context holds " +
                                std::to_string(n_ctx_));
  for (token_id t : prompt)
    if (t < 0 || t >= model_.hparams().n_vocab)
      throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary");

  generation_result res;
  res.n_prompt = n_prompt;
  const tokenizer& vocab = model_.vocab();
  sampler smp(params);
  stop_matcher stops(params.stop);
  stream_decoder dec(vocab);
  std::vector<token_id> history(prompt.begin(), prompt.end());
  std::vector<float> logits;
  const int64_t max_new = std::min<int64_t>(params.max_tokens, n_ctx_ - n_prompt);
  bool cancelled = false;
  auto emit = [&](const std::string& s) {
    if (s.empty() || cancelled) return;
    res.text += s;
    if (on_text && !on_text(s)) cancelled = true;
  };

  if (max_new <= 0) {
    res.finish_reason = finish_reason::length;
    return res;
  }
  auto t0 = std::chrono::steady_clock::now();
  batch_seq b{prompt, 0, block_ids_, false};
  b.n_prompt = n_prompt;
  fwd_.run(std::span<const batch_seq>(&b, 1), kv_, logits);
  res.prompt_ms = ms_since(t0);
  auto t1 = std::chrono::steady_clock::now();
  res.finish_reason = finish_reason::length;
  for (int64_t i = 0; i < max_new; ++i) {
    const token_id next = smp.sample(logits, history);
    res.tokens.push_back(next);
    history.push_back(next);
    if (!params.ignore_eos && vocab.is_eog(next)) {
      res.finish_reason = finish_reason::stop;
      break;
    }
    emit(stops.push(dec.push(next)));
    if (stops.stopped()) {
      res.finish_reason = finish_reason::stop;
      break;
    }
    if (cancelled) {
      res.finish_reason = finish_reason::cancelled;
      break;
    }
    if (i + 1 == max_new) break;
    batch_seq d{std::span<const token_id>(&history.back(), 1), static_cast<int64_t>(history.size()) - 1, block_ids_,
                false};
    d.n_prompt = n_prompt;
    fwd_.run(std::span<const batch_seq>(&d, 1), kv_, logits);
  }
  if (!stops.stopped()) {
    std::string tail = stops.push(dec.flush());  // sequenced: the decoder's bytes come first
    if (!stops.stopped()) tail += stops.flush();
    emit(tail);
  }
  res.decode_ms = ms_since(t1);
  return res;
}

std::vector<float> generator::score(std::span<const token_id> tokens, int64_t chunk) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n > n_ctx_) throw std::invalid_argument("score: sequence longer than the context");
  if (chunk <= 0) throw std::invalid_argument("score: chunk must be positive");
  std::vector<float> all, part;
  for (int64_t p = 0; p < n; p += chunk) {
    const int64_t m = std::min(chunk, n - p);
    batch_seq b{tokens.subspan(p, m), p, block_ids_, true};
    b.n_prompt = n;  // scored as prompt tokens
    fwd_.run(std::span<const batch_seq>(&b, 1), kv_, part);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

}  // namespace sy
