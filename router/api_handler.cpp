#include "router/api_handler.hpp"

#include <chrono>
#include <cstdio>
#include <random>

namespace sy::router {
namespace {

int64_t unix_s_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

api_error error_of(int status, std::string type, std::string code, std::string message, std::string param = "") {
  api_error e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

// A client's X-Request-Id when it is short printable ASCII, else a fresh one.
std::string request_id_for(const http_request& req) {
  const std::string_view given = req.header("x-request-id");
  bool ok = !given.empty() && given.size() <= 128;
  for (const char c : given) ok &= c > 0x20 && c < 0x7f;
  if (ok) return std::string(given);
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char b[40];
  std::snprintf(b, sizeof b, "req-%016llx", static_cast<unsigned long long>(rng()));
  return b;
}

std::string bearer_key(const http_request& req) {
  std::string_view h = req.header("authorization");
  if (h.size() > 7 && (h.substr(0, 7) == "Bearer " || h.substr(0, 7) == "bearer ")) return std::string(h.substr(7));
  return std::string(req.header("x-api-key"));
}

}  // namespace

api_handler::api_handler(api_config cfg, const tenant_registry& tenants, model_registry& models,
                         std::function<void(std::shared_ptr<routed_request>)> submit,
                         std::function<void(uint64_t)> client_gone, std::shared_ptr<router_status> status,
                         const http_counters* http)
    : cfg_(std::move(cfg)),
      tenants_(tenants),
      models_(models),
      submit_(std::move(submit)),
      client_gone_(std::move(client_gone)),
      status_(std::move(status)),
      http_(http) {}

void api_handler::reject(http_exchange& ex, const api_error& e, const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lk(status_->mu);
    status_->edge_errors[std::to_string(e.status) + (e.code.empty() ? "" : ":" + e.code)]++;
  }
  http_response r;
  r.status = e.status;
  r.body = format_error(e);
  r.headers.emplace_back("X-Request-Id", request_id);
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  ex.respond(std::move(r));
}

void api_handler::operator()(std::shared_ptr<http_exchange> ex, http_request&& req) {
  const std::string request_id = request_id_for(req);
  const std::string& path = req.path;
  if (path == "/health") {
    ex->respond({200, "application/json", {}, "{\"status\":\"ok\"}"});
    return;
  }
  if (path == "/ready") {
    bool ready;
    {
      std::lock_guard<std::mutex> lk(status_->mu);
      ready = status_->ready;
    }
    ex->respond({ready ? 200 : 503,
                 "application/json",
                 {},
                 ready ? "{\"status\":\"ready\"}" : "{\"status\":\"not ready: no worker is up, or draining\"}"});
    return;
  }
  if (path == "/metrics") {
    ex->respond({200, "text/plain; version=0.0.4", {}, metrics()});
    return;
  }
  const bool is_completions = path == "/v1/completions", is_chat = path == "/v1/chat/completions",
             is_models = path == "/v1/models";
  if (!is_completions && !is_chat && !is_models) {
    reject(*ex, error_of(404, "not_found_error", "unknown_url", "no route for " + req.method + " " + path), request_id);
    return;
  }
  const bool want_post = !is_models;
  if (req.method != (want_post ? "POST" : "GET")) {
    reject(*ex,
           error_of(405, "invalid_request_error", "method_not_allowed",
                    path + " takes " + (want_post ? "POST" : "GET") + ", not " + req.method),
           request_id);
    return;
  }
  const std::string key = bearer_key(req);
  const tenant* who = tenants_.authenticate(key);
  if (!who) {
    reject(*ex,
           error_of(401, "authentication_error", key.empty() ? "missing_api_key" : "invalid_api_key",
                    key.empty() ? "no API key: send Authorization: Bearer <key>" : "the API key is not valid"),
           request_id);
    return;
  }
  if (is_models) {
    std::vector<model_card> cards;
    for (const auto& m : models_.all()) cards.push_back({m->id, m->created, m->context_length});
    ex->respond({200, "application/json", {{"X-Request-Id", request_id}}, format_models(cards)});
    return;
  }
  generation(is_chat ? endpoint::chat_completions : endpoint::completions, *who, std::move(ex), req, request_id);
}

void api_handler::generation(endpoint kind, const tenant& who, std::shared_ptr<http_exchange> ex, http_request& req,
                             const std::string& request_id) {
  auto parsed = parse_generation_request(kind, req.body, cfg_.limits);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    reject(*ex, *e, request_id);
    return;
  }
  auto r = std::make_shared<routed_request>();
  r->req = std::move(std::get<generation_request>(parsed));
  generation_request& g = r->req;
  r->model = models_.find(g.model);
  if (!r->model) {
    if (models_.all().empty()) {
      reject(*ex, error_of(503, "overloaded_error", "no_workers", "no worker has connected yet; retry shortly"),
             request_id);
    } else {
      reject(*ex,
             error_of(404, "not_found_error", "model_not_found", "the model '" + g.model + "' does not exist", "model"),
             request_id);
    }
    return;
  }
  const model_entry& m = *r->model;
  const char* prompt_param = kind == endpoint::chat_completions ? "messages" : "prompt";
  try {
    if (kind == endpoint::chat_completions) {
      r->prompt = m.tok.encode(m.tmpl.apply(g.messages, /*add_generation_prompt=*/true), true, true);
    } else if (g.prompt_is_tokens) {
      for (const int32_t t : g.prompt_tokens) {
        if (t < 0 || static_cast<size_t>(t) >= m.tok.vocab_size()) {
          reject(*ex,
                 bad_request("prompt", "token id " + std::to_string(t) + " is outside the vocabulary of " +
                                           std::to_string(m.tok.vocab_size())),
                 request_id);
          return;
        }
      }
      r->prompt = g.prompt_tokens;
      if (g.echo) r->echo_text = m.tok.decode(r->prompt);
    } else {
      r->prompt = m.tok.encode(g.prompt_text, true, true);
      if (g.echo) r->echo_text = g.prompt_text;
    }
  } catch (const std::exception& e) {
    reject(*ex, bad_request(prompt_param, std::string("cannot tokenize: ") + e.what()), request_id);
    return;
  }
  const size_t ctx = m.context_length, n_prompt = r->prompt.size();
  if (n_prompt == 0) {
    reject(*ex, bad_request(prompt_param, "the prompt is empty"), request_id);
    return;
  }
  if (n_prompt >= ctx || (g.max_tokens_given && n_prompt + static_cast<size_t>(g.sampling.max_tokens) > ctx)) {
    reject(*ex,
           bad_request(
               prompt_param,
               "this model's maximum context length is " + std::to_string(ctx) + " tokens; the request has " +
                   std::to_string(n_prompt) + " prompt tokens" +
                   (g.max_tokens_given ? " and asks for " + std::to_string(g.sampling.max_tokens) + " completion tokens"
                                       : ""),
               "context_length_exceeded"),
           request_id);
    return;
  }
  if (!g.max_tokens_given) g.sampling.max_tokens = static_cast<int32_t>(ctx - n_prompt);
  r->priority = g.priority.value_or(who.limits.default_priority);
  r->who = &who;
  r->id = next_id_.fetch_add(1);
  r->request_id = request_id;
  r->meta.id = (kind == endpoint::chat_completions ? "chatcmpl-" : "cmpl-") + request_id;
  r->meta.model = m.id;
  r->meta.created = unix_s_now();
  r->meta.kind = kind;
  r->meta.want_logprobs = g.want_logprobs;
  r->timeout_s = g.timeout_s.value_or(cfg_.default_timeout_s);
  r->t_received = req.received;
  r->t_parsed = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lk(status_->mu);
    status_->parse_s.observe(std::chrono::duration<double>(r->t_parsed - r->t_received).count());
  }
  r->ex = ex;
  ex->on_disconnect([gone = client_gone_, id = r->id] { gone(id); });
  submit_(std::move(r));
}

std::string api_handler::metrics() const {
  std::string out;
  {
    std::lock_guard<std::mutex> lk(status_->mu);
    out = status_->dispatcher_metrics;
    status_->write_overhead_s.render(out, "switchyard_router_write_overhead_seconds",
                                     "Router time from a token frame received to its bytes written to the client.");
    status_->parse_s.render(out, "switchyard_router_parse_seconds",
                            "Request read to validated and tokenized (HTTP thread).");
    out += "# HELP switchyard_router_edge_errors_total Requests refused by validation or auth, by status:code.\n";
    out += "# TYPE switchyard_router_edge_errors_total counter\n";
    for (const auto& [k, n] : status_->edge_errors)
      out += "switchyard_router_edge_errors_total{error=\"" + k + "\"} " + std::to_string(n) + "\n";
  }
  if (http_) {
    metric(out, "switchyard_router_http_connections_open", "gauge", "Open client connections.",
           static_cast<double>(http_->connections_open.load()));
    metric(out, "switchyard_router_http_connections_total", "counter", "Client connections accepted.",
           static_cast<double>(http_->connections_accepted.load()));
    metric(out, "switchyard_router_http_connections_refused_total", "counter",
           "Connections closed at once because the server was at its connection limit.",
           static_cast<double>(http_->connections_refused.load()));
    metric(out, "switchyard_router_http_requests_total", "counter", "HTTP requests read.",
           static_cast<double>(http_->requests.load()));
    metric(out, "switchyard_router_http_bad_requests_total", "counter", "Unparsable HTTP, oversized headers or bodies.",
           static_cast<double>(http_->bad_requests.load()));
    metric(out, "switchyard_router_http_timeouts_total", "counter", "Connections cut by header/body/idle deadlines.",
           static_cast<double>(http_->timeouts.load()));
    metric(out, "switchyard_router_http_client_disconnects_total", "counter",
           "Clients that went away before their response ended.",
           static_cast<double>(http_->client_disconnects.load()));
  }
  return out;
}

}  // namespace sy::router
