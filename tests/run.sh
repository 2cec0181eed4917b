#!/usr/bin/env bash
# The test command: installs what is missing (deploy/setup.sh), builds everything (CUDA too when
# nvcc exists), and runs the whole suite with ctest. CI runs exactly this (.ci/run).
#   BUILD_DIR   build folder (default: build)
#   CTEST_ARGS  extra ctest arguments, e.g. "-R tokenizer" or "-L gpu"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash deploy/setup.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build"
cd "$build"
ctest --output-on-failure --timeout 900 ${CTEST_ARGS:-}
