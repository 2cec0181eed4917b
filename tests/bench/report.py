#!/usr/bin/env python3
"""The benchmark report (docs/benchmarking.md, "The report: Switchyard and llama-server side by
side"): the workloads described there, run with the field's own client, aiperf (and guidellm when
asked), against Switchyard and, side by side in the same run, llama-server on the same GGUF — then
JSON and PNG plots.

  SY_BUILD_DIR=build .venv/bin/python tests/bench/report.py [--levels 1,2,4,8] [--img docs/img]
                                                            [--workloads sweep,prefix,cache]

What it starts: one worker (--threads T) behind a router with a Redis response cache, and
llama-server (build/llama.cpp-bench, tests/bench/setup_llamacpp.sh) with -t T, -np = the highest
concurrency, -c = np x the per-request context, --alias the served name. Both stay up; only one is
loaded at a time, and each concurrency level runs on both before the next (the first server
alternates), so drift on a shared machine hits both.

Workloads (each with aiperf --tokenizer DIR from switchyard-worker export-tokenizer):
  sweep   fixed lengths with ignore_eos (--isl / --osl), concurrency levels --levels: output tok/s,
          TTFT / ITL / E2E p50 and p99; for Switchyard also the router's own TTFT and ITL histograms
          over the same requests (what the server measured, without the load generator's delay).
  prefix  TTFT with --prefixes shared prefixes of --prefix-len tokens before a --isl suffix vs
          unique prompts of the same total length (concurrency --prefix-concurrency).
  cache   exact repeats: each of --repeats prompts sent twice at temperature 0 (a plain client,
          one at a time): first vs repeated request, TTFT and E2E. Switchyard answers the repeat
          from its Redis response cache; llama-server recomputes it (reusing its slot's prompt cache).
  guidellm  with --guidellm: one concurrent-profile run per server through guidellm (its venv pulls
          transformers, ~600 MB: kept out of CI for its install time).

Outputs BUILD/bench-report/report.json, and PNGs drawn by tests/bench/report_plots.py in the bench
venv (matplotlib); --img DIR copies each PNG under 200 KB there as bench-NAME.png (the README's
docs/img).
"""
import argparse
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import bench_venv  # noqa: E402
from bench_router import quantile_from_histogram  # noqa: E402
from cluster import Redis, Router  # noqa: E402
from worker_client import BUILD, MODEL, ROOT, WORKER, Worker, free_port, stop_process  # noqa: E402

SERVED = os.path.splitext(os.path.basename(MODEL))[0]  # the name both servers answer to: the file's
LLAMA_SERVER = os.path.join(ROOT, "build", "llama.cpp-bench", "bin", "llama-server")


class LlamaServer:
    """llama-server on the same GGUF, set up as a fair peer (its flags: docs/benchmarking.md)."""

    def __init__(self, binary, threads, slots, ctx_per_slot):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(BUILD, f"llama-server-{self.port}.log"), "w")
        self.proc = subprocess.Popen([binary, "-m", MODEL, "--host", "127.0.0.1", "--port", str(self.port), "-t",
                                      str(threads), "-np", str(slots), "-c", str(slots * ctx_per_slot), "--alias",
                                      SERVED], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("llama-server exited: " + open(self.log.name).read()[-2000:])
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("llama-server did not become ready")

    def stop(self):
        stop_process(self.proc, 15, 20)
        self.log.close()


def pct(report, metric, stat):
    v = report.get(metric, {}).get(stat)
    return None if v is None else float(v)


def aiperf(bin_dir, url, tokenizer, out, concurrency, count, isl, osl, extra=()):
    """One `aiperf profile` run (streaming chat, ignore_eos): docs/benchmarking.md's figures."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [os.path.join(bin_dir, "aiperf"), "profile", "--model", SERVED, "--url", url, "--endpoint-type", "chat",
           "--streaming", "--tokenizer", tokenizer, "--request-count", str(count), "--concurrency", str(concurrency),
           "--synthetic-input-tokens-mean", str(isl), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(osl), "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
           "--random-seed", "11", "--artifact-dir", out, "--ui-type", "none", "--workers-max", "1",
           "--record-processors", "1", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"aiperf failed ({r.returncode}): {r.stdout[-3000:]} {r.stderr[-3000:]}")
    rep = json.load(open(os.path.join(out, "profile_export_aiperf.json")))
    return {
        "concurrency": concurrency,
        "requests": pct(rep, "request_count", "avg"),
        "errors": len(rep.get("error_summary") or []),
        # Other processes on a shared machine: the 1-minute load average as the run ended.
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "request_throughput": pct(rep, "request_throughput", "avg"),
        "output_throughput": pct(rep, "output_token_throughput", "avg"),
        **{f"{stat}_{name}_ms": pct(rep, metric, stat) for metric, name in
           (("time_to_first_token", "ttft"), ("inter_token_latency", "itl"), ("request_latency", "e2e"))
           for stat in ("avg", "p50", "p99")},
    }


def router_latency(router, before):
    """The router's own TTFT / ITL (ms) over the requests since `before`: the mean (exact, from the
    histogram's sum and count) and p50 / p99 (interpolated within its buckets, so coarse)."""
    now = router.metrics()
    out = {}
    for name, key in (("switchyard_router_ttft_seconds", "ttft"), ("switchyard_router_inter_token_seconds", "itl")):
        n = now.get(name + "_count", 0) - before.get(name + "_count", 0)
        total = now.get(name + "_sum", 0) - before.get(name + "_sum", 0)
        out[f"router_avg_{key}_ms"] = 1000 * total / n if n else None
        for q in (0.5, 0.99):
            out[f"router_p{int(q * 100)}_{key}_ms"] = 1000 * quantile_from_histogram(now, name, q, before)
    return out


def sse_request(url, body, timeout=300):
    """(TTFT s, E2E s, X-Cache) of one streaming chat request: first content chunk, then [DONE]."""
    host, port = url.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = c.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{url}: {resp.status} {resp.read()[:300]}")
    ttft = None
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        ch = json.loads(line[6:]).get("choices") or [{}]
        if ttft is None and (ch[0].get("delta") or {}).get("content"):
            ttft = time.perf_counter() - t0
    e2e = time.perf_counter() - t0
    cache = resp.getheader("X-Cache", "")
    c.close()
    return ttft if ttft is not None else e2e, e2e, cache


def plain_sweep(url, concurrency, count, isl, osl):
    """The sweep with a plain client instead of aiperf: `count` streaming /v1/completions requests,
    `concurrency` at a time, each `isl` random token ids as the prompt and `osl` new tokens
    (ignore_eos). Output tokens are the servers' own counts (the usage of the last chunk, else one
    per chunk), not a re-tokenization of the text: a random-weight model's text re-tokenizes to far
    fewer tokens than were generated, which makes aiperf's figures meaningless on such files."""
    import random
    import threading
    host, port = url.split("//")[1].split(":")
    rng = random.Random(12345)
    prompts = [[rng.randrange(1000, 20000) for _ in range(isl)] for _ in range(count)]
    lock, results, next_i = threading.Lock(), [], [0]

    def one(prompt):
        body = {"model": SERVED, "prompt": prompt, "max_tokens": osl, "ignore_eos": True, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        c = http.client.HTTPConnection(host, int(port), timeout=900)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            return {"error": f"{resp.status} {resp.read()[:200]}"}
        ttft, chunks, usage = None, 0, None
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"].get("completion_tokens")
            if d.get("choices"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
        e2e = time.perf_counter() - t0
        c.close()
        n = usage or chunks
        return {"ttft": ttft or e2e, "e2e": e2e, "tokens": n}

    def client():
        while True:
            with lock:
                if next_i[0] >= count:
                    return
                i = next_i[0]
                next_i[0] += 1
            r = one(prompts[i])
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    tokens = sum(r["tokens"] for r in ok)
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] if xs else None  # noqa: E731
    tpot = [(r["e2e"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    return {"concurrency": concurrency, "requests": len(ok), "errors": len(results) - len(ok),
            "output_tokens": tokens, "output_throughput": tokens / wall if wall > 0 else 0.0,
            "p50_ttft_ms": 1000 * q([r["ttft"] for r in ok], 0.5), "p99_ttft_ms": 1000 * q([r["ttft"] for r in ok], 0.99),
            "avg_ttft_ms": 1000 * sum(r["ttft"] for r in ok) / len(ok) if ok else None,
            # Per request, (E2E - TTFT) / (tokens - 1): the mean gap between its tokens (the plots' ITL).
            "p50_itl_ms": 1000 * q(tpot, 0.5) if tpot else None, "p99_itl_ms": 1000 * q(tpot, 0.99) if tpot else None,
            "avg_itl_ms": 1000 * sum(tpot) / len(tpot) if tpot else None, "wall_s": wall}


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def cache_workload(url, repeats, osl):
    """Exact repeats at temperature 0, one at a time: first vs repeated request."""
    first, again, hits = [], [], 0
    for i in range(repeats):
        body = {"model": SERVED, "stream": True, "temperature": 0, "max_tokens": osl, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Request {i}: list {osl // 8} facts about harbour number "
                              f"{i * 7919 % 1000} and its cranes, one per line."}]}
        t1, e1, _ = sse_request(url, body)
        t2, e2, cache = sse_request(url, body)
        first.append((t1, e1))
        again.append((t2, e2))
        hits += cache == "hit"
    ms = lambda xs, k: round(1000 * median([x[k] for x in xs]), 1)  # noqa: E731
    return {"requests": repeats, "cache_hits": hits, "first_ttft_p50_ms": ms(first, 0), "first_e2e_p50_ms": ms(first, 1),
            "repeat_ttft_p50_ms": ms(again, 0), "repeat_e2e_p50_ms": ms(again, 1)}


def guidellm_run(bin_dir, url, tokenizer, out, concurrency, count, isl, osl):
    """One guidellm concurrent run; its benchmarks.json is kept, the headline figures returned."""
    os.makedirs(out, exist_ok=True)
    # guidellm 0.3.1's CLI: `benchmark run`, synthetic data from token counts, our exported tokenizer.
    cmd = [os.path.join(bin_dir, "guidellm"), "benchmark", "run", "--target", url, "--backend-type", "openai_http",
           "--model", SERVED, "--processor", tokenizer, "--data", f"prompt_tokens={isl},output_tokens={osl}",
           "--rate-type", "concurrent", "--rate", str(concurrency), "--max-requests", str(count),
           "--disable-progress", "--output-path", os.path.join(out, "benchmarks.json")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return {"error": (r.stdout + r.stderr)[-1500:]}
    return {"output": os.path.join(out, "benchmarks.json")}


def machine():
    cpu = "unknown"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,2,4,8", help="concurrency levels of the sweep")
    ap.add_argument("--isl", type=int, default=128, help="prompt tokens (the sweep; the prefix run's suffix)")
    ap.add_argument("--osl", type=int, default=64, help="output tokens (ignore_eos)")
    ap.add_argument("--min-requests", type=int, default=4, help="requests per level: max(this, 2 x concurrency)")
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--prefix-len", type=int, default=256)
    ap.add_argument("--prefix-concurrency", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2, help="worker threads = llama-server -t")
    ap.add_argument("--llama-server", default=LLAMA_SERVER)
    ap.add_argument("--workloads", default="sweep,prefix,cache", help="which of sweep, prefix, cache to run")
    ap.add_argument("--client", choices=["aiperf", "plain"], default="aiperf",
                    help="the sweep's load generator: aiperf, or a plain client counting the servers' tokens "
                    "(for random-weight models, whose text aiperf cannot re-tokenize into the same count)")
    ap.add_argument("--guidellm", action="store_true", help="also run guidellm (its own venv)")
    ap.add_argument("--out", default=os.path.join(BUILD, "bench-report"))
    ap.add_argument("--img", help="copy the PNGs here when each is under 200 KB (docs/img)")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    workloads = set(a.workloads.split(","))
    if not workloads or not workloads <= {"sweep", "prefix", "cache"}:
        ap.error("--workloads: a list of sweep, prefix, cache")
    bin_dir = bench_venv.ensure(BUILD, "bench-venv", bench_venv.AIPERF)
    os.makedirs(a.out, exist_ok=True)
    tokenizer = os.path.join(a.out, "tokenizer")
    subprocess.run([WORKER, "export-tokenizer", "--model", MODEL, "--out", tokenizer], check=True, capture_output=True)
    top = max(levels + [a.prefix_concurrency])
    ctx = a.prefix_len + a.isl + a.osl + 64  # + the chat template
    redis = Redis()
    worker = Worker("--max-running", str(top), "--kv-blocks", str(top * ctx // 16 + a.prefixes * a.prefix_len // 16 + 64),
                    "--served-model-name", SERVED, "--threads", str(a.threads))
    worker.settle()  # on huge pages, as it runs a minute after start
    router = Router([worker.endpoint], "--redis", redis.url, redis_budget_ms=None)
    llama = LlamaServer(a.llama_server, a.threads, top, ctx) if os.path.exists(a.llama_server) else None
    servers = {"switchyard": router.url, **({"llama_server": llama.url} if llama else {})}
    report = {"machine": machine(), "model": os.path.basename(MODEL), "served_name": SERVED,
              "settings": vars(a), "load_generator": "aiperf==0.13.0 (--workers-max 1 --record-processors 1)",
              "sweep": {k: [] for k in servers}, "prefix": {}, "cache": {}, "guidellm": {}}
    if not llama:
        report["notes"] = [f"{a.llama_server} missing (tests/bench/setup_llamacpp.sh): Switchyard only"]
    try:
        for i, c in enumerate(levels if "sweep" in workloads else []):
            order = list(servers) if i % 2 == 0 else list(reversed(servers))
            for name in order:
                before = router.metrics() if name == "switchyard" else None
                count = max(a.min_requests, 2 * c)
                if a.client == "plain":
                    row = plain_sweep(servers[name], c, count, a.isl, a.osl)
                else:
                    row = aiperf(bin_dir, servers[name], tokenizer, os.path.join(a.out, f"aiperf-{name}-c{c}"), c,
                                 count, a.isl, a.osl)
                if before is not None:
                    row.update(router_latency(router, before))
                report["sweep"][name].append(row)
                print(f"sweep {name} c={c}: {row['output_throughput']:.1f} tok/s, TTFT p50 {row['p50_ttft_ms']:.0f} ms"
                      + (f", TPOT p50 {row['p50_itl_ms']:.0f} ms, {row['errors']} errors" if a.client == "plain" else ""),
                      flush=True)
        for name, url in servers.items() if "prefix" in workloads else []:
            pc = a.prefix_concurrency
            n = max(a.min_requests, 3 * pc)
            unique = aiperf(bin_dir, url, tokenizer, os.path.join(a.out, f"aiperf-{name}-unique"), pc, n,
                            a.prefix_len + a.isl, a.osl)
            shared = aiperf(bin_dir, url, tokenizer, os.path.join(a.out, f"aiperf-{name}-prefix"), pc, n, a.isl, a.osl,
                            ("--num-prefix-prompts", str(a.prefixes), "--prefix-prompt-length", str(a.prefix_len)))
            report["prefix"][name] = {"unique": unique, "shared_prefix": shared}
            print(f"prefix {name}: TTFT p50 unique {unique['p50_ttft_ms']:.0f} ms, "
                  f"shared {shared['p50_ttft_ms']:.0f} ms", flush=True)
        for name, url in servers.items() if "cache" in workloads else []:
            report["cache"][name] = cache_workload(url, a.repeats, a.osl)
            print(f"cache {name}: {report['cache'][name]}", flush=True)
        if a.guidellm:
            gl_bin = bench_venv.ensure(BUILD, "bench-venv-guidellm", bench_venv.GUIDELLM, timeout_s=3600)
            for name, url in servers.items():
                report["guidellm"][name] = guidellm_run(gl_bin, url, tokenizer, os.path.join(a.out, f"guidellm-{name}"),
                                                        levels[-1], max(a.min_requests, 2 * levels[-1]), a.isl, a.osl)
    finally:
        router.stop()
        worker.stop()
        redis.stop()
        if llama:
            llama.stop()
    path = os.path.join(a.out, "report.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    subprocess.run([os.path.join(bin_dir, "python"), os.path.join(HERE, "report_plots.py"), path, a.out], check=True)
    print("wrote " + path)
    if a.img:
        os.makedirs(a.img, exist_ok=True)
        for f in sorted(os.listdir(a.out)):
            if f.endswith(".png"):
                size = os.path.getsize(os.path.join(a.out, f))
                if size < 200 * 1024:
                    shutil.copy(os.path.join(a.out, f), os.path.join(a.img, "bench-" + f))
                    print(f"copied {f} ({size // 1024} KB) to {a.img}/bench-{f}")
                else:
                    print(f"not copied: {f} is {size // 1024} KB (over 200 KB)")


if __name__ == "__main__":
    main()
