// The machine's memory read bandwidth as the decode kernels see it: all pool threads streaming a
// buffer far larger than the caches (the denominator of a CPU decode step's bandwidth figure).
#pragma once

#include <cstddef>

#include "kernels/cpu/huge_pages.hpp"

namespace sy::cpu {

class thread_pool;

// The probe buffer (written once over the pool) and its measurement. A benchmark holds the probe
// until its last timing: on a VM, freeing a buffer this large lets the host take its pages back
// over the following seconds, and steps timed then run up to 2.5x slower
// (docs/benchmarking.md, "Timings on virtual machines").
class read_probe {
 public:
  explicit read_probe(thread_pool& pool, size_t bytes = size_t{1} << 30);
  // Bytes per second read by the pool's threads summing the buffer (each thread its own
  // contiguous part), best of `rounds` passes after one warm-up pass.
  double measure(thread_pool& pool, int rounds = 3) const;

 private:
  size_t bytes_;
  huge_buffer buf_;
};

}  // namespace sy::cpu
