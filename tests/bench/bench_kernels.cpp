// bench_kernels: one quantized matrix product (linear::forward_gemv, the decode path) timed on
// every kernel family this CPU runs, side by side in one process: AMX, AVX-512 VNNI (AMX off) and
// the portable AVX2 kernels, alternating rounds, best round of each; on AMX also "amx-prompt", the
// prompt path (linear::forward_gemm: bf16 panels built per call, AMX bf16 tiles) at the same token
// counts, which shows where decode's integer kernel stops paying. Random weights in the GGUF
// layout of the chosen type (the K-quants' scales and mins included), so no model file is needed.
//
//   bench_kernels [--type q4_K|q5_K|q6_K|q4_0|q8_0] [--rows 8192] [--cols 2048] [--tokens 1,16,32,64]
//                 [--threads 2] [--rounds 8]
//
// Prints GMAC/s (multiply-adds of the product per second) and, per token count, the ratio of each
// family to AVX-512 VNNI. Exits 1 when nothing was measured. Figures: docs/cpu-backend.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "tests/unit/amx_test_data.hpp"

using namespace sy::cpu;

namespace {

struct family {
  const char* name;
  bool portable, amx_off;
  bool prompt = false;  // the prompt path (forward_gemm: bf16 panels on AMX) instead of decode's
};

std::vector<uint8_t> random_weights(weight_type t, int64_t rows, int64_t cols) {
  return is_k_quant(t) ? amx_test::random_k_weights(t, rows, cols) : amx_test::random_int_weights(t, rows, cols);
}

double best_seconds(const linear& l, bool prompt, const std::vector<float>& x, int64_t n, std::vector<float>& y,
                    thread_pool& pool) {
  double best = 1e30;
  for (int rep = 0; rep < 10; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    if (prompt)
      l.forward_gemm(x.data(), l.cols(), n, y.data(), l.rows(), pool);
    else
      l.forward_gemv(x.data(), l.cols(), n, y.data(), l.rows(), pool);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string type = "q4_K", tokens = "1,16,32,64";
  int64_t rows = 8192, cols = 2048;
  int threads = 2, rounds = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--type")
      type = v;
    else if (k == "--rows")
      rows = std::stoll(v);
    else if (k == "--cols")
      cols = std::stoll(v);
    else if (k == "--tokens")
      tokens = v;
    else if (k == "--threads")
      threads = std::stoi(v);
    else if (k == "--rounds")
      rounds = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_kernels: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  weight_type t{};
  bool found = false;
  for (weight_type c : {weight_type::q4_0, weight_type::q8_0, weight_type::q4_k, weight_type::q5_k, weight_type::q6_k})
    if (type == weight_type_name(c)) t = c, found = true;
  if (!found || cols % 256 != 0 || rows < 16) {
    std::fprintf(stderr, "bench_kernels: --type q4_0|q8_0|q4_K|q5_K|q6_K, --cols a multiple of 256, --rows >= 16\n");
    return 2;
  }
  std::vector<int64_t> ns;
  std::stringstream ss(tokens);
  for (std::string s; std::getline(ss, s, ',');) ns.push_back(std::stoll(s));

  std::vector<family> fams;
  if (cpu_features().amx == amx_state::usable) {
    fams.push_back({"amx", false, false});
    fams.push_back({"amx-prompt", false, false, true});
  }
  if (use_avx512_vnni_kernels()) fams.push_back({"avx512-vnni", false, true});
  fams.push_back({"avx2", true, true});
  thread_pool pool(threads);
  const auto w = random_weights(t, rows, cols);
  // One layer per family: the load-time repack follows the family in force when it is built.
  std::vector<linear> layers;
  for (const family& f : fams) {
    force_portable_kernels(f.portable);
    force_amx_off(f.amx_off);
    layers.emplace_back(t, w.data(), rows, cols, pool);
  }
  std::printf("bench_kernels: %s %lld x %lld, %d threads, best of %d rounds x 10 (alternating families)\n",
              weight_type_name(t), static_cast<long long>(rows), static_cast<long long>(cols), pool.size(), rounds);
  bool measured = false;
  for (int64_t n : ns) {
    const auto x = amx_test::random_floats(static_cast<size_t>(n * cols));
    std::vector<float> y(static_cast<size_t>(n * rows));
    std::vector<double> best(fams.size(), 1e30);
    for (int r = 0; r < rounds; ++r)
      for (size_t f = 0; f < fams.size(); ++f) {
        force_portable_kernels(fams[f].portable);
        force_amx_off(fams[f].amx_off);
        best[f] = std::min(best[f], best_seconds(layers[f], fams[f].prompt, x, n, y, pool));
      }
    double vnni = 0;
    for (size_t f = 0; f < fams.size(); ++f)
      if (std::string(fams[f].name) == "avx512-vnni") vnni = rows * cols * n / best[f] / 1e9;
    std::printf("tokens %4lld:", static_cast<long long>(n));
    for (size_t f = 0; f < fams.size(); ++f) {
      const double g = rows * cols * n / best[f] / 1e9;
      measured = measured || (g > 0 && best[f] < 1e29);
      std::printf("  %s %7.1f GMAC/s", fams[f].name, g);
      if (vnni > 0) std::printf(" (%.2fx)", g / vnni);
    }
    std::printf("\n");
  }
  force_portable_kernels(false);
  force_amx_off(false);
  if (!measured) {
    std::fprintf(stderr, "bench_kernels: nothing measured\n");
    return 1;
  }
  return 0;
}
