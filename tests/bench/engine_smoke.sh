#!/bin/bash
# bench/engine_smoke: `switchyard-worker bench-engine` runs its decode, batching and prefix sections
# on the demo model at a tiny size and prints every table (decode with the read-bandwidth probe,
# batching with all levels both ways on one engine, prefix with and without caching); a section
# that measured nothing exits non-zero. Checks that the benchmark runs, not how fast.
#   engine_smoke.sh WORKER MODEL
set -euo pipefail
worker=$1 model=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/tools/skip_lib.sh
. "$root/tests/tools/skip_lib.sh"
[ -f "$model" ] || skip bench/engine_smoke "no model at $model (deploy/up.sh fetches it)"
out=$("$worker" bench-engine --model "$model" --sections decode,batching,prefix --concurrency 1,3 \
  --prompt-tokens 16 --gen-tokens 6 --threads 2)
echo "$out"
for want in '^\[decode\]' 'memory read bandwidth' '^ +3 +[0-9.]+ +[0-9]+' '^\[batching\]' \
  '^ +3 +[0-9.]+ +[0-9.]+ +[0-9.]+x' '^\[prefix\]' 'speed-up: p50 [0-9.]+x'; do
  grep -Eq "$want" <<<"$out" || { echo "engine_smoke: no line matching '$want'" >&2; exit 1; }
done
echo "engine_smoke: every section printed its table"
