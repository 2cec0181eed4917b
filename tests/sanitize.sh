#!/usr/bin/env bash
# The sanitizer stage of the test command (tests/run.sh runs it after the main suite; issue 13,
# docs/reliability.md "Fuzzing and sanitizers"): a second build folder made with clang, ASan +
# UBSan and libFuzzer (SY_SANITIZE, SY_FUZZ) in which only target sy_sanitize_checks is built —
# the fuzz harnesses and the unit tests of the code they reach — then ctest runs labels `fuzz`
# and `unit` there. -O1 and line tables only: a cold build of it has to fit CI's budget.
#   SAN_BUILD_DIR  build folder (default: build-san)
#   FUZZ_SECONDS   seconds each harness runs (default: 20)
# Exit 77 with the reason when clang or its sanitizer/libFuzzer runtimes are missing (a failure
# when CI is set; deploy/setup.sh installs them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
san=${SAN_BUILD_DIR:-build-san}
skip() {
  echo "SKIP: sanitizer stage: $1" >&2
  [ -n "${CI:-}" ] && exit 1
  exit 77
}
command -v clang++ >/dev/null && command -v clang >/dev/null || skip "no clang (deploy/setup.sh installs it)"
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cpp"
clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>/dev/null ||
  skip "clang cannot link libFuzzer with ASan + UBSan (package libclang-rt-14-dev)"
flags="-O1 -gline-tables-only"
CC=clang CXX=clang++ cmake -S . -B "$san" -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=$flags" \
  "-DCMAKE_CXX_FLAGS_DEBUG=$flags" -DSY_CUDA=OFF -DSY_SANITIZE=ON -DSY_FUZZ=ON "-DSY_FUZZ_SECONDS=${FUZZ_SECONDS:-20}"
cmake --build "$san" --target sy_sanitize_checks
# detect_leaks: LeakSanitizer runs at exit of every test binary too.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
  ctest --test-dir "$san" --output-on-failure --timeout 600 -j "$(nproc)" -L '^(fuzz|unit)$'
