#!/usr/bin/env bash
# Makes the generated test models (tests/tools/make_test_models.py) and their llama.cpp
# references under BUILD_DIR/test-models, building llama.cpp's library first
# (tests/tools/build_llamacpp.sh). Cached: reruns only check. This is the `models/generate`
# test's command; the family tests depend on it (ctest fixture `test_models`).
#   test_models.sh BUILD_DIR
# Exit 77 (a visible skip) when a prerequisite cannot be had here (no PyPI for the llama.cpp
# sources or the Python packages) — a failure instead when CI is set.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: test_models.sh BUILD_DIR}" && pwd)
py="$root/.venv/bin/python"
# shellcheck source=tests/tools/skip_lib.sh
. "$root/tests/tools/skip_lib.sh"
[ -x "$py" ] || skip test_models "no $py (run deploy/setup.sh)"
"$py" -c 'import numpy, gguf, tokenizers, sentencepiece, jinja2, diskcache, typing_extensions' 2>/dev/null ||
  skip test_models "the test-model Python packages are missing from .venv (deploy/setup.sh installs them)"
lcpp=$(bash "$root/tests/tools/build_llamacpp.sh" "$build/llama.cpp") || skip test_models "could not build llama.cpp (tests/tools/build_llamacpp.sh)"
export PYTHONPATH="$lcpp/python" LLAMA_CPP_LIB_PATH="$lcpp/lib"
set -e
"$py" "$root/tests/tools/make_test_models.py" --out "$build/test-models"
for ref in "$root"/tests/tools/llamacpp_ref_*.py; do
  [ -e "$ref" ] || continue
  "$py" "$ref" --models "$build/test-models"
done
echo "test_models: ready in $build/test-models"
