// The machine's memory read bandwidth as the decode kernels see it: all pool threads streaming a
// buffer far larger than the caches (the denominator of a CPU decode step's bandwidth figure).
#pragma once

#include <cstddef>

namespace sy::cpu {

class thread_pool;

// Bytes per second read by `pool`'s threads summing `bytes` of memory (each thread its own
// contiguous part), best of `rounds` passes after one warm-up pass.
double read_bandwidth(thread_pool& pool, size_t bytes = size_t{1} << 30, int rounds = 3);

}  // namespace sy::cpu
