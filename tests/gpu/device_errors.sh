#!/usr/bin/env bash
# switchyard-worker startup errors on the device flags (docs/cuda-backend.md, "Using it"): each ends
# with one clear line on stderr and exit code 1, never a crash. Runs with or without a GPU, with or
# without CUDA in the build. Exit 77 (skipped) without the model file.
#   usage: device_errors.sh SWITCHYARD_WORKER MODEL [SUBCOMMAND]
# SUBCOMMAND: `serve` (default), or `serve-check` for switchyard-bench (SY_DEVICE_ONLY builds:
# serve's start-up without sockets, the same engine set-up and messages).
set -u
bin=$1
model=$2
serve=${3:-serve}
[ -f "$model" ] || { echo "SKIP: model file $model not found"; exit 77; }
fails=0
# expect WHAT PATTERN ARGS...: exit code 1 and PATTERN (grep -E) in stderr.
expect() {
  local what=$1 pattern=$2
  shift 2
  local err rc
  err=$(timeout 120 "$bin" "$serve" --model "$model" --metrics-port -1 --listen tcp://127.0.0.1:0 "$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -eq 1 ] && echo "$err" | grep -Eq -e "$pattern"; then
    echo "ok: $what: $err"
  else
    echo "FAIL: $what: exit $rc, stderr: $err"
    fails=$((fails + 1))
  fi
}
expect "unknown device" "--device: 'tpu' is not cpu, cuda or cuda:N" --device tpu
expect "malformed index" "--device: 'cuda:x' is not" --device cuda:x
expect "bad --cuda-graphs" "--cuda-graphs must be on or off" --device cuda:0 --cuda-graphs maybe
# The executable itself links no CUDA library: a CPU worker never maps the CUDA runtime or cuBLAS
# (builds with CUDA load them from the module, only for --device cuda).
if needed=$(readelf -d "$bin" 2>/dev/null | grep NEEDED) && echo "$needed" | grep -Eq "libcuda|libcublas"; then
  echo "FAIL: $bin links CUDA libraries: $needed"
  fails=$((fails + 1))
fi
info=$("$bin" info --model "$model")
if echo "$info" | grep -q "^cuda: not built"; then
  expect "no CUDA in the build" "built without CUDA" --device cuda:0
else
  # A module that is not where the worker looks (an image that left it out): named, exit 1.
  SY_CUDA_MODULE=/nonexistent/libswitchyard-cuda.so expect "no CUDA module" \
    "--device cuda:0: the CUDA module did not load \(/nonexistent/libswitchyard-cuda.so: cannot open" --device cuda:0
  if echo "$info" | grep -q "^cuda: the CUDA module did not load"; then
    expect "the CUDA module did not load" "the CUDA module did not load" --device cuda:0
  elif echo "$info" | grep -q "^cuda: no CUDA device"; then
    expect "no device" "cuda:0: no CUDA device" --device cuda:0
    expect "no device (index)" "cuda:3: no CUDA device" --device cuda:3
  else
    expect "bad device index" "cuda:99: no such device" --device cuda:99
    expect "KV arena larger than the device" "out of device memory" --device cuda:0 --kv-blocks 100000000
    expect "q8_0 KV on CUDA" "f16 only" --device cuda:0 --kv-type q8_0
  fi
fi
[ "$fails" -eq 0 ] && echo "PASS device_errors" || echo "FAIL device_errors: $fails"
[ "$fails" -eq 0 ]
