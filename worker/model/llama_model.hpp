// A decoder-only transformer loaded from GGUF (the Llama family and its relatives: Qwen2/3,
// Gemma 3): hyperparameters, tokenizer, chat template and the weights, wrapped for the CPU
// kernels. Immutable after load; shared by every sequence. What each architecture changes is in
// llama_hparams (docs/worker.md, "Model families").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf.hpp"
#include "common/tokenizer/chat_template.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "kernels/cpu/huge_pages.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"

namespace sy::cpu {
class thread_pool;
}

namespace sy {

// Architectures (GGUF general.architecture) this runtime implements: "llama" (Llama 2/3.x,
// Mistral, SmolLM2), "qwen2" (Q/K/V biases, neox RoPE), "qwen3" (per-head Q/K norms, neox RoPE)
// "gemma3" (GELU feed-forward, norms after attention and FFN, Q/K norms, sliding-window layers
// with their own RoPE base, embeddings scaled by sqrt(n_embd)) and "phi3" (Phi-3/3.5 and Phi-4
// mini: fused QKV and gate/up matrices, LongRoPE).
inline constexpr const char* k_supported_architectures = "llama, qwen2, qwen3, gemma3, phi3";

enum class ffn_activation : uint8_t { silu, gelu_tanh };

struct llama_hparams {
  std::string arch;  // general.architecture
  std::string name;  // general.name
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // attention.key_length, else n_embd / n_head (Q is n_head * head_dim wide)
  int64_t n_rot = 0;     // rotated dims per head
  float rope_base = 10000.f;
  float rope_freq_scale = 1.f;           // 1 / rope.scaling.factor (linear scaling), else 1
  bool rope_neox = false;                // qwen2: rotate (i, i + n_rot/2)
  std::vector<float> rope_freq_factors;  // rope_freqs.weight (Llama 3.1+ scaling), n_rot / 2 or empty
  // Phi-3 LongRoPE: rope_factors_short (in rope_freq_factors) and rope_factors_long divisors; the
  // long ones apply when the served context exceeds n_ctx_orig (rope.scaling.original_context_length),
  // as llama.cpp chooses them by its context size. cos and sin are scaled by rope_attn_factor.
  std::vector<float> rope_freq_factors_long;
  int64_t n_ctx_orig = 0;
  float rope_attn_factor = 1.f;
  bool qkv_bias = false;    // qwen2: attn_{q,k,v}.bias
  bool qk_norm = false;     // qwen3, gemma3: RMSNorm of every Q and K head before RoPE
  bool post_norms = false;  // gemma3: attention and FFN outputs normed before the residual
  ffn_activation act = ffn_activation::silu;
  float embd_scale = 1.f;  // gemma3: embeddings times sqrt(n_embd)
  float attn_scale = 0.f;  // the scores' scale, 1 / sqrt(head_dim) (set at load)
  float rms_eps = 1e-5f;
  // Sliding-window layers (gemma3: 5 of every 6): a token attends to itself and the window - 1
  // tokens before it; such layers turn RoPE with their own base and scale.
  int64_t sliding_window = 0;  // 0: every layer attends to the whole context
  float rope_base_swa = 10000.f;
  float rope_freq_scale_swa = 1.f;
  float final_logit_softcap = 0.f;  // gemma3 where the file gives one: logits cap * tanh(logit / cap)

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
};

// The kernel weight type of a GGUF tensor; throws std::runtime_error naming the tensor for a
// type the backends cannot load.
cpu::weight_type to_weight_type(const gguf::tensor_info& t);

struct llama_layer {
  std::vector<float> attn_norm, ffn_norm;            // f32 copies of the norm weights
  std::vector<float> bq, bk, bv;                     // f32 Q/K/V biases (qkv_bias), else empty
  std::vector<float> q_norm, k_norm;                 // head_dim each (qk_norm), else empty
  std::vector<float> post_attn_norm, post_ffn_norm;  // n_embd each (post_norms), else empty
  bool windowed = false;                             // a sliding-window layer (hparams().sliding_window)
  cpu::linear wq, wk, wv, wo, w_gate, w_up, w_down;
};

class llama_model {
 public:
  // Throws (gguf::error or std::runtime_error naming the tensor/key) on anything unusable.
  static std::unique_ptr<llama_model> load(const std::string& path, cpu::thread_pool& pool);

  const llama_hparams& hparams() const { return hp_; }
  const tokenizer& vocab() const { return *tok_; }
  const chat_template& chat() const { return chat_; }
  const gguf::file& file() const { return file_; }
  const std::vector<llama_layer>& layers() const { return layers_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const cpu::linear& output() const { return output_; }
  // Embedding row of `id` as f32 (n_embd values).
  void embed(token_id id, float* out) const;
  // The RoPE settings of this model's layers (cpu/ops.hpp), pointing into hparams(): those of
  // the sliding-window layers when `windowed`; LongRoPE's long factors when the served context
  // `n_ctx` exceeds hparams().n_ctx_orig.
  cpu::rope_config rope(bool windowed, int64_t n_ctx) const;
  // Bytes of the matrices as stored in the file, and of the repacked copies held besides.
  size_t weight_bytes() const { return weight_bytes_; }
  size_t repacked_bytes() const { return repacked_bytes_; }
  // Every layer's prompt GEMM panels kept resident (cpu::linear::keep_prompt_panels; not the
  // output head, whose rows always take the integer kernel). Returns the bytes they hold.
  size_t keep_prompt_panels(cpu::thread_pool& pool);
  // Every layer's prompt tokens on the integer kernel where it has integer panels
  // (cpu::linear::use_integer_prompts). Returns how many layers moved there.
  int use_integer_prompts();
  size_t prompt_panel_bytes() const { return prompt_panel_bytes_; }
  // "q4_K x 98, q6_K x 13, f32 x 33": the file's tensor types, for logs.
  std::string type_summary() const;

 private:
  explicit llama_model(gguf::file f) : file_(std::move(f)) {}

  gguf::file file_;
  llama_hparams hp_;
  std::unique_ptr<tokenizer> tok_;
  chat_template chat_;
  cpu::weight_type embd_type_ = cpu::weight_type::f32;
  const uint8_t* embd_data_ = nullptr;
  size_t embd_row_bytes_ = 0;
  // One huge-page arena for every matrix's own copy (cpu::linear::arena_bytes each), or null.
  cpu::huge_buffer weights_;
  std::vector<llama_layer> layers_;
  std::vector<float> output_norm_;
  cpu::linear output_;
  size_t weight_bytes_ = 0;
  size_t repacked_bytes_ = 0;
  size_t prompt_panel_bytes_ = 0;
};

}  // namespace sy
