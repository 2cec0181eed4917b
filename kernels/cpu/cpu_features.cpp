#include "kernels/cpu/cpu_features.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace sy::cpu {

const features& cpu_features() {
  static const features f = [] {
    features r;
    __builtin_cpu_init();
    r.avx2 = __builtin_cpu_supports("avx2");
    r.fma = __builtin_cpu_supports("fma");
    r.f16c = true;  // implied by the x86-64-v3 baseline
    r.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    r.avx512_vnni = r.avx512 && __builtin_cpu_supports("avx512vnni");
    r.avx512_bf16 = r.avx512 && __builtin_cpu_supports("avx512bf16");
    const char* forced = std::getenv("SY_CPU_ISA");
    if (forced && std::strcmp(forced, "avx2") == 0) {
      r.avx512 = r.avx512_vnni = r.avx512_bf16 = false;
    }
    return r;
  }();
  return f;
}

namespace {
std::atomic<bool> force_portable{false};
}

void force_portable_kernels(bool on) { force_portable.store(on); }

bool use_avx512_kernels() {
  const auto& f = cpu_features();
  return !force_portable.load(std::memory_order_relaxed) && f.avx512 && f.avx512_vnni && f.avx512_bf16;
}

const char* kernel_isa_name() { return use_avx512_kernels() ? "avx512-vnni-bf16" : "avx2-fma"; }

}  // namespace sy::cpu
