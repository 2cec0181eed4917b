// Which `--kernels` runs are worth making on this CPU (catch_main.cpp): the default run uses the
// best family the CPU has (AMX + AVX-512, AVX-512, AVX-512 VNNI without BF16, or AVX2), so a
// family is run again only when it exists here and is not that default.
#include <cstring>

#include "kernels/cpu/cpu_features.hpp"

extern "C" const char* sy_kernel_variant_skip(const char* family) {
  // What the CPU has, whatever SY_CPU_ISA says (cpu_features() honours it, so ask CPUID directly).
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("avx512vnni");
  const bool bf16 = vnni && __builtin_cpu_supports("avx512bf16");
  if (std::strcmp(family, "avx2") == 0)
    return vnni ? nullptr : "the default run already uses the avx2 kernels on this CPU (no AVX-512 VNNI)";
  if (std::strcmp(family, "avx512-vnni") == 0) {
    if (!vnni) return "this CPU has no AVX-512 VNNI";
    return bf16 ? nullptr : "the default run already uses the avx512-vnni kernels on this CPU (no AVX-512 BF16)";
  }
  if (!bf16) return "this CPU has no AVX-512 VNNI + BF16";
  // SY_CPU_ISA=avx512 is set: cpu_features() says forced_off exactly when the CPU has AMX.
  if (sy::cpu::cpu_features().amx != sy::cpu::amx_state::forced_off)
    return "the default run already uses the avx512 kernels on this CPU (no AMX)";
  return nullptr;
}
