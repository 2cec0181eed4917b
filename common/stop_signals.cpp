// Stop signals (see stop_signals.hpp).
#include "common/stop_signals.hpp"

#include <pthread.h>

#include <chrono>
#include <ctime>

namespace sy {

sigset_t block_stop_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  return sigs;
}

bool wait_unless_signalled(const sigset_t& sigs, double seconds, const std::function<bool()>& done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  const timespec step{0, 100 * 1000 * 1000};
  while (!done() && std::chrono::steady_clock::now() < end)
    if (sigtimedwait(&sigs, nullptr, &step) > 0) return false;
  return true;
}

}  // namespace sy
