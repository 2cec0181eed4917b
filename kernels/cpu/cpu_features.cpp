#include "kernels/cpu/cpu_features.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace sy::cpu {
namespace {

// Linux x86 ABI (asm/prctl.h); the XSTATE component number of the tile data is not in older headers.
constexpr int k_arch_get_xcomp_perm = 0x1022;
constexpr int k_arch_req_xcomp_perm = 0x1023;
constexpr int k_xfeature_xtiledata = 18;
constexpr uint64_t k_xcr0_tiles = (1ull << 17) | (1ull << 18);  // XTILECFG + XTILEDATA

bool cpu_has_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool bf16 = (d >> 22) & 1, tile = (d >> 24) & 1, int8 = (d >> 25) & 1;
  return tile && bf16 && int8;
}

// XCR0 (read with xgetbv when the OS has set CR4.OSXSAVE): which register states the OS saves.
uint64_t xcr0() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0;
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// An AMD CPU, or a Hygon one (AMD's Zen cores): the CPUID vendor string, EBX EDX ECX of leaf 0.
bool vendor_is_amd() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  char v[13] = {};
  std::memcpy(v, &b, 4);
  std::memcpy(v + 4, &d, 4);
  std::memcpy(v + 8, &c, 4);
  return std::strcmp(v, "AuthenticAMD") == 0 || std::strcmp(v, "HygonGenuine") == 0;
}

// Linux enables the tile data state per process, on request: without it the first tile
// instruction is killed with SIGILL. The permission then holds for every thread of the process.
bool request_amx_permission() {
  if (syscall(SYS_arch_prctl, k_arch_req_xcomp_perm, k_xfeature_xtiledata) != 0) return false;
  uint64_t perm = 0;
  if (syscall(SYS_arch_prctl, k_arch_get_xcomp_perm, &perm) != 0) return false;
  return (perm >> k_xfeature_xtiledata) & 1;
}

}  // namespace

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
    r.amd = vendor_is_amd();
    const char* pf = std::getenv("SY_KQ_PREFETCH");  // "0" or "1"; anything else is ignored
    r.kq_prefetch_forced = pf && (std::strcmp(pf, "0") == 0 || std::strcmp(pf, "1") == 0);
    r.kq_prefetch = r.kq_prefetch_forced ? std::strcmp(pf, "1") == 0 : !r.amd;
    const char* forced = std::getenv("SY_CPU_ISA");
    const bool forced_avx2 = forced && std::strcmp(forced, "avx2") == 0;
    const bool forced_avx512 = forced && std::strcmp(forced, "avx512") == 0;
    const bool forced_vnni = forced && std::strcmp(forced, "avx512-vnni") == 0;
    const bool avx512_kernels = r.avx512_vnni && r.avx512_bf16;  // the AMX kernels' activations need them
    if (forced_avx2) r.avx512 = r.avx512_vnni = r.avx512_bf16 = false;
    if (forced_vnni) r.avx512_bf16 = false;  // as an Ice Lake or Cascade Lake Xeon
    if (!avx512_kernels || !cpu_has_amx()) {
      r.amx = amx_state::absent;
    } else if (forced_avx2 || forced_avx512 || forced_vnni) {
      r.amx = amx_state::forced_off;  // no permission asked: the process stays as it was
    } else if ((xcr0() & k_xcr0_tiles) != k_xcr0_tiles) {
      r.amx = amx_state::os_disabled;
    } else {
      r.amx = request_amx_permission() ? amx_state::usable : amx_state::refused;
    }
    return r;
  }();
  return f;
}

namespace {
std::atomic<bool> force_portable{false};
std::atomic<bool> force_no_amx{false};
std::atomic<bool> force_no_bf16{false};
}  // namespace

void force_portable_kernels(bool on) { force_portable.store(on); }
void force_amx_off(bool on) { force_no_amx.store(on); }
void force_bf16_off(bool on) { force_no_bf16.store(on); }

bool use_avx512_vnni_kernels() {
  const auto& f = cpu_features();
  return !force_portable.load(std::memory_order_relaxed) && f.avx512 && f.avx512_vnni;
}

bool kq_line_prefetch() { return cpu_features().kq_prefetch; }

const char* kq_line_prefetch_status() {
  const auto& f = cpu_features();
  if (f.kq_prefetch_forced) return f.kq_prefetch ? "on (SY_KQ_PREFETCH=1)" : "off (SY_KQ_PREFETCH=0)";
  return f.kq_prefetch ? "on" : "off (an AMD CPU; SY_KQ_PREFETCH=1 forces it)";
}

bool use_avx512_kernels() {
  return use_avx512_vnni_kernels() && cpu_features().avx512_bf16 && !force_no_bf16.load(std::memory_order_relaxed);
}

bool use_amx_kernels() {
  return cpu_features().amx == amx_state::usable && !force_no_amx.load(std::memory_order_relaxed) &&
         use_avx512_kernels();
}

const char* kernel_isa_name() {
  if (use_amx_kernels()) return "amx+avx512-vnni-bf16";
  if (use_avx512_kernels()) return "avx512-vnni-bf16";
  return use_avx512_vnni_kernels() ? "avx512-vnni" : "avx2-fma";
}

const char* amx_status() {
  switch (cpu_features().amx) {
    case amx_state::absent:
      return "no AMX on this CPU";
    case amx_state::os_disabled:
      return "AMX present, tile state not enabled by the OS (XCR0)";
    case amx_state::refused:
      return "AMX present, permission refused by the kernel (arch_prctl ARCH_REQ_XCOMP_PERM)";
    case amx_state::forced_off:
      return "AMX present, off (SY_CPU_ISA)";
    case amx_state::usable:
      break;
  }
  if (!use_amx_kernels()) return "AMX usable, off in this process (forced)";
  return "AMX in use: prompt GEMM tdpbf16ps, integer panels at 16+ tokens tdpbsud";
}

}  // namespace sy::cpu
