#!/usr/bin/env bash
# Builds llama-cpp-python (which compiles llama.cpp for this CPU) into .venv-bench, for the
# side-by-side benchmark and for regenerating tests/fixtures. Takes ~10 minutes on 2 cores.
# Not needed to build, run or test Switchyard.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-bench"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import llama_cpp' 2>/dev/null && { echo "llama-cpp-python present in $venv"; exit 0; }
"$venv/bin/pip" install -q numpy llama-cpp-python==0.3.36
"$venv/bin/python" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__)'
