// The Responses API's routes (api_handler.hpp lists them; docs/router.md, "Responses API"):
// POST /v1/responses as a generation on the chat path, with the conversation a
// previous_response_id names fetched from the response store first, and the stored responses'
// GET and DELETE.
#include <charconv>

#include "router/http/api_handler.hpp"

namespace sy::router {
namespace {

constexpr std::string_view k_responses_prefix = "/v1/responses/";
constexpr std::string_view k_input_items = "/input_items";

api_error store_unavailable() {
  return make_error(503, "overloaded_error", "responses_store_unavailable",
                    "the response store (Redis) did not answer; retry shortly");
}

}  // namespace

void api_handler::responses(const tenant& who, std::shared_ptr<http_exchange> ex, std::shared_ptr<http_request> req,
                            const std::string& request_id) {
  auto parsed = parse_responses_request(req->body, cfg_.limits);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    refuse(*ex, *req, *e, request_id, api_family::openai, &who);
    return;
  }
  auto rr = std::make_shared<const responses_request>(std::move(std::get<responses_request>(parsed)));
  // The conversation known (none, or the stored one): the chat request, then a generation.
  auto go = [this, who = &who, ex, req, request_id, rr](const std::string& history) {
    auto g = responses_generation(*rr, history, cfg_.limits);
    if (auto* e = std::get_if<api_error>(&g)) {
      refuse(*ex, *req, *e, request_id, api_family::openai, who, rr->model);
      return;
    }
    run_generation(endpoint::chat_completions, *who, ex, *req, request_id, std::move(std::get<generation_request>(g)),
                   api_shape::responses, rr.get(), history);
  };
  if (rr->previous_response_id.empty()) {
    go("");
    return;
  }
  if (!responses_) {
    refuse(*ex, *req,
           bad_request("previous_response_id",
                       "this router keeps no responses (it runs without --redis): 'previous_response_id' cannot "
                       "be used; send the whole conversation in 'input'",
                       "responses_store_disabled"),
           request_id, api_family::openai, &who, rr->model);
    return;
  }
  responses_->get(
      who.name, rr->previous_response_id,
      [this, ex, request_id, rr, go, bytes = req->body.size()](responses_store::outcome o, std::string record) {
        if (o == responses_store::outcome::unavailable) {
          reject(*ex, store_unavailable(), request_id);
          return;
        }
        std::optional<std::string> history;
        if (o == responses_store::outcome::ok) history = responses_history(record);
        if (!history) {
          reject(*ex,
                 not_found("previous_response_not_found",
                           "no response with id '" + rr->previous_response_id +
                               "' (never stored, expired, deleted, or another tenant's)",
                           "previous_response_id"),
                 request_id);
          return;
        }
        // Templating and tokenizing the conversation: back on the prep pool, off the
        // cache thread.
        const size_t weight = bytes + history->size();
        prepare(ex, weight, request_id, [go, h = std::move(*history)] { go(h); });
      });
}

std::function<void(std::string, std::function<void()>)> api_handler::save_response(const tenant& who,
                                                                                   const response_meta& meta) {
  if (!responses_ || !meta.responses || !meta.responses->store) return {};
  return [store = responses_.get(), tenant = who.name, id = meta.id](std::string record, std::function<void()> then) {
    store->put(tenant, id, std::move(record), [then = std::move(then)](bool) { then(); });
  };
}

void api_handler::stored_response_route(const tenant& who, std::shared_ptr<http_exchange> ex, const http_request& req,
                                        const std::string& request_id) {
  std::string id(std::string_view(req.path).substr(k_responses_prefix.size()));
  const bool input_items = id.size() > k_input_items.size() &&
                           id.compare(id.size() - k_input_items.size(), k_input_items.size(), k_input_items) == 0;
  if (input_items) id.resize(id.size() - k_input_items.size());
  if (id.empty() || id.find('/') != std::string::npos) {
    reject(*ex, make_error(404, "not_found_error", "unknown_url", "no route for " + req.method + " " + req.path),
           request_id);
    return;
  }
  // input_items' query: order (asc, desc: the default), limit (1 to 100, 20), after (an item id).
  const std::string order = query_param(req.target, "order"), limit_text = query_param(req.target, "limit");
  size_t limit = 20;
  if (!limit_text.empty()) {
    const auto [end, ec] = std::from_chars(limit_text.data(), limit_text.data() + limit_text.size(), limit);
    if (ec != std::errc{} || end != limit_text.data() + limit_text.size() || limit < 1 || limit > 100) {
      reject(*ex, bad_request("limit", "'limit' must be an integer from 1 to 100"), request_id);
      return;
    }
  }
  if (!order.empty() && order != "asc" && order != "desc") {
    reject(*ex, bad_request("order", "'order' must be asc or desc"), request_id);
    return;
  }
  if (!responses_) {
    reject(*ex, not_found("responses_store_disabled", "this router keeps no responses (it runs without --redis)"),
           request_id);
    return;
  }
  const auto missing = [id] {
    return not_found("response_not_found", "no response with id '" + id + "'", "response_id");
  };
  if (req.method == "DELETE") {
    responses_->remove(who.name, id, [this, ex, request_id, id, missing](responses_store::outcome o) {
      if (o == responses_store::outcome::ok)
        ex->respond({200, "application/json", {{"X-Request-Id", request_id}}, format_responses_deleted(id)});
      else
        reject(*ex, o == responses_store::outcome::unavailable ? store_unavailable() : missing(), request_id);
    });
    return;
  }
  responses_->get(who.name, id,
                  [this, ex, request_id, missing, input_items, id, desc = order != "asc", limit,
                   after = query_param(req.target, "after")](responses_store::outcome o, std::string record) {
                    if (o == responses_store::outcome::unavailable) {
                      reject(*ex, store_unavailable(), request_id);
                      return;
                    }
                    std::optional<std::string> body;
                    if (o == responses_store::outcome::ok)
                      body = input_items ? format_input_items(record, id, desc, limit, after)
                                         : responses_stored_response(record);
                    if (!body) {
                      reject(*ex, missing(), request_id);
                      return;
                    }
                    ex->respond({200, "application/json", {{"X-Request-Id", request_id}}, std::move(*body)});
                  });
}

}  // namespace sy::router
