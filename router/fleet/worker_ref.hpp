// How the router's parts name a worker: a number given to an address when it joins the pool and
// never reused for the life of the process. Requests, link frames ([ref][type][body]) and the
// link's sockets all key on it. A worker removed and later listed again joins under a new ref,
// so nothing meant for the old connection (a late frame, a stale request) can reach the new one.
#pragma once

#include <cstdint>

namespace sy::router {

using worker_ref = uint32_t;

}  // namespace sy::router
