#!/usr/bin/env bash
# Brings Switchyard up on this machine: installs what is missing, fetches the default model,
# builds, starts a local cluster (workers + router, deploy/cluster.sh) and asks it a question
# through the OpenAI-compatible API. Options go to `deploy/cluster.sh start`
# (e.g. --workers 2 --port 8000). Stop it with: deploy/cluster.sh stop
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash deploy/setup.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target switchyard-worker switchyard-router
BUILD_DIR="$root/$build" bash deploy/cluster.sh start "$@"
port=8000
args=("$@")
for i in "${!args[@]}"; do [ "${args[$i]}" = "--port" ] && port=${args[$((i + 1))]}; done
question=${QUESTION:-"How do I register an account on a website? Answer in three short steps."}
body=$(printf '{"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 200, "temperature": 0,
  "messages": [{"role": "user", "content": "%s"}]}' "$question")
echo "switchyard: asking: $question"
echo "+ curl -s http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' -d '...'"
curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" |
  python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["choices"][0]["message"]["content"]); print("usage:", r["usage"])'
cat <<MSG

switchyard: the cluster is running (router http://127.0.0.1:$port, logs in run/). Try:
  curl -N http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "SmolLM2-135M-Instruct.Q4_1", "stream": true, "messages": [{"role": "user", "content": "Hi!"}]}'
  curl http://127.0.0.1:$port/metrics
Stop it with: deploy/cluster.sh stop
MSG
