// SIGINT/SIGTERM as both processes' mains take them: blocked in every thread, waited for with
// sigwait, and a second one cutting the graceful part of a shutdown short.
#pragma once

#include <csignal>
#include <functional>

namespace sy {

// Blocks SIGINT and SIGTERM in the calling thread and returns them as a set for sigwait. Call it
// before any thread starts: threads inherit the mask, so no other thread takes the signal.
sigset_t block_stop_signals();

// Waits up to `seconds` (in 100 ms steps) until done() holds; false when a SIGINT/SIGTERM (blocked,
// in `sigs`) cut the wait short. Used for the drain after the first signal.
bool wait_unless_signalled(const sigset_t& sigs, double seconds, const std::function<bool()>& done);

}  // namespace sy
