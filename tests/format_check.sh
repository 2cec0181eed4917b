#!/usr/bin/env bash
# Fails when a tracked C++/CUDA source is not formatted per .clang-format (STYLE.md item 18).
# Exit 77 (ctest: skipped) where clang-format or git is missing.
cd "$(dirname "$0")/.." || exit 1
command -v clang-format >/dev/null && git rev-parse --git-dir >/dev/null 2>&1 || { echo "SKIP: no clang-format or git"; exit 77; }
files=$(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
if ! out=$(echo "$files" | xargs clang-format --dry-run --Werror 2>&1); then
  echo "$out" | grep -E '^[^ ].*(warning|error):' | head -20
  echo "run: git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format -i"
  exit 1
fi
echo "formatted: $(echo "$files" | wc -l) files"
