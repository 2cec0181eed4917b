#!/usr/bin/env python3
"""Resident memory of a serving process: Switchyard's worker vs llama-server, same GGUF file, same
KV budget, after the same load. One after the other, not at once.

  * Switchyard: `switchyard-worker serve --kv-memory-mb KV`, driven over its ZeroMQ protocol
    (tests/integration/worker_client.py) like a router: N concurrent requests of P random prompt
    tokens and G new tokens, twice.
  * llama.cpp: `llama-server -np N -c C` with C chosen so its f16 KV cache is the same size
    (C = KV MiB / KV bytes per token), driven with the same token-id prompts over HTTP.

Reported per process after the load: VmRSS and VmHWM (peak) from /proc, the GGUF file size, the KV
budget, and RSS / (file + KV). llama-server comes from tests/bench/setup_llamacpp.sh
(build/llama.cpp-bench/bin/llama-server). Not part of CI.

usage: tests/bench/bench_memory.py --model FILE [--kv-mb 128] [--clients 8] [--prompt 128] [--gen 64]
                                   [--threads 2] [--worker PATH] [--json out.json]
"""
import argparse
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from worker_client import Client, free_port  # noqa: E402


def proc_mem(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def kv_bytes_per_token(model):
    from gguf import GGUFReader
    r = GGUFReader(model)
    arch = r.fields["general.architecture"].contents()
    get = lambda k: r.fields[f"{arch}.{k}"].contents()
    n_head, n_embd = get("attention.head_count"), get("embedding_length")
    n_kv = r.fields.get(f"{arch}.attention.head_count_kv")
    n_kv = n_kv.contents() if n_kv else n_head
    return get("block_count") * 2 * n_kv * (n_embd // n_head) * 2  # K and V, f16


def prompts(a, vocab=1000):
    rng = random.Random(7)
    return [[rng.randrange(10, vocab) for _ in range(a.prompt)] for _ in range(a.clients)]


def run_switchyard(a):
    port, mport = free_port(), free_port()
    worker = a.worker
    p = subprocess.Popen([worker, "serve", "--model", a.model, "--listen", f"tcp://127.0.0.1:{port}", "--metrics-port",
                          str(mport), "--threads", str(a.threads), "--kv-memory-mb", str(a.kv_mb),
                          "--max-running", str(a.clients)], stderr=subprocess.PIPE, text=True)
    try:
        c = Client(f"tcp://127.0.0.1:{port}")
        c.hello()
        for rnd in range(2):
            ids = []
            for i, pr in enumerate(prompts(a)):
                rid = f"r{rnd}-{i}"
                c.submit(rid, pr, max_tokens=a.gen, stream=False, ignore_eos=True)
                ids.append(rid)
            res = c.collect(ids, timeout=1800)
            assert all(r["finish"] for r in res.values()), res
        mem = proc_mem(p.pid)
        c.close()
        return mem
    finally:
        p.terminate()
        p.wait(60)


def run_llama_server(a, kv_tok):
    server = os.path.join(ROOT, "build", "llama.cpp-bench", "bin", "llama-server")
    if not os.path.exists(server):
        sys.exit("llama-server not built: run tests/bench/setup_llamacpp.sh")
    port = free_port()
    n_ctx = a.kv_mb * (1 << 20) // kv_tok
    lib = os.path.join(ROOT, "build", "llama.cpp-bench", "lib")
    env = dict(os.environ, LD_LIBRARY_PATH=lib)
    p = subprocess.Popen([server, "-m", a.model, "-t", str(a.threads), "-np", str(a.clients), "-c", str(n_ctx),
                          "--port", str(port), "--host", "127.0.0.1"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)

        def one(pr):
            body = json.dumps({"prompt": pr, "n_predict": a.gen, "ignore_eos": True, "temperature": 0,
                               "cache_prompt": False}).encode()
            req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=1800) as r:
                return json.load(r)

        for _ in range(2):
            with concurrent.futures.ThreadPoolExecutor(a.clients) as ex:
                list(ex.map(one, prompts(a)))
        return proc_mem(p.pid) | {"n_ctx": n_ctx}
    finally:
        p.terminate()
        p.wait(60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kv-mb", type=int, default=128)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", default=os.path.join(ROOT, "build", "worker", "switchyard-worker"),
                    help="a build with CUDA links the CUDA runtime and cuBLAS (~150 MiB resident even on the "
                         "CPU); -DSY_CUDA=OFF builds do not")
    ap.add_argument("--json")
    a = ap.parse_args()
    file_bytes = os.path.getsize(a.model)
    kv_tok = kv_bytes_per_token(a.model)
    rows = {"switchyard": run_switchyard(a), "llama-server": run_llama_server(a, kv_tok)}
    mib = lambda b: b / (1 << 20)
    base = file_bytes + a.kv_mb * (1 << 20)
    print(f"{os.path.basename(a.model)}: file {mib(file_bytes):.0f} MiB, KV budget {a.kv_mb} MiB "
          f"({a.kv_mb * (1 << 20) // kv_tok} tokens); {a.clients} clients x ({a.prompt} + {a.gen}) tokens, twice")
    print(f"{'':14}{'VmRSS MiB':>12}{'VmHWM MiB':>12}{'RSS / (file + KV)':>20}")
    for name, m in rows.items():
        print(f"{name:14}{mib(m['VmRSS']):12.0f}{mib(m['VmHWM']):12.0f}{m['VmRSS'] / base:19.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": os.path.basename(a.model), "file_bytes": file_bytes, "kv_mb": a.kv_mb,
                       "kv_bytes_per_token": kv_tok, "clients": a.clients, "prompt": a.prompt, "gen": a.gen,
                       "processes": rows}, f, indent=1)


if __name__ == "__main__":
    main()
