// Answering from the response cache: a stored response goes back as the same JSON body, or as
// SSE chunks of the same shape a live generation sends (one chunk per stored delta, the finish
// reason on each choice's last, then usage and [DONE]), marked `X-Cache: hit`.
#pragma once

#include "cache/stored_response.hpp"
#include "router/dispatch/routed_request.hpp"

namespace sy::router {

void replay_response(const routed_request& r, const cache::stored_response& s);

}  // namespace sy::router
