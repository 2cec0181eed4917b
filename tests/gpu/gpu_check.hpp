// A tiny harness for GPU parity tests (docs/cuda-backend.md, "Layout"): each test program compares
// device ops with their CPU reference and exits 0 (pass), 1 (fail) or 77 (no device: ctest reports
// "skipped"). Plain programs rather than Catch2, so that "no device" is a visible skip, not a
// silent pass.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device_info.cuh"

namespace sy::gpu_test {

struct suite {
  int failures = 0, checks = 0;
  // Normalised mean squared error of `got` against `want`: sum((g-w)^2) / sum(w^2).
  static double nmse(const std::vector<float>& got, const std::vector<float>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = static_cast<double>(got[i]) - want[i];
      num += d * d;
      den += static_cast<double>(want[i]) * want[i];
    }
    return den > 0 ? num / den : num;
  }
  void check(bool ok, const std::string& what) {
    ++checks;
    if (!ok) {
      ++failures;
      std::printf("FAIL: %s\n", what.c_str());
    }
  }
  void check_nmse(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
    const double e = got.size() == want.size() ? nmse(got, want) : 1e30;
    bool finite = true;
    for (float g : got) finite &= std::isfinite(g);
    check(finite && e <= tol, what + ": nmse " + std::to_string(e) + " (tolerance " + std::to_string(tol) + ")");
  }
};

// Exit code 77 when no device; else runs `body` and reports.
inline int run(const char* name, const std::function<void(suite&)>& body) {
  if (sy::cuda::device_count() == 0) {
    std::printf("SKIP %s: %s\n", name, sy::cuda::describe_devices().c_str());
    return 77;
  }
  suite s;
  try {
    body(s);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s threw: %s\n", name, e.what());
    return 1;
  }
  // A program that checked nothing did not test anything (docs/testing.md): that is a failure.
  const bool ok = s.failures == 0 && s.checks > 0;
  std::printf("%s %s: %d checks, %d failed\n", ok ? "PASS" : "FAIL", name, s.checks, s.failures);
  return ok ? 0 : 1;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace sy::gpu_test
