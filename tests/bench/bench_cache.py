#!/usr/bin/env python3
"""Response-cache benchmark on real processes: a redis-server, one worker, and two routers in
front of it — one with --redis, one without — measured in one run.

1. Workload with repeats: N requests (default 300) from C concurrent keep-alive clients (16);
   30 % of them repeat an earlier request of the same run exactly (greedy, same max_tokens).
   Throughput (requests/s, output tokens/s delivered) and client-side p50/p99 latency, with the
   cache vs without, alternating rounds (fresh prompts each run: no run profits from another's
   cache entries or the worker's prefix cache).
2. Hit latency: sequential requests of one cached prompt over one keep-alive connection,
   client-side p50/p99 (target: p50 < 1 ms), and the router's own lookup latency (Redis GET).
3. Hit throughput: many concurrent keep-alive connections asking cached prompts in a closed
   loop for a few seconds; hits/s one router sustains (target >= 5,000/s on the 2-core machine).
   The load generator is asyncio raw HTTP (a Protocol, no parsing beyond Content-Length) in
   --client-procs processes, sharing the machine's cores with the router and Redis.

usage: tests/bench/bench_cache.py [--requests 300] [--concurrency 16] [--repeat 0.3]
           [--max-tokens 24] [--rounds 2] [--hit-requests 3000] [--hit-conns 32] [--hit-seconds 5]
           [--client-procs 1] [--json FILE]
Not part of CI. Prints a table; --json writes the figures.
"""
import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from bench_router import quantile_from_histogram  # noqa: E402
from cluster import MODEL_ID, Router  # noqa: E402
from worker_client import BUILD, Worker, free_port  # noqa: E402

TOPICS = ["register an account", "reset my password", "track an order", "return a parcel", "change my address",
          "delete my account", "contact support", "pay by invoice", "use a gift card", "cancel a subscription"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def start_redis():
    port = free_port()
    log = open(os.path.join(BUILD, f"redis-bench-{port}.log"), "w")
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                          "no"], stdout=log, stderr=subprocess.STDOUT)
    time.sleep(0.3)
    return p, port


def http_request(body, path="/v1/completions"):
    raw = json.dumps(body).encode()
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    length, xcache = 0, None
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        k = k.strip().lower()
        if k == b"content-length":
            length = int(v)
        elif k == b"x-cache":
            xcache = v.strip().decode()
    body = await reader.readexactly(length)
    return int(head.split(b" ")[1]), xcache, body


# ---- 1. workload with repeats ------------------------------------------------------------------


def make_workload(run, n, repeat, max_tokens, rng):
    """n request bodies; a `repeat` fraction are exact copies of an earlier one of this run."""
    bodies = []
    for i in range(n):
        if bodies and rng.random() < repeat:
            bodies.append(rng.choice(bodies))
        else:
            topic = TOPICS[i % len(TOPICS)]
            bodies.append({"model": MODEL_ID, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                           "prompt": f"[run {run}, customer {i}] Question: how do I {topic}? Answer:"})
    return bodies


async def run_workload(port, bodies, concurrency):
    queue = list(enumerate(bodies))
    queue.reverse()
    lat, tokens, kinds = [], 0, {}

    async def client():
        nonlocal tokens
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while queue:
            _, body = queue.pop()
            t0 = time.perf_counter()
            writer.write(http_request(body))
            status, xcache, raw = await read_response(reader)
            lat.append(time.perf_counter() - t0)
            assert status == 200, raw
            tokens += json.loads(raw)["usage"]["completion_tokens"]
            kinds[xcache or "live"] = kinds.get(xcache or "live", 0) + 1
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return {"requests_per_s": len(bodies) / elapsed, "output_tok_per_s": tokens / elapsed,
            "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "seconds": elapsed, "kinds": kinds}


# ---- 2. hit latency -----------------------------------------------------------------------------


async def sequential_hits(port, body, n):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    req = http_request(body)
    lat, kinds = [], {}
    for _ in range(n):
        t0 = time.perf_counter()
        writer.write(req)
        _, xcache, _ = await read_response(reader)
        lat.append(time.perf_counter() - t0)
        kinds[xcache] = kinds.get(xcache, 0) + 1
    writer.close()
    return lat, kinds


# ---- 3. hit throughput --------------------------------------------------------------------------


class HitConn(asyncio.Protocol):
    """Closed loop on one keep-alive connection: send, read one whole response, send again."""

    def __init__(self, reqs, stats, stop_at):
        self.reqs, self.stats, self.stop_at = reqs, stats, stop_at
        self.buf, self.i = b"", random.randrange(len(reqs))

    def connection_made(self, transport):
        self.t = transport
        self.send()

    def send(self):
        self.i = (self.i + 1) % len(self.reqs)
        self.t.write(self.reqs[self.i])

    def data_received(self, data):
        self.buf += data
        while True:
            h = self.buf.find(b"\r\n\r\n")
            if h < 0:
                return
            head = self.buf[:h]
            c = head.find(b"Content-Length: ")
            n = int(head[c + 16:head.find(b"\r", c)]) if c >= 0 else 0
            if len(self.buf) < h + 4 + n:
                return
            self.stats["ok" if head.startswith(b"HTTP/1.1 200") else "bad"] += 1
            self.stats["hit"] += b"X-Cache: hit" in head
            self.buf = self.buf[h + 4 + n:]
            if time.perf_counter() < self.stop_at:
                self.send()
            else:
                self.t.close()
                return

    def connection_lost(self, exc):
        self.stats["closed"] += 1


def hit_load_proc(port, reqs, conns, warmup_s, seconds, out):
    async def main():
        loop = asyncio.get_running_loop()
        stats = {"ok": 0, "bad": 0, "hit": 0, "closed": 0}
        start = time.perf_counter()
        stop_at = start + warmup_s + seconds
        for _ in range(conns):
            await loop.create_connection(lambda: HitConn(reqs, stats, stop_at), "127.0.0.1", port)
        await asyncio.sleep(max(0, start + warmup_s - time.perf_counter()))
        base = dict(stats)
        t0 = time.perf_counter()
        await asyncio.sleep(max(0, stop_at - time.perf_counter()))
        t1 = time.perf_counter()
        counted = {k: stats[k] - base[k] for k in ("ok", "bad", "hit")}
        while stats["closed"] < conns and time.perf_counter() < stop_at + 5:
            await asyncio.sleep(0.01)
        out.put({**counted, "seconds": t1 - t0})

    asyncio.run(main())


def hit_throughput(port, reqs, conns, procs, seconds, warmup_s=1.0):
    q = multiprocessing.Queue()
    ps = [multiprocessing.Process(target=hit_load_proc, args=(port, reqs, max(1, conns // procs), warmup_s, seconds, q))
          for _ in range(procs)]
    for p in ps:
        p.start()
    res = [q.get(timeout=seconds + warmup_s + 60) for _ in ps]
    for p in ps:
        p.join()
    total = {k: sum(r[k] for r in res) for k in ("ok", "bad", "hit")}
    secs = statistics.mean(r["seconds"] for r in res)
    return {**total, "seconds": secs, "hits_per_s": total["hit"] / secs, "requests_per_s": total["ok"] / secs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeat", type=float, default=0.3)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hit-requests", type=int, default=3000)
    ap.add_argument("--hit-conns", type=int, default=32)
    ap.add_argument("--hit-seconds", type=float, default=5)
    ap.add_argument("--hit-prompts", type=int, default=32)
    ap.add_argument("--client-procs", type=int, default=1)
    ap.add_argument("--http-threads", type=int, default=2)
    ap.add_argument("--cache-threads", type=int, default=2)
    ap.add_argument("--parts", default="1,2,3", help="which measurements to run")
    ap.add_argument("--json")
    a = ap.parse_args()
    parts = {int(x) for x in a.parts.split(",")}

    redis, redis_port = start_redis()
    worker = Worker("--kv-memory-mb", "512", "--max-running", str(max(16, a.concurrency)))
    worker.settle()
    cached = Router([worker.endpoint], "--redis", f"redis://127.0.0.1:{redis_port}", "--http-threads",
                    str(a.http_threads), "--cache-threads", str(a.cache_threads), redis_budget_ms=None)
    plain = Router([worker.endpoint], "--http-threads", str(a.http_threads))
    results = {"config": vars(a)}
    try:
        med = hit = tp = None
        # ---- 1
        rng = random.Random(1)
        rows = {"cache": [], "no cache": []}
        run = 0
        print(f"workload: {a.requests} requests, {a.concurrency} concurrent keep-alive clients, "
              f"{a.repeat * 100:.0f} % exact repeats, greedy, max_tokens {a.max_tokens}")
        for rnd in range(a.rounds if 1 in parts else 0):
            for name, router in (("no cache", plain), ("cache", cached)):
                run += 1
                bodies = make_workload(run, a.requests, a.repeat, a.max_tokens, rng)
                r = asyncio.run(run_workload(router.port, bodies, a.concurrency))
                r["repeats"] = len(bodies) - len({b["prompt"] for b in bodies})
                rows[name].append(r)
                print(f"  round {rnd + 1} {name:8s}: {r['requests_per_s']:7.1f} req/s  {r['output_tok_per_s']:7.1f} "
                      f"tok/s  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms   {r['repeats']} repeats, "
                      f"answers {r['kinds']}")
        if 1 in parts:
            med = {k: {f: statistics.median(x[f] for x in v) for f in
                       ("requests_per_s", "output_tok_per_s", "p50_ms", "p99_ms")} for k, v in rows.items()}
            results["workload"] = {"median": med, "runs": rows}

        # ---- 2
        body = {"model": MODEL_ID, "prompt": "How do I register an account on your website?", "max_tokens": 64,
                "temperature": 0}
        if 2 in parts:
            asyncio.run(sequential_hits(cached.port, body, 1))  # the miss that stores it
            time.sleep(0.2)
            before = cached.metrics()
            lat, kinds = asyncio.run(sequential_hits(cached.port, body, a.hit_requests))
            m = cached.metrics()
            hit = {"client_p50_ms": pct(lat, 0.5) * 1e3, "client_p99_ms": pct(lat, 0.99) * 1e3,
                   "client_mean_ms": statistics.mean(lat) * 1e3, "kinds": kinds,
                   "lookup_p50_ms": quantile_from_histogram(m, "switchyard_router_cache_lookup_seconds", 0.5,
                                                            before) * 1e3,
                   "lookup_p99_ms": quantile_from_histogram(m, "switchyard_router_cache_lookup_seconds", 0.99,
                                                            before) * 1e3}
            results["hit_latency"] = hit

        # ---- 3
        prompts = [{"model": MODEL_ID, "prompt": f"Cached question {i}: how do I {TOPICS[i % len(TOPICS)]}?",
                    "max_tokens": 16, "temperature": 0} for i in range(a.hit_prompts)]
        if 3 in parts:
            for p in prompts:
                asyncio.run(sequential_hits(cached.port, p, 1))
            time.sleep(0.2)
            reqs = [http_request(p) for p in prompts]
            tp = hit_throughput(cached.port, reqs, a.hit_conns, a.client_procs, a.hit_seconds)
            results["hit_throughput"] = tp
    finally:
        cached.stop()
        plain.stop()
        worker.stop()
        redis.kill()
        redis.wait()

    if med:
        c, n = med["cache"], med["no cache"]
        print(f"\n1. workload with {a.repeat * 100:.0f} % repeats (median of {a.rounds} rounds)")
        print("   router      req/s    output tok/s   p50 ms    p99 ms")
        for k in ("no cache", "cache"):
            print(f"   {k:9s} {med[k]['requests_per_s']:7.1f}   {med[k]['output_tok_per_s']:10.1f}   "
                  f"{med[k]['p50_ms']:7.1f}   {med[k]['p99_ms']:7.1f}")
        print(f"   cache speed-up: {c['requests_per_s'] / n['requests_per_s']:.2f}x requests/s, "
              f"p50 {n['p50_ms'] / c['p50_ms']:.2f}x lower")
    if hit:
        print(f"\n2. hit latency ({a.hit_requests} sequential hits, one keep-alive connection; answers "
              f"{hit['kinds']})")
        print(f"   client-side   p50 {hit['client_p50_ms']:.3f} ms   p99 {hit['client_p99_ms']:.3f} ms   "
              f"(target p50 < 1 ms: {'met' if hit['client_p50_ms'] < 1 else 'NOT met'})")
        print(f"   Redis lookup  p50 {hit['lookup_p50_ms']:.3f} ms   p99 {hit['lookup_p99_ms']:.3f} ms "
              "(router histogram)")
    if tp:
        print(f"\n3. hit throughput ({a.hit_conns} keep-alive connections from {a.client_procs} client processes, "
              f"{a.hit_seconds:.0f} s, {a.hit_prompts} cached prompts)")
        print(f"   {tp['hits_per_s']:,.0f} hits/s ({tp['ok']} answers, {tp['hit']} hits, {tp['bad']} errors)   "
              f"(target >= 5,000/s: {'met' if tp['hits_per_s'] >= 5000 else 'NOT met'})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
