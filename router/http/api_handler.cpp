#include "router/http/api_handler.hpp"

#include "cache/cache_key.hpp"
#include "router/base/router_clock.hpp"
#include "router/dispatch/cache_replay.hpp"
#include "router/http/dashboard.hpp"
#include "router/openai/anthropic_api.hpp"
#include "router/openai/embeddings_api.hpp"
#include "router/openai/responses_api.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

namespace sy::router {
namespace {

int64_t unix_s_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// 401: no key, or one no tenant has.
api_error unauthenticated(const std::string& key) {
  return make_error(401, "authentication_error", key.empty() ? "missing_api_key" : "invalid_api_key",
                    key.empty() ? "no API key: send Authorization: Bearer <key>" : "the API key is not valid");
}

// An HTML page of the dashboard (never cached).
http_response dashboard_page(int status, std::string html) {
  return {status, "text/html; charset=utf-8", {{"Cache-Control", "no-store"}}, std::move(html)};
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

// Every POST is charged to the tenant's requests/s bucket at its header: generations, and
// /tokenize and /detokenize too (they make the router read, template and tokenize a body).
bool charges_rate(std::string_view method) { return method == "POST"; }

// The most body a route reads before its key is known or its work is admitted: routes that take
// no body get none, the dashboard's sign-in form a key's worth. Others: the server's limit.
constexpr size_t k_no_body = 0, k_login_body = 4096;

// The declared body of `head` past `cap`: a 413 to answer from the header, the body never read.
std::optional<api_error> body_over(const http_request& head, size_t cap) {
  const std::string_view cl = head.header("content-length");
  size_t n = 0;
  if (cl.empty() || std::from_chars(cl.data(), cl.data() + cl.size(), n).ec != std::errc{} || n <= cap)
    return std::nullopt;
  return make_error(413, "invalid_request_error", "body_too_large",
                    "this route takes at most " + std::to_string(cap) + " bytes of body");
}

std::string bearer_key(const http_request& req) {
  std::string_view h = req.header("authorization");
  if (h.size() > 7 && (h.substr(0, 7) == "Bearer " || h.substr(0, 7) == "bearer ")) return std::string(h.substr(7));
  return std::string(req.header("x-api-key"));
}

}  // namespace

std::string query_param(std::string_view target, std::string_view name) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return "";
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      std::string out;
      const std::string_view v = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
      for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] == '+') {
          out += ' ';
        } else if (v[i] == '%' && i + 2 < v.size() && std::isxdigit(static_cast<unsigned char>(v[i + 1])) &&
                   std::isxdigit(static_cast<unsigned char>(v[i + 2]))) {
          out += static_cast<char>(std::stoi(std::string(v.substr(i + 1, 2)), nullptr, 16));
          i += 2;
        } else {
          out += v[i];
        }
      }
      return out;
    }
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return "";
}

api_handler::api_handler(api_config cfg, const tenant_registry& tenants, model_registry& models,
                         std::function<void(std::shared_ptr<routed_request>)> submit,
                         std::function<void(uint64_t)> client_gone, std::shared_ptr<router_status> status,
                         const http_counters* http, cache_service* cache)
    : cfg_(std::move(cfg)),
      tenants_(tenants),
      models_(models),
      submit_(std::move(submit)),
      client_gone_(std::move(client_gone)),
      status_(std::move(status)),
      http_(http),
      cache_(cache),
      responses_(cache ? std::make_unique<responses_store>(*cache, cfg_.responses_ttl) : nullptr) {}

http_response api_handler::edge_error(const api_error& e, const std::string& request_id, api_family family,
                                      bool count) {
  if (count) {
    std::lock_guard<std::mutex> lk(status_->mu);
    status_->edge_errors[std::to_string(e.status) + (e.code.empty() ? "" : ":" + e.code)]++;
  }
  return error_response(e, family, request_id);
}

void api_handler::reject(http_exchange& ex, const api_error& e, const std::string& request_id, api_family family) {
  ex.respond(edge_error(e, request_id, family));
}

void api_handler::refuse(http_exchange& ex, const http_request& req, const api_error& e, const std::string& request_id,
                         api_family family, const tenant* who, const std::string& model) {
  trace_refusal(req, e, who, model);
  reject(ex, e, request_id, family);
}

void api_handler::trace_refusal(const http_request& req, const api_error& e, const tenant* who,
                                const std::string& model) {
  if (cfg_.tracer == nullptr) return;
  const auto t =
      trace_for(req.method + " " + req.path, req.header("traceparent"), req.header("tracestate"), cfg_.tracing);
  if (!t || !t->sampled) return;
  request_outcome o;
  o.status = e.status;
  o.error = e.code.empty() ? e.message : e.code;
  o.model = model;
  o.tenant = who ? who->name : "";
  o.t_end_s = steady_now_s();
  // Refused from its header (precheck), the request was never read: its span starts now.
  o.t_received_s = req.received == std::chrono::steady_clock::time_point{} ? o.t_end_s : steady_seconds(req.received);
  export_request(cfg_.tracer, t, o, o.t_end_s);
}

std::span<const route> api_handler::routes() {
  using h = api_handler;
  using c = route_call;
  using enum route_access;
  constexpr api_family oa = api_family::openai, an = api_family::anthropic;
  constexpr bool gen = true;
  // One line per route: method, path pattern, who may call it, API family, handler (then: a
  // generation, the most body it reads before its key is checked). docs/router.md, "Routes".
  static constexpr route table[] = {
      {"GET", "/health", open, oa, health_route},
      {"GET", "/ready", open, oa, [](h& a, c& r) { a.ready(*r.ex); }},
      {"GET", "/dashboard/login", open, oa, [](h& a, c& r) { a.dashboard_login(*r.ex, *r.req, r.request_id); }},
      {"POST", "/dashboard/login", open, oa, [](h& a, c& r) { a.dashboard_login(*r.ex, *r.req, r.request_id); }, false,
       k_login_body},
      {"GET", "/metrics", admin, oa, metrics_route},
      {"GET", "/version", key, oa,
       [](h&, c& r) {
         r.ex->respond({200, "application/json", {}, format_version()});
       }},
      {"GET", "/dashboard", admin_page, oa, [](h&, c& r) { r.ex->respond(dashboard_page(200, dashboard_html())); }},
      {"GET", "/dashboard/chart.js", key, oa, [](h& a, c& r) { a.chart_js(r); }},
      {"GET", "/v1/cache/stats", admin, oa, [](h& a, c& r) { a.cache_stats(r.ex, *r.req, r.request_id); }},
      {"GET", "/v1/models", key, oa, [](h& a, c& r) { a.models_route(*r.ex, *r.req, r.request_id); }},
      {"GET", "/v1/models/{name*}", key, oa, [](h& a, c& r) { a.models_route(*r.ex, *r.req, r.request_id); }},
      {"POST", "/tokenize", key, oa,
       [](h& a, c& r) { a.prepare(r, [&a, r] { a.tokenizer_route(*r.ex, *r.req, r.request_id, false); }); }},
      {"POST", "/detokenize", key, oa,
       [](h& a, c& r) { a.prepare(r, [&a, r] { a.tokenizer_route(*r.ex, *r.req, r.request_id, true); }); }},
      {"POST", "/v1/completions", key, oa,
       [](h& a, c& r) { a.prepare(r, [&a, r] { a.generation(endpoint::completions, r); }); }, gen},
      {"POST", "/v1/chat/completions", key, oa,
       [](h& a, c& r) { a.prepare(r, [&a, r] { a.generation(endpoint::chat_completions, r); }); }, gen},
      {"POST", "/v1/messages", key, an,
       [](h& a, c& r) { a.prepare(r, [&a, r] { a.generation(endpoint::chat_completions, r); }); }, gen},
      {"POST", "/v1/messages/count_tokens", key, an,
       [](h& a, c& r) { a.prepare(r, [&a, r] { a.count_tokens(*r.ex, *r.req, r.request_id); }); }},
      {"POST", "/v1/embeddings", key, oa,
       [](h& a, c& r) { a.prepare(r, [&a, r] { a.embeddings(*r.who, r.ex, *r.req, r.request_id); }); }, gen},
      {"POST", "/v1/responses", key, oa,
       [](h& a, c& r) { a.prepare(r, [&a, r] { a.responses(*r.who, r.ex, r.req, r.request_id); }); }, gen},
      {"GET", "/v1/responses/{id}", key, oa,
       [](h& a, c& r) { a.stored_response_route(*r.who, r.ex, *r.req, r.request_id); }},
      {"DELETE", "/v1/responses/{id}", key, oa,
       [](h& a, c& r) { a.stored_response_route(*r.who, r.ex, *r.req, r.request_id); }},
      {"GET", "/v1/responses/{id}/input_items", key, oa,
       [](h& a, c& r) { a.stored_response_route(*r.who, r.ex, *r.req, r.request_id); }},
  };
  return table;
}

std::optional<http_response> api_handler::precheck(const http_request& head) {
  const route_match m = match_route(routes(), head.method, head.path);
  // Open routes read (next to) nothing, and nobody reads a body before the key is known: nobody
  // without a key makes the router hold megabytes for the body timeout. A known path asked with
  // a method it does not take (a 405) reads none either.
  const size_t cap = head.method == "GET" || head.method == "HEAD" ? k_no_body
                     : m.found                                     ? m.found->max_body
                     : !m.allow.empty()                            ? k_no_body
                                                                   : SIZE_MAX;  // the server's own limit
  const tenant* who = nullptr;
  // A refusal from the header: a generation route's is traced like one from its body.
  const auto refused = [&](const api_error& e, bool count) {
    if (m.found && m.found->generation) trace_refusal(head, e, who, "");
    return edge_error(e, request_id_for(head), m.family, count);
  };
  if (auto e = body_over(head, cap)) return refused(*e, true);
  if (m.found && m.found->access == route_access::open) return std::nullopt;
  std::string key = bearer_key(head);
  if (key.empty() && head.method == "GET") key = dashboard_cookie_key(head.header("cookie"));
  who = tenants_.authenticate(key);
  if (!who) {
    if (m.found && m.found->access == route_access::admin_page) return std::nullopt;  // the handler's sign-in page
    return refused(unauthenticated(key), true);
  }
  if (!rate_charger_ || !charges_rate(head.method)) return std::nullopt;
  // A tenant limit's refusal, 429 with its Retry-After. Counted by the admission controller
  // (switchyard_router_admission_rejections_total), not as an edge error: one metric per limit.
  const auto limited = [&](const rejection& no) {
    api_error e = make_error(429, "rate_limit_error", std::string(name(no.reason)), no.message);
    e.retry_after_s = no.retry_after_s;
    return refused(e, false);
  };
  if (m.found && m.found->generation) {
    // Cheap checks before the body is read, templated or tokenized: a draining router, or a
    // tenant already at its concurrency limit, refuses now (admit() checks again).
    bool draining = false;
    {
      std::lock_guard<std::mutex> lk(status_->mu);
      draining = status_->draining;  // not shutting_down: --shutdown-delay-s still admits
    }
    if (draining) return refused(make_error(503, "overloaded_error", "draining", "the router is shutting down"), false);
    if (auto no = rate_charger_->edge_concurrency(*who)) return limited(*no);
  }
  if (auto no = rate_charger_->take_rate(*who, steady_now_s())) return limited(*no);  // on the dispatcher's clock
  return std::nullopt;
}

void api_handler::operator()(std::shared_ptr<http_exchange> ex, http_request&& req) {
  const route_match m = match_route(routes(), req.method, req.path);
  route_call call{std::move(ex), nullptr, request_id_for(req), nullptr, m.family};
  call.req = std::make_shared<http_request>(std::move(req));
  call.generation = m.found && m.found->generation;
  const http_request& r = *call.req;
  if (m.found && m.found->access == route_access::open) {
    m.found->handle(*this, call);
    return;
  }
  // Every other route needs a tenant's key when tenants are configured (docs/reliability.md:
  // unauthenticated admin surfaces), unknown paths included: the dashboard's sign-in form is the
  // one way in without it. The dashboard's session cookie stands for the key on GETs only (it is
  // SameSite=Strict, and GETs change nothing).
  std::string key = bearer_key(r);
  if (key.empty() && r.method == "GET") key = dashboard_cookie_key(r.header("cookie"));
  call.who = tenants_.authenticate(key);
  if (!call.who) {
    if (m.found && m.found->access == route_access::admin_page) {
      {
        std::lock_guard<std::mutex> lk(status_->mu);
        status_->edge_errors["401:dashboard_sign_in"]++;
      }
      call.ex->respond(dashboard_page(401, dashboard_login_html()));
      return;
    }
    if (m.found && m.found->generation)
      refuse(*call.ex, r, unauthenticated(key), call.request_id, m.family, nullptr);
    else
      reject(*call.ex, unauthenticated(key), call.request_id, m.family);
    return;
  }
  if (!m.found) {
    if (m.allow.empty()) {
      reject(*call.ex, make_error(404, "not_found_error", "unknown_url", "no route for " + r.method + " " + r.path),
             call.request_id, m.family);
      return;
    }
    http_response resp = edge_error(make_error(405, "invalid_request_error", "method_not_allowed",
                                               r.path + " takes " + m.allow + ", not " + r.method),
                                    call.request_id, m.family);
    resp.headers.emplace_back("Allow", m.allow);
    call.ex->respond(std::move(resp));
    return;
  }
  const route_access access = m.found->access;
  if ((access == route_access::admin || access == route_access::admin_page) && !call.who->admin) {
    // (with no tenants file everyone is admin: the router runs open)
    reject(*call.ex, make_error(403, "permission_error", "admin_only", r.path + " needs an admin API key"),
           call.request_id, m.family);
    return;
  }
  m.found->handle(*this, call);
}

void api_handler::ready(http_exchange& ex) {
  const char* not_ready = nullptr;
  size_t n_ready = 0, n_ejected = 0;
  {
    std::lock_guard<std::mutex> lk(status_->mu);
    if (status_->shutting_down || status_->draining)
      not_ready = "not ready: shutting down";
    else if (!status_->ready)
      not_ready = "not ready: no worker is ready";
    n_ready = status_->workers_ready;
    n_ejected = status_->workers_ejected;
  }
  // The worker counts say how much of the cluster serves: ejected workers are alive but failing.
  ex.respond({not_ready ? 503 : 200,
              "application/json",
              {},
              std::string("{\"status\":\"") + (not_ready ? not_ready : "ready") + "\",\"workers_ready\":" +
                  std::to_string(n_ready) + ",\"workers_ejected\":" + std::to_string(n_ejected) + "}"});
}

void api_handler::chart_js(route_call& c) {  // a static file: the page's script tag sends the session cookie
  const std::string& js = ::sy::router::chart_js();
  if (js.empty()) {
    reject(*c.ex, make_error(404, "not_found_error", "chart_js_missing", "Chart.js is not installed (libjs-chart.js)"),
           c.request_id);
    return;
  }
  c.ex->respond({200, "application/javascript", {{"Cache-Control", "max-age=86400"}}, js});
}

void api_handler::prepare(const route_call& c, std::function<void()> work) {
  prepare(c.ex, c.req->body.size(), c.request_id, std::move(work), c.family, c.generation ? c.req.get() : nullptr,
          c.who);
}

void api_handler::prepare(const std::shared_ptr<http_exchange>& ex, size_t bytes, const std::string& request_id,
                          std::function<void()> work, api_family family, const http_request* traced,
                          const tenant* who) {
  if (!prep_) {
    work();
    return;
  }
  // A job that throws would leave its client without an answer: answer for it.
  auto guarded = [work = std::move(work), ex, request_id, family, this] {
    if (ex->disconnected()) return;  // the client left while its body waited: nothing to answer
    try {
      work();
    } catch (const std::exception& e) {
      reject(*ex, make_error(500, "server_error", "internal_error", e.what()), request_id, family);
    }
  };
  if (prep_->try_post(bytes, std::move(guarded))) return;
  const api_error busy = make_error(503, "overloaded_error", "router_busy",
                                    "the router is preparing as many requests as it can take; retry shortly");
  if (traced) trace_refusal(*traced, busy, who, "");
  reject(*ex, busy, request_id, family);
}

void api_handler::generation(endpoint kind, const route_call& c) {
  const bool anthropic = c.family == api_family::anthropic;
  auto parsed = anthropic ? parse_anthropic_request(c.req->body, cfg_.limits)
                          : parse_generation_request(kind, c.req->body, cfg_.limits);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    refuse(*c.ex, *c.req, *e, c.request_id, c.family, c.who);
    return;
  }
  run_generation(kind, *c.who, c.ex, *c.req, c.request_id, std::move(std::get<generation_request>(parsed)),
                 anthropic ? api_shape::anthropic : api_shape::openai);
}

void api_handler::run_generation(endpoint kind, const tenant& who, std::shared_ptr<http_exchange> ex,
                                 const http_request& req, const std::string& request_id, generation_request parsed,
                                 api_shape shape, const responses_request* rr, const std::string& history) {
  const bool anthropic = shape == api_shape::anthropic;
  const api_family family = anthropic ? api_family::anthropic : api_family::openai;
  auto r = std::make_shared<routed_request>();
  r->req = std::move(parsed);
  generation_request& g = r->req;
  r->model = models_.find(g.model);
  if (!r->model) {
    if (models_.all().empty()) {
      refuse(*ex, req, make_error(503, "overloaded_error", "no_workers", "no worker has connected yet; retry shortly"),
             request_id, family, &who, g.model);
    } else {
      refuse(
          *ex, req,
          make_error(404, "not_found_error", "model_not_found", "the model '" + g.model + "' does not exist", "model"),
          request_id, family, &who, g.model);
    }
    return;
  }
  const model_entry& m = *r->model;
  if (kind == endpoint::chat_completions && !m.tmpl.supported()) {
    refuse(*ex, req,
           bad_request("model",
                       "the chat template of the model '" + m.id + "' cannot be applied (" + m.tmpl.unsupported_reason +
                           "): use /v1/completions with a formatted prompt, or the operator can start its "
                           "workers with --chat-template NAME (" +
                           chat_format_names() + ")",
                       "chat_template_unsupported"),
           request_id, family, &who, g.model);
    return;
  }
  const char* prompt_param = kind == endpoint::chat_completions ? "messages" : "prompt";
  try {
    if (kind == endpoint::chat_completions) {
      // Tools are rendered only when offered: with tool_choice "none" the model does not see them.
      r->prompt = m.chat_prompt(g.messages, /*add_generation_prompt=*/true,
                                g.tools.active() ? g.tools.tools : std::vector<chat_tool>{}, g.thinking);
    } else if (g.prompt_is_tokens) {
      for (const int32_t t : g.prompt_tokens) {
        if (t < 0 || static_cast<size_t>(t) >= m.tok.vocab_size()) {
          refuse(*ex, req,
                 bad_request("prompt", "token id " + std::to_string(t) + " is outside the vocabulary of " +
                                           std::to_string(m.tok.vocab_size())),
                 request_id, family, &who, g.model);
          return;
        }
      }
      r->prompt = g.prompt_tokens;
      if (g.echo) r->echo_text = m.tok.decode(r->prompt);
    } else {
      r->prompt = m.tok.encode(g.prompt_text);
      if (g.echo) r->echo_text = g.prompt_text;
    }
  } catch (const std::exception& e) {
    refuse(*ex, req, bad_request(prompt_param, std::string("cannot tokenize: ") + e.what()), request_id, family, &who,
           g.model);
    return;
  }
  const size_t ctx = m.context_length, n_prompt = r->prompt.size();
  if (n_prompt == 0) {
    refuse(*ex, req, bad_request(prompt_param, "the prompt is empty"), request_id, family, &who, g.model);
    return;
  }
  if (n_prompt >= ctx || (g.max_tokens_given && n_prompt + static_cast<size_t>(g.sampling.max_tokens) > ctx)) {
    refuse(*ex, req,
           bad_request(
               prompt_param,
               "this model's maximum context length is " + std::to_string(ctx) + " tokens; the request has " +
                   std::to_string(n_prompt) + " prompt tokens" +
                   (g.max_tokens_given ? " and asks for " + std::to_string(g.sampling.max_tokens) + " completion tokens"
                                       : ""),
               "context_length_exceeded"),
           request_id, family, &who, g.model);
    return;
  }
  if (!g.max_tokens_given) g.sampling.max_tokens = static_cast<int32_t>(ctx - n_prompt);
  r->who = &who;
  r->set_priority(g.priority);
  r->rate_charged = req.header_checked && rate_charger_ != nullptr;  // precheck() took it from the bucket
  r->id = next_id_.fetch_add(1);
  r->request_id = request_id;
  if (shape == api_shape::responses)
    r->meta.id = new_response_id();  // an id a client names later (previous_response_id): never reused
  else
    r->meta.id = (anthropic ? "msg_" : kind == endpoint::chat_completions ? "chatcmpl-" : "cmpl-") + request_id;
  r->meta.model = g.model;  // the name the client used (an alias answers as itself)
  r->meta.created = unix_s_now();
  r->meta.kind = kind;
  r->meta.want_logprobs = g.want_logprobs;
  enable_tool_calls(r->meta, g, m.tmpl.format);
  if (kind == endpoint::chat_completions) {
    if (const auto spec = reasoning_of(cfg_.reasoning, m.spec.chat_template, m.tok, r->prompt, g.thinking))
      enable_reasoning(r->meta, *spec);
  }
  // A thinking budget acts only where the answer splits (the worker closes the thinking with the
  // text the split ends it at: docs/router.md, "Reasoning output"); elsewhere it is dropped.
  if (!r->meta.reasoning) {
    g.sampling.thinking_budget = 0;
    g.sampling.thinking_end.clear();
  }
  if (anthropic) enable_anthropic(r->meta, g, static_cast<uint32_t>(n_prompt));
  if (shape == api_shape::responses && rr != nullptr) {
    enable_responses(r->meta, *rr, history, responses_ != nullptr);
    ex = responses_exchange(std::move(ex), r->meta.responses, save_response(who, r->meta));
  }
  r->timeout_s = std::min(g.timeout_s.value_or(cfg_.default_timeout_s), cfg_.max_timeout_s);
  r->queue_timeout_s = g.queue_timeout_s.value_or(0);
  attach(*r, ex, req);
  submit_or_lookup(std::move(r), req);
}

void api_handler::attach(routed_request& r, const std::shared_ptr<http_exchange>& ex, const http_request& req) {
  r.t_received_s = steady_seconds(req.received);
  r.t_parsed_s = steady_now_s();
  // traceparent in, or a new trace (docs/router.md, "Tracing")
  r.trace = trace_for(req.method + " " + req.path, req.header("traceparent"), req.header("tracestate"), cfg_.tracing);
  {
    std::lock_guard<std::mutex> lk(status_->mu);
    status_->parse_s.observe(r.t_parsed_s - r.t_received_s);
  }
  r.ex = ex;
  ex->on_disconnect([gone = client_gone_, id = r.id] { gone(id); });
}

void api_handler::embeddings(const tenant& who, std::shared_ptr<http_exchange> ex, http_request& req,
                             const std::string& request_id) {
  auto parsed = parse_embedding_request(req.body, cfg_.limits);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    refuse(*ex, req, *e, request_id, api_family::openai, &who);
    return;
  }
  embedding_request& er = std::get<embedding_request>(parsed);
  auto r = std::make_shared<routed_request>();
  r->model = models_.find(er.model);
  if (!r->model) {
    refuse(*ex, req,
           models_.all().empty()
               ? make_error(503, "overloaded_error", "no_workers", "no worker has connected yet; retry shortly")
               : make_error(404, "not_found_error", "model_not_found", "the model '" + er.model + "' does not exist",
                            "model"),
           request_id, api_family::openai, &who, er.model);
    return;
  }
  const model_entry& m = *r->model;
  embedding_job job;
  job.base64 = er.base64;
  job.dimensions = er.dimensions;
  try {
    // Texts as /v1/completions tokenizes a prompt (BOS and EOS as the model adds them).
    for (const std::string& t : er.texts) job.inputs.push_back(m.tok.encode(t));
  } catch (const std::exception& e) {
    refuse(*ex, req, bad_request("input", std::string("cannot tokenize: ") + e.what()), request_id, api_family::openai,
           &who, er.model);
    return;
  }
  for (auto& ids : er.token_inputs) job.inputs.push_back(std::move(ids));
  const size_t ctx = m.context_length;
  for (size_t i = 0; i < job.inputs.size(); ++i) {
    const std::string param = job.inputs.size() == 1 ? "input" : "input[" + std::to_string(i) + "]";
    const auto& ids = job.inputs[i];
    if (ids.empty()) {
      refuse(*ex, req, bad_request(param, "'" + param + "' has no tokens"), request_id, api_family::openai, &who,
             er.model);
      return;
    }
    for (const int32_t t : ids)
      if (t < 0 || static_cast<size_t>(t) >= m.tok.vocab_size()) {
        refuse(*ex, req,
               bad_request(param, "token id " + std::to_string(t) + " is outside the vocabulary of " +
                                      std::to_string(m.tok.vocab_size())),
               request_id, api_family::openai, &who, er.model);
        return;
      }
    if (ids.size() > ctx) {
      refuse(*ex, req,
             bad_request(param,
                         "this model's maximum context length is " + std::to_string(ctx) + " tokens; '" + param +
                             "' has " + std::to_string(ids.size()) + " tokens",
                         "context_length_exceeded"),
             request_id, api_family::openai, &who, er.model);
      return;
    }
    r->prompt.insert(r->prompt.end(), ids.begin(), ids.end());
  }
  if (r->prompt.size() > proto::k_max_prompt_tokens) {
    reject(
        *ex,
        bad_request("input", "'input' has more than " + std::to_string(proto::k_max_prompt_tokens) + " tokens in all"),
        request_id);
    return;
  }
  r->embed = std::move(job);
  r->req.model = er.model;
  r->req.n = 1;
  r->req.stream = false;
  r->req.sampling.max_tokens = 0;  // nothing is generated: the queue weighs the inputs alone
  r->req.max_tokens_given = true;
  r->who = &who;
  r->set_priority(er.priority);
  r->rate_charged = req.header_checked && rate_charger_ != nullptr;
  r->id = next_id_.fetch_add(1);
  r->request_id = request_id;
  r->meta.id = "embd-" + request_id;
  r->meta.model = er.model;  // the name the client used
  r->meta.created = unix_s_now();
  r->timeout_s = std::min(er.timeout_s.value_or(cfg_.default_timeout_s), cfg_.max_timeout_s);
  r->queue_timeout_s = er.queue_timeout_s.value_or(0);
  attach(*r, ex, req);
  submit_(std::move(r));  // never cached: no lookup
}

void api_handler::count_tokens(http_exchange& ex, const http_request& req, const std::string& request_id) {
  auto parsed = parse_anthropic_request(req.body, cfg_.limits, /*count_only=*/true);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    reject(ex, *e, request_id, api_family::anthropic);
    return;
  }
  const generation_request& g = std::get<generation_request>(parsed);
  const auto m = models_.find(g.model);
  if (!m) {
    reject(ex,
           models_.all().empty()
               ? make_error(503, "overloaded_error", "no_workers", "no worker has connected yet; retry shortly")
               : make_error(404, "not_found_error", "model_not_found", "the model '" + g.model + "' does not exist",
                            "model"),
           request_id, api_family::anthropic);
    return;
  }
  if (!m->tmpl.supported()) {
    reject(ex,
           bad_request(
               "model",
               "the chat template of the model '" + m->id + "' cannot be applied (" + m->tmpl.unsupported_reason + ")",
               "chat_template_unsupported"),
           request_id, api_family::anthropic);
    return;
  }
  std::vector<int32_t> prompt;
  try {  // the prompt generation() makes of the same body
    prompt = m->chat_prompt(g.messages, /*add_generation_prompt=*/true,
                            g.tools.active() ? g.tools.tools : std::vector<chat_tool>{}, g.thinking);
  } catch (const std::exception& e) {
    reject(ex, bad_request("messages", std::string("cannot tokenize: ") + e.what()), request_id, api_family::anthropic);
    return;
  }
  ex.respond({200, "application/json", {{"X-Request-Id", request_id}}, format_anthropic_count(prompt.size())});
}

void api_handler::submit_or_lookup(std::shared_ptr<routed_request> r, const http_request& req) {
  if (!cache_) {
    submit_(std::move(r));
    return;
  }
  const generation_request& g = r->req;
  const std::string_view cc = req.header("cache-control");
  const bool no_store = g.cache == false || cc.find("no-store") != std::string_view::npos;
  const bool no_lookup = no_store || cc.find("no-cache") != std::string_view::npos;
  // Logprobs and per-chunk token counts are not kept in the cache: such requests are served live.
  if (g.want_logprobs || g.continuous_usage ||
      !cache::cacheable(g.sampling.temperature, g.sampling.has_seed, no_store, cache_->policy())) {
    cache_->record({cache::event_kind::bypass, r->who->name, r->model->id, "", 0, 0, 0, std::nullopt});
    submit_(std::move(r));
    return;
  }
  cache::key_input k;
  k.tenant_namespace = r->who->cache_namespace;
  k.model = r->model->id;
  k.endpoint = g.kind == endpoint::chat_completions ? 1 : 0;
  k.prompt_tokens = r->prompt;
  k.sampling = g.sampling;
  if (!k.sampling.has_seed) k.sampling.seed = 0;  // a seed the sampler ignores must not split the key
  k.n = g.n;
  k.want_logprobs = g.want_logprobs;
  k.echo = g.echo;
  k.constraint_kind = g.constraint.kind;
  k.constraint_schema = g.constraint.schema;
  k.tools = g.tools.cache_text();
  r->cache_key = cache::make_key(k);
  r->prompt_hash = cache::prompt_hash(k);
  r->cache_store = true;
  if (r->who->cache_previews)
    r->preview =
        g.kind == endpoint::chat_completions && !g.messages.empty() ? g.messages.back().content : g.prompt_text;
  if (no_lookup) {
    r->cache_bypassed = true;
    submit_(std::move(r));
    return;
  }
  r->t_lookup_start_s = steady_now_s();
  auto on_result = [this, r](std::optional<cache::stored_response> hit, cache::lookup_status st) mutable {
    r->t_lookup_end_s = steady_now_s();
    r->cache_lookup = std::string(cache::name(st));
    if (!hit) {
      // miss, error, circuit open or a lookup that waited too long: a worker serves it (and it is stored)
      r->cache_bypassed = st == cache::lookup_status::error || st == cache::lookup_status::short_circuited ||
                          st == cache::lookup_status::expired;
      submit_(std::move(r));
      return;
    }
    if (r->ex->disconnected()) return;
    replay_response(*r, *hit);
    request_outcome o = traced_outcome(*r, 200, "", steady_now_s());
    o.prompt_tokens = hit->prompt_tokens;
    o.completion_tokens = hit->completion_tokens;
    o.cache_hit = true;
    export_request(cfg_.tracer, r->trace, o, o.t_end_s);
    const double age = std::max<double>(0, static_cast<double>(unix_s_now() - hit->created_unix_s));
    cache_->record({cache::event_kind::hit, r->who->name, r->model->id, r->prompt_hash,
                    hit->prompt_tokens + hit->completion_tokens, hit->generation_s, age, r->preview});
  };
  if (!cache_->lookup(r->cache_key, std::move(on_result))) {  // cache backed up
    r->cache_bypassed = true;
    r->t_lookup_start_s = 0;  // never asked
    submit_(std::move(r));
  }
}

void api_handler::cache_stats(std::shared_ptr<http_exchange> ex, const http_request& req,
                              const std::string& request_id) {
  if (!cache_) {
    reject(*ex, make_error(404, "not_found_error", "cache_disabled", "the response cache is off (no --redis)"),
           request_id);
    return;
  }
  const int64_t now = unix_s_now();
  auto num = [&](const char* name, int64_t fallback) -> std::optional<int64_t> {
    const std::string v = query_param(req.target, name);
    if (v.empty()) return fallback;
    try {
      size_t used = 0;
      const long long x = std::stoll(v, &used);
      if (used != v.size()) return std::nullopt;
      return x;
    } catch (...) {
      return std::nullopt;
    }
  };
  const auto from = num("from", now - 3600), to = num("to", now), top = num("top", 10);
  if (!from || !to || !top || *from > *to || *top < 0 || *top > 1000 || *to - *from > 31 * 86400) {
    reject(
        *ex,
        bad_request("from", "from/to must be unix seconds with from <= to (at most 31 days apart), top in [0, 1000]"),
        request_id);
    return;
  }
  cache_->query(*from, *to, static_cast<size_t>(*top), [keep = std::move(ex), request_id](cache::cache_stats s) {
    keep->respond({s.complete ? 200 : 503, "application/json", {{"X-Request-Id", request_id}}, cache::to_json(s)});
  });
}

std::span<const route> api_handler::metrics_routes() {
  using enum route_access;
  constexpr api_family oa = api_family::openai;
  // The same handlers as the API port's lines; every route here is open (the port is the
  // scraper's, kept off the API's network path).
  static constexpr route table[] = {
      {"GET", "/metrics", open, oa, metrics_route},
      {"GET", "/health", open, oa, health_route},  // liveness, off the client port's load
  };
  return table;
}

void api_handler::health_route(api_handler&, route_call& c) {
  c.ex->respond({200, "application/json", {}, "{\"status\":\"ok\"}"});
}

void api_handler::metrics_route(api_handler& a, route_call& c) {
  c.ex->respond({200, "text/plain; version=0.0.4", {}, a.metrics()});
}

void api_handler::metrics_listener(std::shared_ptr<http_exchange> ex, http_request&& req) {
  const route_match m = match_route(metrics_routes(), req.method, req.path);
  if (!m.found || m.found->access != route_access::open) {
    ex->respond({404, "text/plain", {}, "only GET /metrics and GET /health here\n"});
    return;
  }
  route_call call{std::move(ex), nullptr, request_id_for(req), nullptr, m.family};
  call.req = std::make_shared<http_request>(std::move(req));
  m.found->handle(*this, call);
}

void api_handler::dashboard_login(http_exchange& ex, const http_request& req, const std::string& request_id) {
  if (req.method != "POST") {
    ex.respond(dashboard_page(401, dashboard_login_html()));
    return;
  }
  const std::string key = dashboard_form_key(req.body);
  const tenant* who = tenants_.authenticate(key);
  if (!who || !who->admin) {
    {
      std::lock_guard<std::mutex> lk(status_->mu);
      status_->edge_errors[who ? "403:admin_only" : "401:invalid_api_key"]++;
    }
    ex.respond(dashboard_page(who ? 403 : 401, dashboard_login_html()));
    return;
  }
  ex.respond({303,
              "text/plain",
              {{"Location", "/dashboard"}, {"Set-Cookie", dashboard_set_cookie(key)}, {"X-Request-Id", request_id}},
              "signed in\n"});
}

std::string api_handler::metrics() const {
  std::string out;
  {
    std::unique_lock<std::mutex> lk(status_->mu);
    status_->await_publication(lk, std::chrono::milliseconds(250));  // counters as of this scrape
    out = status_->dispatcher_metrics;
    status_->write_overhead_s.render(out, "switchyard_router_write_overhead_seconds",
                                     "Router time from a token frame received to its bytes written to the client.");
    status_->parse_s.render(out, "switchyard_router_parse_seconds",
                            "Request read to validated and tokenized (HTTP thread).");
    metric_family edge(out, "switchyard_router_edge_errors_total", "counter",
                       "Requests refused by validation or auth, by status:code.");
    for (const auto& [k, n] : status_->edge_errors) edge.sample({{"error", k}}, n);
  }
  if (cache_) out += cache_->render_metrics();
  if (responses_) out += responses_->render_metrics();
  if (status_->link_metrics) out += status_->link_metrics();
  if (prep_) {
    metric(out, "switchyard_router_prep_waiting", "gauge",
           "Request bodies waiting for a prep thread (parse, template, tokenize).",
           static_cast<double>(prep_->waiting()));
    metric(out, "switchyard_router_prep_refused_total", "counter",
           "Requests refused with 503 router_busy because the prep pool's backlog was full.",
           static_cast<double>(prep_->refused()));
  }
  if (http_) {
    metric(out, "switchyard_router_http_connections_open", "gauge", "Open client connections.",
           static_cast<double>(http_->connections_open.load()));
    metric(out, "switchyard_router_http_connections_total", "counter", "Client connections accepted.",
           static_cast<double>(http_->connections_accepted.load()));
    metric(out, "switchyard_router_http_connections_refused_total", "counter",
           "Connections closed at once because the server was at its connection limit.",
           static_cast<double>(http_->connections_refused.load()));
    metric(out, "switchyard_router_http_connections_refused_per_address_total", "counter",
           "Connections closed at once because their client address was at --max-connections-per-address.",
           static_cast<double>(http_->connections_refused_per_address.load()));
    metric(out, "switchyard_router_http_body_budget_refusals_total", "counter",
           "Requests answered 503 router_busy from their header: their body did not fit --max-inflight-body-bytes.",
           static_cast<double>(http_->body_budget_refusals.load()));
    metric(out, "switchyard_router_http_body_bytes_inflight", "gauge",
           "Bytes of request bodies being read (reserved from their declared length).",
           static_cast<double>(http_->body_bytes_inflight.load()));
    metric(out, "switchyard_router_http_requests_total", "counter", "HTTP requests read.",
           static_cast<double>(http_->requests.load()));
    metric(out, "switchyard_router_http_bad_requests_total", "counter", "Unparsable HTTP, oversized headers or bodies.",
           static_cast<double>(http_->bad_requests.load()));
    metric(out, "switchyard_router_http_timeouts_total", "counter", "Connections cut by header/body/idle deadlines.",
           static_cast<double>(http_->timeouts.load()));
    metric(out, "switchyard_router_http_client_disconnects_total", "counter",
           "Clients that went away before their response ended.",
           static_cast<double>(http_->client_disconnects.load()));
    metric(out, "switchyard_router_http_write_stalls_total", "counter",
           "Responses closed because none of their pending bytes reached the client for --write-stall-timeout-s "
           "(counted in client disconnects too: the request is cancelled).",
           static_cast<double>(http_->write_stalls.load()));
    metric(out, "switchyard_router_http_stream_overflows_total", "counter",
           "Streams closed because more than --max-stream-buffer-bytes waited for a slow client.",
           static_cast<double>(http_->stream_overflows.load()));
    metric(out, "switchyard_router_http_refused_at_header_total", "counter",
           "Requests answered from their header alone (no API key, tenant over its requests/s): body not read.",
           static_cast<double>(http_->refused_at_header.load()));
  }
  return out;
}

}  // namespace sy::router
