#include "worker/llama_model.hpp"

#include <cmath>
#include <stdexcept>

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
    case gguf::tensor_type::q8_0:
      return cpu::weight_type::q8_0;
    default:
      throw std::runtime_error("tensor '" + t.name + "' has type " + gguf::type_name(t.type) +
                               ", which Switchyard cannot load (f32, f16, bf16, q4_0, "
                               "q4_1, q8_0)");
  }
}

std::vector<float> load_vector(const gguf::file& f, const std::string& name, int64_t n) {
  const auto& t = f.tensor(name, {static_cast<uint64_t>(n)});
  std::vector<float> out(static_cast<size_t>(n));
  cpu::dequantize_row(to_weight_type(t), t.data, out.data(), n);
  return out;
}

std::unique_ptr<llama_model> llama_model::load(const std::string& path, cpu::thread_pool& pool) {
  std::unique_ptr<llama_model> m(new llama_model(gguf::file::open(path)));
  const gguf::file& f = m->file_;
  llama_hparams& hp = m->hp_;
  hp.arch = f.get_string("general.architecture");
  if (hp.arch != "llama") throw std::runtime_error(path + ": architecture '" + hp.arch + "' is not supported (llama)");
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
  if (hp.n_head <= 0 || hp.n_embd % hp.n_head != 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0)
    throw std::runtime_error(path + ": inconsistent attention head counts");
  hp.head_dim = hp.n_embd / hp.n_head;
  hp.n_rot = static_cast<int64_t>(f.get_uint_or(a + "rope.dimension_count", hp.head_dim));
  if (hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0 || hp.n_rot > 512)
    throw std::runtime_error(path + ": rope.dimension_count " + std::to_string(hp.n_rot) + " is invalid");

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

  auto lin = [&](const std::string& name, int64_t cols, int64_t rows) {
    const auto& t = f.tensor(name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)});
    m->weight_bytes_ += t.n_bytes;
    cpu::linear l(to_weight_type(t), t.data, rows, cols, pool);
    m->repacked_bytes_ += l.panel_bytes();
    return l;
  };
  const int64_t E = hp.n_embd, KV = hp.kv_dim(), F = hp.n_ff;
  m->layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    llama_layer& L = m->layers_[static_cast<size_t>(i)];
    L.attn_norm = load_vector(f, p + "attn_norm.weight", E);
    L.ffn_norm = load_vector(f, p + "ffn_norm.weight", E);
    L.wq = lin(p + "attn_q.weight", E, E);
    L.wk = lin(p + "attn_k.weight", E, KV);
    L.wv = lin(p + "attn_v.weight", E, KV);
    L.wo = lin(p + "attn_output.weight", E, E);
    L.w_gate = lin(p + "ffn_gate.weight", E, F);
    L.w_up = lin(p + "ffn_up.weight", E, F);
    L.w_down = lin(p + "ffn_down.weight", F, E);
  }
  m->output_norm_ = load_vector(f, "output_norm.weight", E);
  // Tied embeddings: without output.weight the embedding matrix is the output head.
  m->output_ = lin(f.find_tensor("output.weight") ? "output.weight" : "token_embd.weight", E, hp.n_vocab);
  return m;
}

void llama_model::embed(token_id id, float* out) const {
  cpu::dequantize_row(embd_type_, embd_data_ + static_cast<size_t>(id) * embd_row_bytes_, out, hp_.n_embd);
}

}  // namespace sy
