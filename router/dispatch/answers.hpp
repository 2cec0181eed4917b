// How the dispatcher answers the clients of a request (active_request.hpp's listeners): stream
// chunks, the final response or [DONE], an error as a response or as a stream's last event.
// reply_error and answer_internal_error return the status they answered with (requests_total).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "router/dispatch/active_request.hpp"
#include "router/openai/api_errors.hpp"
#include "router/openai/openai_request.hpp"
#include "router/openai/openai_response.hpp"

namespace sy::router {

// One chunk of choice `c` to a stream listener (the first of its choice carries the role).
// `t_recv_s`: when its frame reached the router (0: not stamped), for the write-latency metric.
// `stop`: with `finish`, the stop string that ended the choice (format_chunk).
void send_chunk(listener& l, uint32_t c, std::string_view text, sy::finish_reason finish,
                const std::vector<token_logprobs>& logprobs, const usage_info* usage, double t_recv_s,
                std::string_view stop = {});

// Every choice of `a` finished: a stream's usage chunk and [DONE], or the whole response (the
// own listener's text and logprobs as accumulated; a coalesced one's from the shared deltas).
void answer_success(const listener& l, const active_request& a, const usage_info& u);

// An error: the response, or a stream's terminal error event and [DONE].
void answer_error(const listener& l, const api_error& e);

// An error response to a request that never got a stream (router/openai/api_errors.hpp's responder;
// `retry_after_s` > 0 sets the error's Retry-After).
int reply_error(const routed_request& r, const api_error& e, double retry_after_s = 0);

// A 500 for a request the dispatcher could not handle, whichever state its exchange is in
// (stream started or not); never throws.
int answer_internal_error(const routed_request& r, const char* what);

}  // namespace sy::router
