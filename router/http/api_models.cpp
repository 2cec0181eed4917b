// The routes that tell clients about the models without generating (api_handler.hpp lists
// them): served names, the Hugging Face tokenizer files, and the tokenizer itself. All answer on
// the HTTP thread from the model registry; nothing here reaches a worker.
#include <cctype>

#include "router/http/api_handler.hpp"

namespace sy::router {
namespace {

constexpr std::string_view k_models_prefix = "/v1/models/";
constexpr std::string_view k_tokenizer_infix = "/tokenizer/";

// A path segment's %XX escapes decoded ('+' stays '+': it means a space only in queries). The
// openai SDK sends a model id's '/' as %2F.
std::string percent_decoded(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

void respond_json(http_exchange& ex, const std::string& request_id, std::string body) {
  ex.respond({200, "application/json", {{"X-Request-Id", request_id}}, std::move(body)});
}

}  // namespace

std::shared_ptr<const model_entry> api_handler::model_or_reject(const std::string& name, http_exchange& ex,
                                                                const std::string& request_id) {
  if (!name.empty()) {
    if (auto m = models_.find(name)) return m;
  } else if (const auto all = models_.all(); all.size() == 1) {
    return all.front();
  }
  const size_t n_models = models_.all().size();
  if (n_models == 0) {
    api_error e = not_found("no_workers", "no worker has connected yet; retry shortly");
    e.status = 503;
    e.type = "overloaded_error";
    reject(ex, e, request_id);
  } else if (name.empty()) {
    reject(ex,
           bad_request("model", "'model' is required: this cluster serves " + std::to_string(n_models) + " models",
                       "missing_required_parameter"),
           request_id);
  } else {
    reject(ex, not_found("model_not_found", "the model '" + name + "' does not exist", "model"), request_id);
  }
  return nullptr;
}

std::shared_ptr<const hf_tokenizer_files> api_handler::hf_files(const model_entry& m) {
  {
    std::lock_guard<std::mutex> lk(hf_mu_);
    if (auto it = hf_files_.find(m.id); it != hf_files_.end()) return it->second;
  }
  // Built outside the lock (tens of ms for a large vocabulary): two first requests at once
  // build twice and keep the first.
  auto built =
      std::make_shared<const hf_tokenizer_files>(make_hf_tokenizer_files(m.spec, m.tok, m.tmpl, m.context_length));
  std::lock_guard<std::mutex> lk(hf_mu_);
  return hf_files_.emplace(m.id, std::move(built)).first->second;
}

void api_handler::models_route(http_exchange& ex, const http_request& req, const std::string& request_id) {
  if (req.path.size() <= k_models_prefix.size()) {  // "/v1/models" (or "/v1/models/")
    std::vector<model_card> cards;
    for (const auto& [name, m] : models_.names()) cards.push_back({name, m->id, m->created, m->context_length});
    respond_json(ex, request_id, format_models(cards));
    return;
  }
  std::string name = percent_decoded(std::string_view(req.path).substr(k_models_prefix.size()));
  std::string file;
  if (const size_t at = name.rfind(k_tokenizer_infix); at != std::string::npos) {
    file = name.substr(at + k_tokenizer_infix.size());
    name.resize(at);
  }
  const auto m = models_.find(name);
  if (!m) {
    reject(ex, not_found("model_not_found", "the model '" + name + "' does not exist", "model"), request_id);
    return;
  }
  if (file.empty()) {
    respond_json(ex, request_id, format_model({name, m->id, m->created, m->context_length}));
    return;
  }
  std::shared_ptr<const hf_tokenizer_files> files;
  try {
    files = hf_files(*m);
  } catch (const std::exception& e) {  // a tokenizer Hugging Face's format cannot express
    reject(ex, not_found("tokenizer_unavailable", std::string("no Hugging Face tokenizer for this model: ") + e.what()),
           request_id);
    return;
  }
  const std::string* body = files->find(file);
  if (!body) {
    reject(
        ex,
        not_found("unknown_file", "no tokenizer file '" + file +
                                      "': there are tokenizer.json, tokenizer_config.json and generation_config.json"),
        request_id);
    return;
  }
  // Immutable while the model is served: clients may keep it (revalidated hourly).
  ex.respond({200, "application/json", {{"X-Request-Id", request_id}, {"Cache-Control", "max-age=3600"}}, *body});
}

void api_handler::tokenizer_route(http_exchange& ex, const http_request& req, const std::string& request_id,
                                  bool detokenize) {
  if (detokenize) {
    auto parsed = parse_detokenize_request(req.body, cfg_.limits);
    if (auto* e = std::get_if<api_error>(&parsed)) {
      reject(ex, *e, request_id);
      return;
    }
    const auto& d = std::get<detokenize_request>(parsed);
    const auto m = model_or_reject(d.model, ex, request_id);
    if (!m) return;
    for (const int32_t t : d.tokens) {
      if (static_cast<size_t>(t) >= m->tok.vocab_size()) {
        reject(ex,
               bad_request("tokens", "token id " + std::to_string(t) + " is outside the vocabulary of " +
                                         std::to_string(m->tok.vocab_size())),
               request_id);
        return;
      }
    }
    // Special tokens as their text, as vLLM's and llama-server's detokenize do.
    respond_json(ex, request_id, format_detokenize(m->tok.decode(d.tokens, /*render_special=*/true)));
    return;
  }
  auto parsed = parse_tokenize_request(req.body, cfg_.limits);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    reject(ex, *e, request_id);
    return;
  }
  const auto& t = std::get<tokenize_request>(parsed);
  const auto m = model_or_reject(t.model, ex, request_id);
  if (!m) return;
  if (t.is_chat && !m->tmpl.supported()) {
    reject(ex,
           bad_request(
               "messages",
               "the chat template of the model '" + m->id + "' cannot be applied (" + m->tmpl.unsupported_reason + ")",
               "chat_template_unsupported"),
           request_id);
    return;
  }
  std::vector<int32_t> ids;
  try {
    // Chats: exactly the ids /v1/chat/completions would send (add_special_tokens does not apply:
    // the template and the model decide BOS).
    ids = t.is_chat ? m->chat_prompt(t.messages, t.add_generation_prompt, {}, t.thinking)
                    : m->tok.encode(t.prompt, {.add_special = t.add_special_tokens});
  } catch (const std::exception& e) {
    reject(ex, bad_request(t.is_chat ? "messages" : "prompt", std::string("cannot tokenize: ") + e.what()), request_id);
    return;
  }
  std::vector<std::string> strs;
  if (t.return_token_strs)
    for (const int32_t id : ids) strs.push_back(m->spec.tokens[static_cast<size_t>(id)]);  // as HF names them
  respond_json(ex, request_id, format_tokenize(ids, m->context_length, strs));
}

}  // namespace sy::router
