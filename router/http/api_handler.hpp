// The router's HTTP routes (docs/router.md, "A request's path" and "Routes"): authentication,
// validation into native structs, tokenization and the context check — the stateless part of a
// request's path, run on an HTTP I/O thread. Stateful steps (admission, queueing, dispatch) are
// the dispatcher's; a validated request is handed over through `submit`. The routes are the
// table in api_handler::routes() (router/http/api_routes.hpp): health, ready, metrics, version, the
// dashboard, models and their tokenizer files, tokenize and detokenize, completions, chat, the
// Anthropic messages and count_tokens, embeddings, and the Responses API with its stored responses.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/metrics.hpp"
#include "common/tokenizer/hf_tokenizer.hpp"
#include "router/dispatch/admission.hpp"
#include "router/dispatch/cache_service.hpp"
#include "router/dispatch/routed_request.hpp"
#include "router/dispatch/router_status.hpp"
#include "router/dispatch/tenants.hpp"
#include "router/fleet/model_registry.hpp"
#include "router/http/api_routes.hpp"
#include "router/http/http_server.hpp"
#include "router/http/responses_store.hpp"
#include "router/http/work_pool.hpp"
#include "router/openai/openai_request.hpp"
#include "router/openai/openai_response.hpp"
#include "router/openai/responses_api.hpp"

namespace sy::router {

// The value of `name` in a request target's query string ("" when absent); %XX and + decoded.
std::string query_param(std::string_view target, std::string_view name);

struct api_config {
  api_limits limits;
  double default_timeout_s = 600;  // deadline for requests that give no "timeout"
  double max_timeout_s = 3600;     // a client's "timeout" is clamped to this (the worker slot it holds)
  reasoning_parser reasoning = reasoning_parser::automatic;  // --reasoning-parser
  std::chrono::seconds responses_ttl{86400};                 // --responses-ttl-s: stored responses
  trace_policy tracing;                                      // --otlp-endpoint, --otlp-sample-ratio
  otlp_exporter* tracer = nullptr;  // where the spans of requests answered here go (null: tracing off)
};

class api_handler {
 public:
  api_handler(api_config cfg, const tenant_registry& tenants, model_registry& models,
              std::function<void(std::shared_ptr<routed_request>)> submit, std::function<void(uint64_t)> client_gone,
              std::shared_ptr<router_status> status, const http_counters* http, cache_service* cache = nullptr);

  void operator()(std::shared_ptr<http_exchange> ex, http_request&& req);
  // http_server_config::on_header: the checks that need no body — the API key, and a tenant
  // whose requests/s bucket is empty (429) — so that a refused request costs no body read,
  // JSON parse or tokenization (docs/reliability.md, "Clients": work before admission). The full
  // handler checks the key again; the dispatcher stays the authority on admission.
  std::optional<http_response> precheck(const http_request& head);
  // The dispatcher's admission controller, whose requests/s buckets precheck() charges
  // (admission_controller::take_rate is thread-safe). Set once before requests arrive; without
  // it the dispatcher charges them at admission, after the body was read and tokenized.
  void set_rate_charger(admission_controller* a) { rate_charger_ = a; }
  // Where the CPU work of a request body runs (parse, template, tokenize; generations,
  // /tokenize and /detokenize): off the I/O threads, which keep writing streams meanwhile. A
  // body the pool has no room for is refused with 503 `router_busy` and Retry-After. Set once
  // before requests arrive; without it that work runs on the I/O thread.
  void set_prep_pool(work_pool* p) { prep_ = p; }
  // The separate metrics listener (--metrics-port): the routes of metrics_routes(), 404 for
  // anything else.
  void metrics_listener(std::shared_ptr<http_exchange> ex, http_request&& req);
  // The route table (router/http/api_routes.hpp): one line per route.
  static std::span<const route> routes();
  // The metrics listener's table: GET /metrics without a key (the port is for the cluster's
  // scraper, kept off the API's network path) and GET /health (liveness that a flood of clients
  // on the API port cannot fail); every route open.
  static std::span<const route> metrics_routes();

 private:
  // GET /health (liveness) and GET /metrics: lines of both route tables.
  static void health_route(api_handler& a, route_call& c);
  static void metrics_route(api_handler& a, route_call& c);
  // GET /ready: 200 when some worker is ready and the router is not shutting down.
  void ready(http_exchange& ex);
  // GET /dashboard/chart.js: the dashboard's chart library.
  void chart_js(route_call& c);
  // POST /v1/completions, /v1/chat/completions, /v1/messages: parsed in the route's API family
  // (Anthropic's: router/openai/anthropic_api.hpp, answered in that API's shapes), then run_generation.
  void generation(endpoint kind, const route_call& c);
  // Which API's shapes a generation is answered in.
  enum class api_shape : uint8_t { openai, anthropic, responses };
  // A parsed generation's path from the model lookup on: the chat template, tokenization, the
  // context check, its meta, then the cache or the dispatcher. `rr` and `history`: a Responses
  // API request and the stored conversation it continues.
  void run_generation(endpoint kind, const tenant& who, std::shared_ptr<http_exchange> ex, const http_request& req,
                      const std::string& request_id, generation_request parsed, api_shape shape,
                      const responses_request* rr = nullptr, const std::string& history = {});
  // POST /v1/responses (router/openai/responses_api.hpp): parsed; with previous_response_id, its stored
  // conversation fetched first (router/http/responses_store.hpp); then a generation.
  void responses(const tenant& who, std::shared_ptr<http_exchange> ex, std::shared_ptr<http_request> req,
                 const std::string& request_id);
  // GET / DELETE /v1/responses/{id}: the tenant's stored response.
  void stored_response_route(const tenant& who, std::shared_ptr<http_exchange> ex, const http_request& req,
                             const std::string& request_id);
  // How a finished response is stored before it is answered (responses_exchange); empty
  // without a store or when the request said store: false.
  std::function<void(std::string, std::function<void()>)> save_response(const tenant& who, const response_meta& meta);
  // POST /v1/messages/count_tokens: the prompt /v1/messages would send, counted.
  void count_tokens(http_exchange& ex, const http_request& req, const std::string& request_id);
  // POST /v1/embeddings: parsed (router/openai/embeddings_api.hpp), tokenized, checked against the
  // context, then submitted like a generation (admission, tenancy, queues).
  void embeddings(const tenant& who, std::shared_ptr<http_exchange> ex, http_request& req,
                  const std::string& request_id);
  // A parsed request's last step before submission: its receive and parse times (the parse-time
  // histogram), its exchange, and its cancellation when the client goes away.
  void attach(routed_request& r, const std::shared_ptr<http_exchange>& ex, const http_request& req);
  // Runs `work` on the prep pool (or here without one); a full pool answers 503 router_busy
  // (traced as a refusal of `traced`, a generation route's request, by `who`, when given).
  void prepare(const std::shared_ptr<http_exchange>& ex, size_t bytes, const std::string& request_id,
               std::function<void()> work, api_family family = api_family::openai, const http_request* traced = nullptr,
               const tenant* who = nullptr);
  void prepare(const route_call& c, std::function<void()> work);  // c's body, in c's family
  // The error through router/openai/api_errors.hpp's responder, counted as an edge error.
  void reject(http_exchange& ex, const api_error& e, const std::string& request_id,
              api_family family = api_family::openai);
  // A generation route's refusal before admission: reject()'s answer, and its server span when
  // traced (docs/router.md, "Tracing"). `who`, `model`: as far as they are known.
  void refuse(http_exchange& ex, const http_request& req, const api_error& e, const std::string& request_id,
              api_family family, const tenant* who, const std::string& model = {});
  // The server span of a generation route's request refused with `e` (nothing when untraced).
  void trace_refusal(const http_request& req, const api_error& e, const tenant* who, const std::string& model);
  // `count`: as an edge error (switchyard_router_edge_errors_total).
  http_response edge_error(const api_error& e, const std::string& request_id, api_family family, bool count = true);
  std::string metrics() const;
  // POST /dashboard/login: an admin key from the form sets the session cookie (303 to
  // /dashboard); anything else gets the sign-in page again (401).
  void dashboard_login(http_exchange& ex, const http_request& req, const std::string& request_id);
  // Response cache: look up (a hit is answered from the cache thread), else submit.
  void submit_or_lookup(std::shared_ptr<routed_request> r, const http_request& req);
  void cache_stats(std::shared_ptr<http_exchange> ex, const http_request& req, const std::string& request_id);
  // router/http/api_models.cpp: what clients learn about the models, without generating.
  void models_route(http_exchange& ex, const http_request& req, const std::string& request_id);
  void tokenizer_route(http_exchange& ex, const http_request& req, const std::string& request_id, bool detokenize);
  // The model `name` names; "" names the only model served. nullptr once `ex` got the error.
  std::shared_ptr<const model_entry> model_or_reject(const std::string& name, http_exchange& ex,
                                                     const std::string& request_id);
  // Built from the model's tokenizer spec on first use, then shared.
  std::shared_ptr<const hf_tokenizer_files> hf_files(const model_entry& m);

  api_config cfg_;
  const tenant_registry& tenants_;
  model_registry& models_;
  std::function<void(std::shared_ptr<routed_request>)> submit_;
  std::function<void(uint64_t)> client_gone_;
  std::shared_ptr<router_status> status_;
  const http_counters* http_;
  cache_service* cache_;
  std::unique_ptr<responses_store> responses_;  // with the cache's Redis; null without --redis
  admission_controller* rate_charger_ = nullptr;
  work_pool* prep_ = nullptr;
  std::atomic<uint64_t> next_id_{1};
  std::mutex hf_mu_;                                                           // guards hf_files_
  std::map<std::string, std::shared_ptr<const hf_tokenizer_files>> hf_files_;  // by model id
};

}  // namespace sy::router
