#!/usr/bin/env python3
"""Start-up time, side by side: how long a worker pod takes from exec to ready, against
llama-server on the same GGUF (docs/benchmarking.md, "Start-up").

  .venv/bin/python tests/bench/bench_startup.py --model FILE [--rounds 3] [--threads 2] [--ctx 4096]

Each round starts llama-server (build/llama.cpp-bench, tests/bench/setup_llamacpp.sh) and then
`switchyard-worker serve` (the first alternates between rounds), each alone on the machine, and
times exec -> the first 200 from llama-server's /health and from the worker's /ready (the probe
a Kubernetes readiness check uses). The file is read once before the first round, so both start
from the page cache. Both hold the same KV cache, --ctx tokens (llama-server `-c`, the worker
`--kv-blocks` of 16 tokens; the worker's default 512 MiB budget would be 4x the 1B file's 4096
tokens, and every byte of it is written before /ready). Prints every round and the ratio of the
medians (Switchyard / llama-server: under 1 is faster); exits 1 when a server never became ready
or nothing was measured.
"""
import argparse
import http.client
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from worker_client import BUILD, ROOT, WORKER, free_port, stop_process  # noqa: E402

LLAMA_SERVER = os.path.join(ROOT, "build", "llama.cpp-bench", "bin", "llama-server")


def status_of(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        c.request("GET", path, headers={"Connection": "close"})
        return c.getresponse().status
    finally:
        c.close()


def time_to_ready(argv, port, path, log_name, timeout_s):
    """Seconds from exec to the first 200 on GET `path`, or None (exited or timed out). The server's
    output goes to BUILD/log_name, one file per server overwritten each round: the last round's (the
    failing one's, when a round fails) is what is left."""
    with open(os.path.join(BUILD, log_name), "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            while time.perf_counter() - t0 < timeout_s:
                if proc.poll() is not None:
                    return None
                try:
                    if status_of(port, path) == 200:
                        return time.perf_counter() - t0
                except OSError:
                    pass
                time.sleep(0.01)
            return None
        finally:
            stop_process(proc, 15, 30)


def llama_server(model, threads, ctx, timeout_s):
    port = free_port()
    argv = [LLAMA_SERVER, "-m", model, "-t", str(threads), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx)]
    return time_to_ready(argv, port, "/health", "startup-llama-server.log", timeout_s)


def switchyard(model, threads, ctx, timeout_s):
    port, link = free_port(), free_port()
    argv = [WORKER, "serve", "--model", model, "--threads", str(threads), "--metrics-port", str(port), "--listen",
            f"tcp://127.0.0.1:{link}", "--block-size", "16", "--kv-blocks", str((ctx + 15) // 16)]
    return time_to_ready(argv, port, "/ready", "startup-worker.log", timeout_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("SY_MODEL"), help="the GGUF file (default: $SY_MODEL)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096, help="KV cache tokens, both servers")
    ap.add_argument("--timeout-s", type=float, default=300)
    a = ap.parse_args()
    if a.ctx < 16:
        sys.exit("bench_startup: --ctx must be at least 16 tokens")
    if not a.model or not os.path.isfile(a.model):
        sys.exit(f"bench_startup: no model file (--model or SY_MODEL): {a.model}")
    for binary in (LLAMA_SERVER, WORKER):
        if not os.access(binary, os.X_OK):
            sys.exit(f"bench_startup: {binary} is missing (tests/bench/setup_llamacpp.sh, cmake --build build)")
    with open(a.model, "rb") as f:  # into the page cache, for both
        while f.read(1 << 24):
            pass
    runs = {"llama-server": [], "switchyard": []}
    starters = {"llama-server": llama_server, "switchyard": switchyard}
    print(f"bench_startup: {os.path.basename(a.model)} ({os.path.getsize(a.model) / 2**20:.0f} MiB), "
          f"{a.threads} threads, {a.ctx} KV tokens each, exec -> ready, seconds")
    for r in range(a.rounds):
        order = ["llama-server", "switchyard"] if r % 2 == 0 else ["switchyard", "llama-server"]
        line = []
        for name in order:
            s = starters[name](a.model, a.threads, a.ctx, a.timeout_s)
            if s is None:
                sys.exit(f"bench_startup: {name} exited or was not ready within {a.timeout_s:.0f} s (its log is in {BUILD})")
            runs[name].append(s)
            line.append(f"{name} {s:.2f}")
        print(f"  round {r + 1}: " + ", ".join(line))
    if not all(runs.values()):
        sys.exit("bench_startup: nothing measured")
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"median: switchyard {med['switchyard']:.2f} s, llama-server {med['llama-server']:.2f} s, "
          f"ratio {med['switchyard'] / med['llama-server']:.2f} (Switchyard / llama-server)")


if __name__ == "__main__":
    main()
