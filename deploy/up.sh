#!/usr/bin/env bash
# Brings Switchyard up on this machine: installs what is missing, fetches the default model,
# builds, and (for now, until the router and cluster launcher land) asks the worker a question
# through the generate CLI. Extra arguments go to `switchyard-worker generate`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash deploy/setup.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target switchyard-worker
question=${QUESTION:-"How do I register an account on a website? Answer in three short steps."}
echo "switchyard: asking the worker: $question"
"$build/worker/switchyard-worker" generate --chat --prompt "$question" --max-tokens 200 --stats "$@"
