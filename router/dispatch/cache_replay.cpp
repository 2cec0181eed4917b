#include "router/dispatch/cache_replay.hpp"

#include "router/openai/anthropic_api.hpp"

namespace sy::router {

void replay_response(const routed_request& r, const cache::stored_response& s) {
  usage_info u;
  u.prompt_tokens = s.prompt_tokens;
  u.completion_tokens = s.completion_tokens;
  u.cached_tokens = s.prompt_tokens;  // nothing was computed for this answer
  // The text splits as it did live (format_*, meta.reasoning); the count was stored with it.
  if (r.meta.reasoning) u.reasoning_tokens = s.reasoning_tokens;
  if (r.meta.anthropic) {  // what the stream's message_start and the stop reason say
    r.meta.anthropic->cached_tokens = u.cached_tokens;
    if (!s.choices.empty()) r.meta.anthropic->stop_matched = s.choices[0].stop;
  }
  std::vector<std::pair<std::string, std::string>> headers = answer_headers(r);
  headers.emplace_back("X-Cache", "hit");
  if (!r.req.stream) {
    std::vector<choice_result> choices;
    for (size_t c = 0; c < s.choices.size(); ++c) {
      choice_result cr;
      cr.index = static_cast<int32_t>(c);
      cr.text = s.text(c);
      cr.finish_reason = s.choices[c].finish_reason;
      cr.stop = s.choices[c].stop;
      choices.push_back(std::move(cr));
    }
    http_response resp;
    resp.body = format_response(r.meta, choices, u);
    resp.headers = std::move(headers);
    r.ex->respond(std::move(resp));
    return;
  }
  // The whole answer is known: written as the client reads it (a long one would overflow the
  // stream buffer if queued at once).
  std::vector<std::string> events;
  for (size_t c = 0; c < s.choices.size(); ++c) {
    const auto& ch = s.choices[c];
    const auto idx = static_cast<int32_t>(c);
    if (ch.deltas.empty()) {
      events.push_back(format_chunk(r.meta, idx, "", true, ch.finish_reason, {}, nullptr, ch.stop));
      continue;
    }
    for (size_t k = 0; k < ch.deltas.size(); ++k) {
      const bool last = k + 1 == ch.deltas.size();
      events.push_back(format_chunk(r.meta, idx, ch.deltas[k], k == 0, last ? ch.finish_reason : finish_reason::none,
                                    {}, nullptr, ch.stop));
    }
  }
  for (auto& e : format_stream_end(r.meta, u, r.req.include_usage)) events.push_back(std::move(e));
  r.ex->start_stream(200, std::move(headers));
  r.ex->send_events(std::move(events));
  r.ex->end_stream();
}

}  // namespace sy::router
