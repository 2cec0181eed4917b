// Run-time CPU feature detection for kernel dispatch.
#pragma once

namespace sy::cpu {

// Why the AMX kernels do or do not run on this machine.
enum class amx_state {
  absent,       // the CPU lacks AMX-TILE, AMX-BF16 or AMX-INT8 (or the AVX-512 kernels they extend)
  os_disabled,  // the OS has not enabled the tile state in XCR0
  refused,      // the kernel refused arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) (old kernel, small sigaltstack)
  forced_off,   // SY_CPU_ISA=avx512 or avx2
  usable,       // permission granted: the tile instructions may run in every thread of the process
};

struct features {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512 = false;  // F + BW + VL + DQ
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  amx_state amx = amx_state::absent;
  bool amd = false;                 // CPUID vendor AuthenticAMD or HygonGenuine (Zen cores)
  bool kq_prefetch = false;         // kq_line_prefetch() below
  bool kq_prefetch_forced = false;  // by SY_KQ_PREFETCH
};

// Detected once (the AMX permission is requested then, for the whole process). SY_CPU_ISA in the
// environment forces a smaller kernel family, for comparisons and for testing every path on one
// machine: `avx2` the portable kernels, `avx512` the AVX-512 ones without AMX, `avx512-vnni` the
// AVX-512 integer kernels without BF16 (what an Ice Lake or Cascade Lake Xeon runs).
const features& cpu_features();
// "amx+avx512-vnni-bf16", "avx512-vnni-bf16", "avx512-vnni" or "avx2-fma": the kernel family in use.
const char* kernel_isa_name();
// One line on the AMX kernels: which run, or why none does.
const char* amx_status();
// The AVX-512 kernels that need no BF16 — integer and K panels (VNNI), the q8 activation
// quantizers, attention: AVX-512 F/BW/VL/DQ + VNNI, whether or not the CPU has BF16 (Ice Lake and
// Cascade Lake Xeons do not).
bool use_avx512_vnni_kernels();
// All the AVX-512 kernels: those and the ones that need BF16 (the prompt GEMM's bf16 dot products
// and conversions, the bf16 panels built from K panels).
bool use_avx512_kernels();
// AMX tiles for the prompt GEMM (tdpbf16ps) and the integer panels at 16+ tokens (tdpbsud); implies
// use_avx512_kernels() (the activations are converted by the AVX-512 code).
bool use_amx_kernels();
// Whether the one- and two-token K-panel kernels ask for each super-block's lines in software ahead
// of their loads (kq_prefetch_ahead), and the VNNI integer-panel kernel for each block's: yes on
// CPUs other than AMD's (measured on Intel Sapphire Rapids: faster), no on AMD and Hygon ones
// (measured on Zen 4 for the K panels: the hardware prefetchers alone stream the panels faster;
// docs/cpu-backend.md, "What limits single-stream decode").
// SY_KQ_PREFETCH=1 or 0 in the environment forces it. The status: "on", or "off (why)".
bool kq_line_prefetch();
const char* kq_line_prefetch_status();
// Tests flip this to run the portable kernels on an AVX-512 machine in the same process.
void force_portable_kernels(bool on);
// Tests flip this to run the AVX-512 kernels on an AMX machine in the same process.
void force_amx_off(bool on);
// Tests flip this to run as a CPU without BF16 (and so without AMX): use_avx512_vnni_kernels only.
void force_bf16_off(bool on);

}  // namespace sy::cpu
