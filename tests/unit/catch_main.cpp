// Catch2's main with two rules for every test binary (docs/testing.md, "A test cannot pass by not
// running"): a test case that checks nothing fails (-w NoAssertions, set here because Catch2 v2
// accepts a single -w on the command line and ctest's discovery passes -w NoTests), and a run that
// skipped a test exits 77 (prerequisite.hpp).
//
// `--kernels avx2|avx512-vnni|avx512` runs the binary under that CPU kernel family (SY_CPU_ISA, read once
// when the kernels first run; docs/testing.md "Kernel families"): ctest registers the model-level
// tests once per family. A binary that links tests/unit/kernel_variant.cpp says when the family is
// not worth a run on this CPU (absent, or what the default run already uses): the run then exits
// 77 with the reason, without running anything.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>
#include <iostream>
#include <string>

#include "prerequisite.hpp"

// Defined only in binaries that link kernel_variant.cpp: why `family` need not run here, or null.
extern "C" const char* sy_kernel_variant_skip(const char* family) __attribute__((weak));

int main(int argc, char* argv[]) {
  Catch::Session session;
  std::string kernels;
  using Catch::clara::Opt;
  session.cli(session.cli() | Opt(kernels, "avx2|avx512-vnni|avx512")["--kernels"](
                                  "run under this CPU kernel family (sets SY_CPU_ISA)"));
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  if (!kernels.empty()) {
    if (kernels != "avx2" && kernels != "avx512-vnni" && kernels != "avx512") {
      std::cerr << "--kernels: '" << kernels << "' is not a kernel family (avx2, avx512-vnni, avx512)\n";
      return 2;
    }
    setenv("SY_CPU_ISA", kernels.c_str(), 1);
    if (sy_kernel_variant_skip != nullptr)
      if (const char* why = sy_kernel_variant_skip(kernels.c_str())) {
        std::cerr << "SKIPPED: --kernels " << kernels << ": " << why << "\n";
        return 77;
      }
  }
  auto& config = session.configData();
  config.warnings = static_cast<Catch::WarnAbout::What>(config.warnings | Catch::WarnAbout::NoAssertions);
  return sy::test::exit_code(session.run());
}
