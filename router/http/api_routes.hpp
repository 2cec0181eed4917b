// The router's route table (docs/router.md, "Routes"): one line per route — method, path
// pattern, who may call it, its API family and its handler — looked up once per request. A
// pattern is literal segments and `{name}` segments that match one non-empty segment, or a last
// `{name*}` that matches the rest of the path (one or more segments). A path that no route's
// pattern matches is a 404; a path some route matches with another method, a 405 whose Allow
// header lists the methods it takes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "router/http/http_server.hpp"
#include "router/openai/api_errors.hpp"

namespace sy::router {

class api_handler;
struct tenant;

// Who may call a route. The key is checked once, from this, before the handler runs.
enum class route_access : uint8_t {
  open,        // no key: liveness, readiness, the dashboard's sign-in form
  key,         // any tenant's API key (none when the router runs without tenants)
  admin,       // an admin tenant's key (403 admin_only for another tenant's)
  admin_page,  // as admin, but a request without a valid key gets the sign-in page, not a JSON 401
};

// A request on its way to its handler.
struct route_call {
  std::shared_ptr<http_exchange> ex;
  std::shared_ptr<http_request> req;
  std::string request_id;
  const tenant* who = nullptr;  // null on open routes
  api_family family = api_family::openai;
  bool generation = false;  // a generation route's call (its refusals are traced)
};

struct route {
  std::string_view method;   // "GET", "POST", "DELETE"
  std::string_view pattern;  // "/v1/responses/{id}"
  route_access access;
  api_family family;
  void (*handle)(api_handler&, route_call&);
  // A generation: refused from its header while the router drains or the tenant is at its
  // concurrency limit (api_handler::precheck).
  bool generation = false;
  // The most body it reads before its key is checked (GET and HEAD read none).
  size_t max_body = SIZE_MAX;
};

// Whether `path` matches `pattern` (the rules above).
bool path_matches(std::string_view pattern, std::string_view path);

struct route_match {
  const route* found = nullptr;            // the route for the method and path; null: 404 or 405
  std::string allow;                       // "GET, DELETE": the path's methods; empty: unknown path
  api_family family = api_family::openai;  // the path's API family (for its errors)
};

// The first route in `table` for `method` and `path`; else what a 404 or 405 needs.
route_match match_route(std::span<const route> table, std::string_view method, std::string_view path);

}  // namespace sy::router
