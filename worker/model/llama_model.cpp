#include "worker/model/llama_model.hpp"

#include <cmath>
#include <map>
#include <stdexcept>

#include "kernels/cpu/huge_pages.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace sy {
cpu::weight_type to_weight_type(const gguf::tensor_info& t) {
  switch (t.type) {
    case gguf::tensor_type::f32:
      return cpu::weight_type::f32;
    case gguf::tensor_type::f16:
      return cpu::weight_type::f16;
    case gguf::tensor_type::bf16:
      return cpu::weight_type::bf16;
    case gguf::tensor_type::q4_0:
      return cpu::weight_type::q4_0;
    case gguf::tensor_type::q4_1:
      return cpu::weight_type::q4_1;
    case gguf::tensor_type::q5_0:
      return cpu::weight_type::q5_0;
    case gguf::tensor_type::q5_1:
      return cpu::weight_type::q5_1;
    case gguf::tensor_type::q8_0:
      return cpu::weight_type::q8_0;
    case gguf::tensor_type::q4_k:
      return cpu::weight_type::q4_k;
    case gguf::tensor_type::q5_k:
      return cpu::weight_type::q5_k;
    case gguf::tensor_type::q6_k:
      return cpu::weight_type::q6_k;
    default:
      throw std::runtime_error("tensor '" + t.name + "' has type " + gguf::type_name(t.type) +
                               ", which Switchyard cannot load (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, "
                               "q8_0, q4_K, q5_K, q6_K)");
  }
}

std::vector<float> load_vector(const gguf::file& f, const std::string& name, int64_t n) {
  const auto& t = f.tensor(name, {static_cast<uint64_t>(n)});
  std::vector<float> out(static_cast<size_t>(n));
  cpu::dequantize_row(to_weight_type(t), t.data, out.data(), n);
  return out;
}

namespace {

// Which layers slide, as llama.cpp reads `key`: absent, every 6th layer (l % 6 == 5) is global;
// an integer n, layer l slides when n is 0 or l % n < n - 1; an array of booleans, one per layer.
std::vector<bool> sliding_window_layers(const gguf::file& f, const std::string& key, int64_t n_layer,
                                        const std::string& path) {
  std::vector<bool> out(static_cast<size_t>(n_layer));
  const gguf::value* v = f.find(key);
  if (v && v->type == gguf::value_type::array) {
    if (v->elem_type != gguf::value_type::boolean || static_cast<int64_t>(v->items.size()) != n_layer)
      throw std::runtime_error(path + ": " + key + " must hold one boolean per layer");
    for (size_t l = 0; l < out.size(); ++l) out[l] = v->items[l].u != 0;
    return out;
  }
  const uint64_t n = v ? v->as_uint() : 6;
  for (size_t l = 0; l < out.size(); ++l) out[l] = n == 0 || l % n < n - 1;
  return out;
}

}  // namespace

std::unique_ptr<llama_model> llama_model::load(const std::string& path, cpu::thread_pool& pool) {
  std::unique_ptr<llama_model> m(new llama_model(gguf::file::open(path)));
  const gguf::file& f = m->file_;
  llama_hparams& hp = m->hp_;
  hp.arch = f.get_string("general.architecture");
  const bool gemma3 = hp.arch == "gemma3", qwen3 = hp.arch == "qwen3", phi3 = hp.arch == "phi3";
  if (hp.arch != "llama" && hp.arch != "qwen2" && !qwen3 && !gemma3 && !phi3)
    throw std::runtime_error(path + ": architecture '" + hp.arch +
                             "' is not supported (supported: " + k_supported_architectures + ")");
  const std::string a = hp.arch + ".";
  if (const auto* v = f.find("general.name"); v && v->type == gguf::value_type::string) hp.name = std::string(v->str);
  hp.n_ctx_train = static_cast<int64_t>(f.get_uint(a + "context_length"));
  hp.n_embd = static_cast<int64_t>(f.get_uint(a + "embedding_length"));
  hp.n_ff = static_cast<int64_t>(f.get_uint(a + "feed_forward_length"));
  hp.n_layer = static_cast<int64_t>(f.get_uint(a + "block_count"));
  hp.n_head = static_cast<int64_t>(f.get_uint(a + "attention.head_count"));
  hp.n_head_kv = static_cast<int64_t>(f.get_uint_or(a + "attention.head_count_kv", hp.n_head));
  hp.rope_base = static_cast<float>(f.get_float_or(a + "rope.freq_base", 10000.0));
  hp.rms_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon"));
  if (hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0)
    throw std::runtime_error(path + ": inconsistent attention head counts");
  // The head width: attention.key_length where given (Gemma 3 and Qwen3 heads are wider than
  // n_embd / n_head), else n_embd / n_head. Values must be as wide as keys.
  if (f.find(a + "attention.key_length")) {
    hp.head_dim = static_cast<int64_t>(f.get_uint(a + "attention.key_length"));
  } else {
    if (hp.n_embd % hp.n_head != 0) throw std::runtime_error(path + ": inconsistent attention head counts");
    hp.head_dim = hp.n_embd / hp.n_head;
  }
  if (hp.head_dim <= 0 || hp.head_dim > 512)
    throw std::runtime_error(path + ": head width " + std::to_string(hp.head_dim) + " is invalid");
  if (f.find(a + "attention.value_length") &&
      static_cast<int64_t>(f.get_uint(a + "attention.value_length")) != hp.head_dim)
    throw std::runtime_error(
        path + ": " + a + "attention.value_length = " + std::to_string(f.get_uint(a + "attention.value_length")) +
        " differs from key_length " + std::to_string(hp.head_dim) + ", which Switchyard does not support");
  hp.n_rot = static_cast<int64_t>(f.get_uint_or(a + "rope.dimension_count", hp.head_dim));
  if (hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0 || hp.n_rot > 512 || hp.n_rot <= 0)
    throw std::runtime_error(path + ": rope.dimension_count " + std::to_string(hp.n_rot) + " is invalid");
  hp.rope_neox = hp.arch != "llama";
  hp.qkv_bias = hp.arch == "qwen2";
  hp.qk_norm = qwen3 || gemma3;
  hp.attn_scale = 1.f / std::sqrt(static_cast<float>(hp.head_dim));
  std::vector<bool> windowed_layers;  // gemma3: per layer, whether it is a sliding-window one
  if (gemma3) {
    // As llama.cpp runs Gemma 3: GELU (tanh form), norms after attention and FFN, embeddings
    // times sqrt(n_embd); with attention.sliding_window (a file without it, or with 0, has
    // global layers only), sliding-window layers are 5 of every 6 (layer l is global when
    // l % 6 == 5) unless attention.sliding_window_pattern says otherwise, with RoPE base 10k
    // (rope.freq_base_swa where given) unscaled; the 27B (62 layers) scales scores by
    // 1 / sqrt(n_embd / n_head) instead of 1 / sqrt(head_dim); logits are soft-capped
    // (cap * tanh(logit / cap)) where the file gives final_logit_softcapping.
    hp.act = ffn_activation::gelu_tanh;
    hp.post_norms = true;
    hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    hp.sliding_window = static_cast<int64_t>(f.get_uint_or(a + "attention.sliding_window", 0));
    if (hp.sliding_window > 0)
      windowed_layers = sliding_window_layers(f, a + "attention.sliding_window_pattern", hp.n_layer, path);
    hp.rope_base_swa = static_cast<float>(f.get_float_or(a + "rope.freq_base_swa", 10000.0));
    hp.rope_freq_scale_swa = 1.f;
    if (hp.n_layer == 62) hp.attn_scale = 1.f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head));
    hp.final_logit_softcap = static_cast<float>(f.get_float_or(a + "final_logit_softcapping", 0.0));
    if (!(hp.final_logit_softcap >= 0) || !(hp.rope_base_swa > 0))
      throw std::runtime_error(path + ": " + a + "final_logit_softcapping or rope.freq_base_swa is invalid");
  }
  // RoPE scaling: linear (positions divided by the factor) is applied; Llama 3.1+ scaling comes as
  // the per-frequency divisors in rope_freqs.weight; YaRN and others are refused by name.
  if (const auto* v = f.find(a + "rope.scaling.type"); v && v->type == gguf::value_type::string) {
    const std::string type(v->str);
    const double factor = f.get_float_or(a + "rope.scaling.factor", 1.0);
    if (type == "linear") {
      if (!(factor > 0)) throw std::runtime_error(path + ": rope.scaling.factor must be positive");
      hp.rope_freq_scale = static_cast<float>(1.0 / factor);
    } else if (type != "none" && !(factor == 1.0 || factor == 0.0)) {
      throw std::runtime_error(path + ": RoPE scaling '" + type + "' is not supported (none, linear, llama3)");
    }
  }
  auto factors = [&](const char* name, std::vector<float>& out) {
    if (const auto* t = f.find_tensor(name)) {
      f.tensor(name, {static_cast<uint64_t>(hp.n_rot / 2)});
      out.resize(static_cast<size_t>(hp.n_rot / 2));
      cpu::dequantize_row(to_weight_type(*t), t->data, out.data(), hp.n_rot / 2);
    }
  };
  factors("rope_freqs.weight", hp.rope_freq_factors);
  if (phi3) {
    // LongRoPE (Phi-3/3.5 128k, Phi-4 mini): short and long divisors, an attention factor on cos
    // and sin; a sliding window in the file is ignored, as llama.cpp does for Phi-3.
    factors("rope_factors_short.weight", hp.rope_freq_factors);
    factors("rope_factors_long.weight", hp.rope_freq_factors_long);
    hp.n_ctx_orig = static_cast<int64_t>(
        f.get_uint_or(a + "rope.scaling.original_context_length", static_cast<uint64_t>(hp.n_ctx_train)));
    hp.rope_attn_factor = static_cast<float>(f.get_float_or(a + "rope.scaling.attn_factor", 1.0));
  }

  m->tok_ = std::make_unique<tokenizer>(tokenizer::from_gguf(f));
  m->chat_ = chat_template::from_gguf(f);

  const gguf::tensor_info* embd = f.find_tensor("token_embd.weight");
  if (!embd) throw std::runtime_error(path + ": missing tensor 'token_embd.weight'");
  if (embd->shape.size() != 2 || embd->shape[0] != static_cast<uint64_t>(hp.n_embd))
    throw std::runtime_error(path + ": token_embd.weight shape mismatch");
  hp.n_vocab = static_cast<int64_t>(embd->shape[1]);
  if (hp.n_vocab != static_cast<int64_t>(m->tok_->vocab_size()))
    throw std::runtime_error(path + ": embedding rows (" + std::to_string(hp.n_vocab) +
                             ") differ from the tokenizer's vocabulary (" + std::to_string(m->tok_->vocab_size()) +
                             ")");
  m->embd_type_ = to_weight_type(*embd);
  m->embd_data_ = embd->data;
  m->embd_row_bytes_ = cpu::row_bytes(m->embd_type_, hp.n_embd);

  const int64_t E = hp.n_embd, Q = hp.q_dim(), KV = hp.kv_dim(), F = hp.n_ff, HD = hp.head_dim;
  // Every matrix in one list, so that all their copies share one huge-page arena (a matrix of its
  // own would round up to 2 MiB: ~170 MiB on the 1B Q4_K_M file).
  // `row0`: a matrix may be rows [row0, row0 + rows) of a fused tensor of `total` rows (Phi-3's
  // attn_qkv and gate/up ffn_up): GGUF rows are contiguous, so each part is the tensor's data
  // from its first row on.
  struct matrix {
    std::string name;
    int64_t cols, rows;
    cpu::linear* dst;
    int64_t row0 = 0, total = 0;
  };
  std::vector<matrix> plan;
  m->layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    llama_layer& L = m->layers_[static_cast<size_t>(i)];
    L.attn_norm = load_vector(f, p + "attn_norm.weight", E);
    L.ffn_norm = load_vector(f, p + "ffn_norm.weight", E);
    if (hp.qk_norm) {
      L.q_norm = load_vector(f, p + "attn_q_norm.weight", HD);
      L.k_norm = load_vector(f, p + "attn_k_norm.weight", HD);
    }
    if (hp.post_norms) {
      L.post_attn_norm = load_vector(f, p + "post_attention_norm.weight", E);
      L.post_ffn_norm = load_vector(f, p + "post_ffw_norm.weight", E);
    }
    L.windowed = !windowed_layers.empty() && windowed_layers[static_cast<size_t>(i)];
    if (hp.qkv_bias) {
      L.bq = load_vector(f, p + "attn_q.bias", Q);
      L.bk = load_vector(f, p + "attn_k.bias", KV);
      L.bv = load_vector(f, p + "attn_v.bias", KV);
    }
    if (f.find_tensor(p + "attn_qkv.weight")) {
      const int64_t total = Q + 2 * KV;
      plan.push_back({p + "attn_qkv.weight", E, Q, &L.wq, 0, total});
      plan.push_back({p + "attn_qkv.weight", E, KV, &L.wk, Q, total});
      plan.push_back({p + "attn_qkv.weight", E, KV, &L.wv, Q + KV, total});
    } else {
      plan.push_back({p + "attn_q.weight", E, Q, &L.wq});
      plan.push_back({p + "attn_k.weight", E, KV, &L.wk});
      plan.push_back({p + "attn_v.weight", E, KV, &L.wv});
    }
    plan.push_back({p + "attn_output.weight", Q, E, &L.wo});
    if (phi3 && !f.find_tensor(p + "ffn_gate.weight")) {  // gate rows first, then up (llama.cpp's swiglu)
      plan.push_back({p + "ffn_up.weight", E, F, &L.w_gate, 0, 2 * F});
      plan.push_back({p + "ffn_up.weight", E, F, &L.w_up, F, 2 * F});
    } else {
      plan.push_back({p + "ffn_gate.weight", E, F, &L.w_gate});
      plan.push_back({p + "ffn_up.weight", E, F, &L.w_up});
    }
    plan.push_back({p + "ffn_down.weight", F, E, &L.w_down});
  }
  m->output_norm_ = load_vector(f, "output_norm.weight", E);
  // Tied embeddings: without output.weight the embedding matrix is the output head.
  plan.push_back({f.find_tensor("output.weight") ? "output.weight" : "token_embd.weight", E, hp.n_vocab, &m->output_});
  auto tensor = [&](const matrix& x) -> const gguf::tensor_info& {
    return f.tensor(x.name, {static_cast<uint64_t>(x.cols), static_cast<uint64_t>(x.total > 0 ? x.total : x.rows)});
  };
  size_t arena = 0;
  for (const matrix& x : plan) arena += cpu::linear::arena_bytes(to_weight_type(tensor(x)), x.rows, x.cols);
  if (arena > 0) m->weights_ = cpu::make_huge_buffer(arena);
  size_t offset = 0;
  for (const matrix& x : plan) {
    const auto& t = tensor(x);
    const cpu::weight_type wt = to_weight_type(t);
    m->weight_bytes_ +=
        x.total > 0 ? t.n_bytes / static_cast<size_t>(x.total) * static_cast<size_t>(x.rows) : t.n_bytes;
    try {
      const uint8_t* data = t.data + static_cast<size_t>(x.row0) * cpu::row_bytes(wt, x.cols);
      *x.dst = cpu::linear(wt, data, x.rows, x.cols, pool, arena > 0 ? m->weights_.get() + offset : nullptr);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(path + ": tensor '" + x.name + "': " + e.what());
    }
    x.dst->release_source_pages();  // t.data is in the model's memory map
    offset += cpu::linear::arena_bytes(wt, x.rows, x.cols);
    m->repacked_bytes_ += x.dst->repacked_bytes();
  }
  return m;
}

size_t llama_model::keep_prompt_panels(cpu::thread_pool& pool) {
  prompt_panel_bytes_ = 0;
  for (llama_layer& L : layers_)
    for (cpu::linear* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      prompt_panel_bytes_ += w->keep_prompt_panels(pool);
  return prompt_panel_bytes_;
}

int llama_model::use_integer_prompts() {
  int moved = 0;
  for (llama_layer& L : layers_)
    for (cpu::linear* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      moved += w->use_integer_prompts();
  return moved;
}

cpu::rope_config llama_model::rope(bool windowed, int64_t n_ctx) const {
  cpu::rope_config c;
  c.n_rot = hp_.n_rot;
  c.base = windowed ? hp_.rope_base_swa : hp_.rope_base;
  c.freq_scale = windowed ? hp_.rope_freq_scale_swa : hp_.rope_freq_scale;
  const bool long_factors = !hp_.rope_freq_factors_long.empty() && n_ctx > hp_.n_ctx_orig;
  const auto& factors = long_factors ? hp_.rope_freq_factors_long : hp_.rope_freq_factors;
  c.freq_factors = factors.empty() ? nullptr : factors.data();
  c.mscale = hp_.rope_attn_factor;
  c.neox = hp_.rope_neox;
  return c;
}

std::string llama_model::type_summary() const {
  std::map<std::string, int> n;
  for (const auto& t : file_.tensors()) ++n[gguf::type_name(t.type)];
  std::string out;
  for (const auto& [name, count] : n) out += (out.empty() ? "" : ", ") + name + " x " + std::to_string(count);
  return out;
}

void llama_model::embed(token_id id, float* out) const {
  cpu::dequantize_row(embd_type_, embd_data_ + static_cast<size_t>(id) * embd_row_bytes_, out, hp_.n_embd);
  if (hp_.embd_scale != 1.f)
    for (int64_t i = 0; i < hp_.n_embd; ++i) out[i] *= hp_.embd_scale;
}

}  // namespace sy
