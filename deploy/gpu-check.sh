#!/usr/bin/env bash
# The prepared GPU check (issue 6), sized for a few minutes of device time: build for the
# local GPU's architecture (sm_90 on H100/H200), run the `gpu`-labelled tests (per-kernel
# parity against the CPU reference, end-to-end CUDA vs CPU top-1 agreement), and print a short
# table last. Needs the model file (deploy/setup.sh, or copy models/ along).
#   BUILD_DIR (build-gpu)   CUDA_ARCH (90)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build-gpu}
arch=${CUDA_ARCH:-90}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DBUILD_TESTING=ON >/dev/null || exit 1
cmake --build "$build" --target test_cuda_smoke test_cuda_ops test_cuda_attention test_cuda_sampling \
  test_cuda_forward -- -j"$(nproc)" || exit 1
t1=$(date +%s)
(cd "$build" && ctest -L gpu -V --timeout 300) | tee "$build/gpu-ctest.log"
rc=${PIPESTATUS[0]}
echo
echo "== gpu-check summary (build ${t1}-${t0}s) =="
grep -E "(PASS|FAIL|SKIP) |agreement|tests passed" "$build/gpu-ctest.log" | sed 's/^/  /'
exit "$rc"
