#!/usr/bin/env bash
# Runs a test on the generated model families (tests/CMakeLists.txt): a visible skip (exit 77, the
# reason on stderr) when the models were not generated, a failure when CI is set.
#   model_families.sh MODELS_DIR COMMAND [ARGS...]
set -uo pipefail
dir=$1
shift
if [ ! -s "$dir/manifest.json" ]; then
  echo "SKIP: no generated models in $dir (the models/generate test makes them: tests/tools/test_models.sh)" >&2
  [ -n "${CI:-}" ] && exit 1
  exit 77
fi
SY_TEST_MODELS_DIR="$dir" exec "$@"
