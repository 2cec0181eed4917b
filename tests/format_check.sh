#!/usr/bin/env bash
# Fails when a tracked C++/CUDA source is not formatted per .clang-format (docs/engineering.md,
# "One format").
# Exit 77 (ctest: skipped) where clang-format or git is missing; with CI set that is a failure
# (docs/testing.md: a check cannot pass by not running).
cd "$(dirname "$0")/.." || exit 1
if ! command -v clang-format >/dev/null || ! git rev-parse --git-dir >/dev/null 2>&1; then
  echo "SKIP: no clang-format or git"
  [ -n "${CI:-}" ] && exit 1
  exit 77
fi
files=$(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
if ! out=$(echo "$files" | xargs clang-format --dry-run --Werror 2>&1); then
  echo "$out" | grep -E '^[^ ].*(warning|error):' | head -20
  echo "run: git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format -i"
  exit 1
fi
# ctest splits a discovered test name at ';' (CMake's list separator) into two tests that fail.
bad=$(git ls-files 'tests/*.cpp' | python3 -c '
import re, sys
for path in sys.stdin.read().split():
    src = open(path, encoding="utf-8").read()
    for m in re.finditer(r"TEST_CASE\(\s*((?:\"(?:[^\"\\\\]|\\\\.)*\"\s*)+)", src):
        name = "".join(re.findall(r"\"((?:[^\"\\\\]|\\\\.)*)\"", m.group(1)))
        if ";" in name:
            print(path + ": " + name)
')
if [ -n "$bad" ]; then
  echo "a Catch2 test name contains ';' (ctest splits it in two): $bad"
  exit 1
fi
echo "formatted: $(echo "$files" | wc -l) files"
