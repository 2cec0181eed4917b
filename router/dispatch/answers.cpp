#include "router/dispatch/answers.hpp"

#include <algorithm>
#include <string>

#include "router/base/router_clock.hpp"

namespace sy::router {

namespace {

api_family family_of(const routed_request& r) { return r.meta.anthropic ? api_family::anthropic : api_family::openai; }

}  // namespace

void send_chunk(listener& l, uint32_t c, std::string_view text, finish_reason finish,
                const std::vector<token_logprobs>& logprobs, const usage_info* usage, double t_recv_s,
                std::string_view stop) {
  const routed_request& to = *l.r;
  to.ex->send_event(format_chunk(to.meta, static_cast<int32_t>(c), text, !l.started[c], finish, logprobs, usage, stop),
                    t_recv_s > 0 ? steady_time(t_recv_s) : std::chrono::steady_clock::time_point{});
  l.started[c] = true;
}

void answer_success(const listener& l, const active_request& a, const usage_info& u) {
  const routed_request& to = *l.r;
  if (l.stream()) {
    for (auto& e : format_stream_end(to.meta, u, to.req.include_usage)) to.ex->send_event(std::move(e));
    to.ex->end_stream();
    return;
  }
  std::vector<choice_result> choices;
  for (uint32_t c = 0; c < a.choices.size(); ++c) {
    const choice_state& cs = a.choices[c];
    choice_result cr;
    cr.index = static_cast<int32_t>(c);
    if (l.own) {
      cr.text = cs.text;
      cr.logprobs = cs.logprobs;
    } else {
      for (const auto& d : cs.deltas) cr.text += d;
    }
    cr.finish_reason = cs.finish_reason;
    cr.stop = cs.stop;
    choices.push_back(std::move(cr));
  }
  http_response resp;
  resp.body = format_response(to.meta, choices, u);
  resp.headers = answer_headers(to);
  if (!l.own) resp.headers.emplace_back("X-Cache", "coalesced");
  to.ex->respond(std::move(resp));
}

void answer_error(const listener& l, const api_error& e) {
  if (!l.stream()) {
    reply_error(*l.r, e);
    return;
  }
  for (auto& ev : format_stream_error(l.r->meta, e)) l.r->ex->send_event(std::move(ev));
  l.r->ex->end_stream();
}

int reply_error(const routed_request& r, const api_error& e, double retry_after_s) {
  api_error with = e;
  if (retry_after_s > 0) with.retry_after_s = retry_after_s;
  r.ex->respond(error_response(with, family_of(r), r.request_id));
  return e.status;
}

int answer_internal_error(const routed_request& r, const char* what) {
  const api_error e = make_error(500, "server_error", "internal_error",
                                 std::string("the router failed to handle the request: ") + what);
  // The exchange takes whichever call matches its state (a stream already started, or not) and
  // ignores the other.
  try {
    r.ex->respond(error_response(e, family_of(r), r.request_id));
    if (r.req.stream) {
      for (auto& ev : format_stream_error(r.meta, e)) r.ex->send_event(std::move(ev));
      r.ex->end_stream();
    }
  } catch (const std::exception&) {  // the connection is beyond help; nothing else to do
  }
  return 500;
}

}  // namespace sy::router
