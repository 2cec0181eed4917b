#include "kernels/cpu/cpu_features.hpp"

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

bool use_avx512_kernels() {
  const auto& f = cpu_features();
  return f.avx512 && f.avx512_vnni && f.avx512_bf16;
}

const char* kernel_isa_name() { return use_avx512_kernels() ? "avx512-vnni-bf16" : "avx2-fma"; }

}  // namespace sy::cpu
