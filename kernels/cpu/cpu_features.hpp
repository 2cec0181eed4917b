// Run-time CPU feature detection for kernel dispatch.
#pragma once

namespace sy::cpu {

struct features {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512 = false;  // F + BW + VL + DQ
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
};

// Detected once; SY_CPU_ISA=avx2 in the environment forces the portable kernels
// (for comparisons and for testing both paths on one machine).
const features& cpu_features();
// "avx512-vnni-bf16" or "avx2": the kernel family in use.
const char* kernel_isa_name();
bool use_avx512_kernels();
// Tests flip this to run the portable kernels on an AVX-512 machine in the same process.
void force_portable_kernels(bool on);

}  // namespace sy::cpu
