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
# Every process a stage starts inherits SY_TEST_RUN in its environment; none may outlive the
# stage (a failed test's servers would hold ports and cores for whatever runs next).
run_mark="SY_TEST_RUN=sy-$$-$(date +%s%N)"
leftovers_of() {  # $1: the stage's name. Lists, kills and fails on processes carrying the mark.
  local e pid pids=()
  for e in /proc/[0-9]*/environ; do
    pid=${e#/proc/}
    pid=${pid%/environ}
    grep -qszxF "$run_mark" "$e" 2>/dev/null && pids+=("$pid")
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  echo "FAIL: $1 left ${#pids[@]} process(es) running:" >&2
  ps -o pid=,etime=,args= -p "$(IFS=,; echo "${pids[*]}")" >&2 || true
  kill -9 "${pids[@]}" 2>/dev/null || true
  return 1
}
cd "$build"
rc=0
env "$run_mark" ctest --output-on-failure --timeout 900 ${CTEST_ARGS:-} || rc=$?
cd "$root"
leftovers_of ctest || rc=1
[ "$rc" -eq 0 ] || exit "$rc"
if [ "${SANITIZE:-1}" = 0 ]; then
  echo "SKIP: sanitizer stage (SANITIZE=0)"
else
  env "$run_mark" bash tests/sanitize.sh || rc=$?
  leftovers_of "the sanitizer stage" || rc=1
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || exit "$rc"
fi
