#include "kernels/cpu/mem_bandwidth.hpp"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"

namespace sy::cpu {

read_probe::read_probe(thread_pool& pool, size_t bytes)
    : bytes_(bytes / sizeof(__m256i) * sizeof(__m256i)), buf_(make_huge_buffer(bytes_)) {
  fill_huge(buf_.get(), bytes_, 1, &pool);
}

double read_probe::measure(thread_pool& pool, int rounds) const {
  const auto* buf = reinterpret_cast<const __m256i*>(buf_.get());
  const size_t n = bytes_ / sizeof(__m256i);
  std::vector<int64_t> sink(static_cast<size_t>(pool.size()));
  double best = 0;
  for (int r = 0; r <= rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int ith, int nth) {
      int64_t b, e;
      thread_pool::split(static_cast<int64_t>(n), 4, ith, nth, b, e);
      __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t i = b; i + 4 <= e; i += 4) {
        a0 = _mm256_add_epi32(a0, _mm256_load_si256(&buf[i]));
        a1 = _mm256_add_epi32(a1, _mm256_load_si256(&buf[i + 1]));
        a2 = _mm256_add_epi32(a2, _mm256_load_si256(&buf[i + 2]));
        a3 = _mm256_add_epi32(a3, _mm256_load_si256(&buf[i + 3]));
      }
      const __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
      sink[ith] = _mm256_extract_epi32(s, 0);  // keeps the loads
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::max(best, static_cast<double>(n * sizeof(__m256i)) / s);
  }
  return best;
}

}  // namespace sy::cpu
