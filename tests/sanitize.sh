#!/usr/bin/env bash
# The sanitizer stage of the test command (tests/run.sh runs it after the main suite;
# docs/reliability.md "Fuzzing and sanitizers"), in build folders of its own made with clang,
# -O1 and line tables only: a cold build of them has to fit CI's budget.
#  1. ASan + UBSan + libFuzzer (SY_SANITIZE, SY_FUZZ) in SAN_BUILD_DIR: targets sy_sanitize_checks
#     (the fuzz harnesses and the unit tests of the code they reach) and switchyard-router, then
#     ctest labels `fuzz` and `unit` there.
#  2. ThreadSanitizer (SY_TSAN) in TSAN_BUILD_DIR: target sy_tsan_checks, the threaded code that
#     goes through neither CAF nor libzmq (Debian's builds of those are not instrumented).
#  3. The integration tests where the router meets hostile input and lifecycle paths
#     (SAN_INTEGRATION below) against part 1's router and the main build's Release worker: the
#     stage fails on any sanitizer report (SAN_BUILD_DIR/sanitizer-reports/) and on any router that
#     did not exit 0 on SIGTERM (LeakSanitizer runs at that exit).
#   SAN_BUILD_DIR     ASan build folder (default: build-san)
#   TSAN_BUILD_DIR    TSan build folder (default: build-tsan)
#   BUILD_DIR         the main build, whose worker part 3 runs (default: build, as tests/run.sh)
#   FUZZ_SECONDS      seconds each harness runs (default: 10)
#   SY_SOAK_REQUESTS  requests in part 3's soak (default here: 200)
#   SANITIZE_WORKER   1: also build switchyard-worker under ASan + UBSan and run test_worker.py
#                     against it; by hand only: two to five more minutes on 2 cores
#                     (docs/reliability.md)
# Exit 77 with the reason when clang, its sanitizer/libFuzzer runtimes, the venv or the main
# build's worker are missing (a failure when CI is set; deploy/setup.sh installs them).
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
  "-DCMAKE_CXX_FLAGS_DEBUG=$flags" -DSY_CUDA=OFF -DSY_SANITIZE=ON -DSY_FUZZ=ON "-DSY_FUZZ_SECONDS=${FUZZ_SECONDS:-10}"
san_targets=(sy_sanitize_checks switchyard-router)
[ "${SANITIZE_WORKER:-0}" = 1 ] && san_targets+=(switchyard-worker)
cmake --build "$san" --target "${san_targets[@]}"

# ---- 1. Fuzzers and unit tests. detect_leaks: LeakSanitizer runs at exit of every test binary too.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
  ctest --test-dir "$san" --output-on-failure --timeout 600 -j "$(nproc)" -L '^(fuzz|unit)$'

# ---- 2. ThreadSanitizer on the router's threaded code that goes through neither CAF nor libzmq
# (Debian's builds of those are not instrumented: their threads' accesses would read as races):
# the HTTP server (I/O threads, answers and SSE events from other threads, disconnects, stop), the
# prep pool (request bodies handed from the I/O threads) and admission control (take_rate() on
# the I/O threads against admit() on the dispatcher's).
tsan=${TSAN_BUILD_DIR:-build-tsan}
echo 'int main() { return 0; }' >"$probe/t.cpp"
clang++ -fsanitize=thread "$probe/t.cpp" -o "$probe/t" 2>/dev/null ||
  skip "clang cannot link ThreadSanitizer (package libclang-rt-14-dev)"
# SY_TSAN; target sy_tsan_checks: test_http_server, test_work_pool, and test_admission_threads (test_admission.cpp
# on admission.cpp and tenants.cpp alone; tests/CMakeLists.txt).
CC=clang CXX=clang++ cmake -S . -B "$tsan" -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=$flags" \
  "-DCMAKE_CXX_FLAGS_DEBUG=$flags" -DSY_CUDA=OFF -DSY_TSAN=ON
cmake --build "$tsan" --target sy_tsan_checks
# halt_on_error: the first race ends the test binary (exit 66), so its test fails.
TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
  ctest --test-dir "$tsan" --output-on-failure --timeout 600 -j "$(nproc)" -R '^test_(http_server|work_pool|admission_threads)/'

# ---- 3. The ASan router in the integration tests where it meets hostile input (malformed and
# oversized requests, wrong keys, frames over the link's limit, clients that stop reading) and
# lifecycle paths (disconnects, cancels, deadlines, ejected, crashing and killed workers, a soak).
# The Release worker keeps the model's share of the run at its normal speed.
SAN_INTEGRATION=(
  test_router.py::test_n_choices_seed_and_logprobs
  test_router.py::test_bad_input_gets_a_specific_4xx
  test_router.py::test_oversized_body_unknown_route_and_wrong_method
  test_router.py::test_request_id_is_echoed_or_generated
  test_router.py::test_client_disconnect_cancels_on_the_worker
  test_router.py::test_tenant_keys_and_rate_limit
  test_admin_security.py
  test_link_security.py::test_a_router_with_the_keys_serves_and_exports_its_link_counters
  test_link_security.py::test_a_worker_sending_a_frame_over_the_routers_limit_is_disconnected
  test_slow_clients.py
  test_cache.py::test_catch_ups_longer_than_the_stream_buffer_are_paced_not_cut
  test_link_faults.py::test_frames_lost_on_the_link_leave_no_hole_in_any_stream
  test_bad_workers.py::test_black_hole_worker_is_ejected_and_requests_still_succeed
  test_bad_workers.py::test_query_of_death_takes_at_most_two_workers_and_ends_with_a_named_502
  test_soak.py
  test_responses.py
)
main_build=$(cd "${BUILD_DIR:-build}" 2>/dev/null && pwd) ||
  skip "no main build folder ${BUILD_DIR:-build} (part 3 runs its worker; tests/run.sh builds it first)"
worker_bin=$main_build/worker/switchyard-worker
[ -x "$worker_bin" ] || skip "no $worker_bin (part 3 runs it; tests/run.sh builds it first)"
[ -x .venv/bin/python ] || skip "no .venv (deploy/setup.sh makes it)"
san_abs=$(cd "$san" && pwd)
reports=$san_abs/sanitizer-reports  # one file per report, named asan.PID
exits=$san_abs/router-exits.txt     # "PID EXIT_CODE" of every router a test stopped (cluster.py)
tests=()
for t in "${SAN_INTEGRATION[@]}"; do tests+=("tests/integration/$t"); done
rm -rf "$reports" "$exits"
mkdir -p "$reports"
# halt_on_error: the first report ends the process (UBSan too: -fno-sanitize-recover), so a test
# sees it die; log_path: the report lands in a file the checks below find, whatever the test did
# with the process's stderr. The same log_path in both: UBSan's wins when both are set.
rcs=()
run_pytest() {  # WORKER_BINARY TEST...
  local worker=$1 rc=0
  shift
  SY_BUILD_DIR=$main_build SY_ROUTER_BIN=$san_abs/router/switchyard-router SY_WORKER_BIN=$worker \
    SY_ROUTER_SANITIZED=1 SY_ROUTER_EXIT_LOG=$exits SY_SOAK_REQUESTS=${SY_SOAK_REQUESTS:-200} \
    ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:log_path=$reports/asan" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/asan" \
    timeout 1200 .venv/bin/python -m pytest -q -rs -p no:cacheprovider "$@" || rc=$?
  rcs+=("$rc")
}
run_pytest "$worker_bin" "${tests[@]}"
# By hand (SANITIZE_WORKER=1): the ASan worker driven over its link as a router drives it.
[ "${SANITIZE_WORKER:-0}" != 1 ] || run_pytest "$san_abs/worker/switchyard-worker" tests/integration/test_worker.py
found=$(find "$reports" -type f | sort)
if [ -n "$found" ]; then
  for f in $found; do
    echo "==== $f"
    cat "$f"
  done >&2
  echo "FAIL: sanitizer reports from the processes above (their PIDs are in the file names)" >&2
  exit 1
fi
# LeakSanitizer runs only in a process that exits: every router must end by itself on SIGTERM,
# with 0 (a leak report makes it 1; a hang past cluster.py's timeout, a kill).
[ -s "$exits" ] || { echo "FAIL: no router was stopped: the leak checks did not run" >&2; exit 1; }
if awk '$2 != 0 { bad = 1 } END { exit !bad }' "$exits"; then
  echo "FAIL: routers that did not exit 0 on SIGTERM (PID, exit code; negative: killed by that signal):" >&2
  awk '$2 != 0' "$exits" >&2
  exit 1
fi
echo "sanitizer stage: $(wc -l <"$exits") ASan routers exited 0 on SIGTERM, no sanitizer report"
for rc in "${rcs[@]}"; do
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || exit "$rc"
done
if [ "${rcs[0]}" -eq 77 ]; then
  skip "every integration test skipped (see pytest's reasons above)"
fi

