#!/usr/bin/env bash
# One fuzz/ test: runs a libFuzzer harness for a bounded time from its seed corpus.
#   run_fuzzer.sh HARNESS SEED_DIR WORK_DIR SECONDS [SEED_COMMAND...]
# SEED_COMMAND, when given, writes more seeds into WORK_DIR/seeds first (inputs that are generated,
# not checked in: the gguf harness's model-format images).
# New inputs go to WORK_DIR/corpus (the checked-in seeds stay untouched), a failing input to
# WORK_DIR/crash-* (or leak-*, timeout-*). Any finding exits non-zero: the test fails.
set -euo pipefail
harness=$1 seeds=$2 work=$3 seconds=$4
shift 4
mkdir -p "$work/corpus" "$work/seeds"
[ $# -eq 0 ] || "$@" "$work/seeds"
# Every seed is run once first (libFuzzer's corpus load), so a regression input fails at once.
# -timeout: one input taking over 10 s is a finding; -rss_limit_mb: so is a run over 2 GiB.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if "$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -error_exitcode=1 \
     -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" "$seeds" "$work/seeds"; then
  exit 0
fi
echo "fuzz: $(basename "$harness") found a problem; replay with: $harness $work/<crash-file>" >&2
exit 1
