// The router's one clock: seconds on std::chrono::steady_clock, as a double. The dispatcher takes
// every time as such seconds (its `now_s`, the frames' receive times, the requests' stamps), so a
// test drives it with made-up times; in production the actor system's clock is this one too
// (dispatcher_actor.cpp), and the HTTP edge stamps requests with it.
#pragma once

#include <chrono>

namespace sy::router {

inline double steady_seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

inline std::chrono::steady_clock::time_point steady_time(double s) {
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s)));
}

inline double steady_now_s() { return steady_seconds(std::chrono::steady_clock::now()); }

}  // namespace sy::router
