#!/usr/bin/env bash
# The test command: installs what is missing (deploy/setup.sh), builds everything (CUDA too when
# nvcc exists), and runs the whole suite with ctest. CI runs exactly this (.ci/run).
#   BUILD_DIR   build folder (default: build)
#   CTEST_ARGS  extra ctest arguments, e.g. "-R tokenizer" or "-L gpu"
#   SANITIZE    0: skip the sanitizer stage (tests/sanitize.sh: fuzzers, unit tests and the
#               router in integration tests under ASan + UBSan in build-san, SAN_BUILD_DIR; the
#               HTTP server and admission under TSan in build-tsan, TSAN_BUILD_DIR)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash deploy/setup.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
# The benchmark tools' venv (bench/aiperf_smoke) installs from PyPI while the build compiles.
.venv/bin/python tests/bench/bench_venv.py "$build" >"$build/bench-venv.log" 2>&1 &
venv_job=$!
cmake --build "$build"
wait "$venv_job" || true
cd "$build"
ctest --output-on-failure --timeout 900 ${CTEST_ARGS:-}
cd "$root"
if [ "${SANITIZE:-1}" = 0 ]; then
  echo "SKIP: sanitizer stage (SANITIZE=0)"
else
  rc=0
  bash tests/sanitize.sh || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || exit "$rc"
fi
