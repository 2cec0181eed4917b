#!/usr/bin/env bash
# Starts, stops or shows a local Switchyard cluster: N workers + one router on loopback.
#   deploy/cluster.sh start [--model FILE]... [--workers N] [--port P] [--threads T] [--kv-memory-mb M]
#                           [--tenants FILE] [--redis-port R | --no-redis]
#   deploy/cluster.sh stop | status
# --model (repeatable; default SmolLM2-135M-Instruct Q4_1): worker i serves model i mod the number
# of models, and N defaults to that number, so `--model A.gguf --model B.gguf` is one worker each;
# the router routes requests by their `model` field (the file name without .gguf).
# Workers listen on tcp://127.0.0.1:5555.. (metrics on 9100..), the router on http://127.0.0.1:P
# (8000), Redis (the response cache, deploy/redis.conf) on 127.0.0.1:R (6380). Logs and pids live in
# run/. Expects a build (deploy/up.sh does everything).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
run="$root/run"
models=()
cmd=${1:-status}
shift || true

workers= port=8000 threads=$(nproc) kv_mb=512 tenants= redis_port=6380
while [ $# -gt 0 ]; do
  case "$1" in
    --model) models+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --kv-memory-mb) kv_mb=$2; shift 2 ;;
    --tenants) tenants=$2; shift 2 ;;
    --redis-port) redis_port=$2; shift 2 ;;
    --no-redis) redis_port=; shift ;;
    *) echo "cluster: unknown option $1" >&2; exit 2 ;;
  esac
done

stop_all() {
  for f in "$run"/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
  done
}

case "$cmd" in
  start)
    [ ${#models[@]} -gt 0 ] || models=("$root/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    for m in "${models[@]}"; do [ -f "$m" ] || { echo "cluster: no model file $m" >&2; exit 2; }; done
    workers=${workers:-${#models[@]}}
    mkdir -p "$run"
    stop_all
    per_worker=$(( threads / workers )); [ "$per_worker" -ge 1 ] || per_worker=1
    endpoints=
    for i in $(seq 0 $((workers - 1))); do
      ep="tcp://127.0.0.1:$((5555 + i))"
      model=${models[$((i % ${#models[@]}))]}
      "$build/worker/switchyard-worker" serve --model "$model" --listen "$ep" --metrics-port $((9100 + i)) \
        --threads "$per_worker" --kv-memory-mb "$kv_mb" --worker-id "worker-$i" >"$run/worker-$i.log" 2>&1 &
      echo $! >"$run/worker-$i.pid"
      endpoints="${endpoints:+$endpoints,}$ep"
    done
    extra=()
    [ -n "$tenants" ] && extra=(--tenants "$tenants")
    # The example tenants' keys are public: the router refuses them unless told this is a demo
    # (this local cluster listens on loopback only).
    [ -n "$tenants" ] && [ "$(realpath "$tenants")" = "$(realpath "$root/deploy/tenants.example.json")" ] &&
      extra+=(--allow-example-keys)
    if [ -n "$redis_port" ]; then
      redis-server "$root/deploy/redis.conf" --port "$redis_port" --daemonize no >"$run/redis.log" 2>&1 &
      echo $! >"$run/redis.pid"
      for _ in $(seq 1 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
      extra+=(--redis "redis://127.0.0.1:$redis_port")
    fi
    "$build/router/switchyard-router" --port "$port" --workers "$endpoints" "${extra[@]}" >"$run/router.log" 2>&1 &
    echo $! >"$run/router.pid"
    # With tenants, /v1/models needs a key: the first key of the file's first tenant.
    auth=()
    if [ -n "$tenants" ]; then
      key=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["tenants"][0]["keys"][0])' "$tenants" \
        2>/dev/null || true)
      [ -n "$key" ] && auth=(-H "Authorization: Bearer $key")
    fi
    for _ in $(seq 1 300); do
      # Ready when the router is, and lists every model (each worker's welcome has arrived).
      listed=$(curl -sf "${auth[@]}" "http://127.0.0.1:$port/v1/models" 2>/dev/null | grep -o '"object":"model"' | wc -l || true)
      if curl -sf "http://127.0.0.1:$port/ready" >/dev/null 2>&1 &&
         [ "$listed" -ge "$(printf '%s\n' "${models[@]}" | sort -u | wc -l)" ]; then
        echo "cluster: router http://127.0.0.1:$port ready with $workers worker(s) ($per_worker threads each)${redis_port:+, Redis cache on 127.0.0.1:$redis_port}; logs in run/"
        exit 0
      fi
      if ! kill -0 "$(cat "$run/router.pid")" 2>/dev/null; then cat "$run/router.log" >&2; exit 1; fi
      sleep 0.2
    done
    echo "cluster: not ready after 60 s; see run/*.log" >&2
    exit 1
    ;;
  stop)
    stop_all
    echo "cluster: stopped"
    ;;
  status)
    for f in "$run"/*.pid; do
      [ -f "$f" ] || { echo "cluster: not running"; exit 0; }
      name=$(basename "$f" .pid)
      if kill -0 "$(cat "$f")" 2>/dev/null; then echo "$name: running (pid $(cat "$f"))"; else echo "$name: dead"; fi
    done
    curl -s "http://127.0.0.1:$port/ready" && echo
    ;;
  *) echo "usage: deploy/cluster.sh start|stop|status [options]" >&2; exit 2 ;;
esac
