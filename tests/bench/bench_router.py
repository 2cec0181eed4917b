#!/usr/bin/env python3
"""Router benchmark: what the router costs, measured on real processes on this machine.

1. Overhead at a fixed request rate (default 500 requests/s, open loop, keep-alive
   connections): the router's own timestamps from its /metrics histograms — request parsed ->
   submit sent (switchyard_router_dispatch_overhead_seconds), token frame received -> bytes
   written (switchyard_router_write_overhead_seconds), request read -> parsed — as p50/p99.
   Requests are tiny (a cached 17-token prompt, max_tokens 1) so the worker keeps up.
2. End to end: C concurrent streaming clients (default 32), each request a 128-token prompt
   and 128 new tokens, through the router vs the same requests sent straight to the worker
   over ZeroMQ, in one run: TTFT p50/p99 and aggregate output tokens/s.

usage: tests/bench/bench_router.py [--rate 500] [--seconds 10] [--clients 32] [--rounds 2]
Not part of CI. Prints a table; --json writes the figures.
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from cluster import MODEL_ID, Router  # noqa: E402
from worker_client import Client, Worker, tokenize  # noqa: E402


def quantile_from_histogram(m, name, q, before=None):
    """q-quantile from Prometheus buckets (linear within a bucket); `before` subtracts a snapshot."""
    buckets = []
    for k, v in m.items():
        if k.startswith(name + "_bucket{le=\""):
            le = k[len(name) + 12:-2]
            prev = before.get(k, 0) if before else 0
            buckets.append((float("inf") if le == "+Inf" else float(le), v - prev))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return float("nan")
    target, lo, lo_count = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= target:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (target - lo_count) / max(count - lo_count, 1e-9)
        lo, lo_count = le, count
    return lo


async def http_post(reader, writer, body):
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return int(head.split(b" ")[1])


async def open_loop(port, rate, seconds, n_conns):
    """Sends `rate` requests/s for `seconds` over a pool of keep-alive connections."""
    # 16 shared token ids (one cached KV block) + one varying id: each request costs the worker
    # one token of compute, so the router, not the model, is what is loaded.
    prefix = tokenize("You are a support assistant for an online shop; answer in one word, please.", chat=False)[:16]
    conns = []
    for _ in range(n_conns):
        conns.append(await asyncio.open_connection("127.0.0.1", port))
    lat, statuses = [], {}

    async def one(i):
        # Open loop: a request never waits for a connection; more are opened when all are busy.
        r, w = conns.pop() if conns else await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"model": MODEL_ID, "prompt": prefix + [1000 + i % 5000], "max_tokens": 1,
                           "temperature": 0}).encode()
        t0 = time.perf_counter()
        s = await http_post(r, w, body)
        lat.append(time.perf_counter() - t0)
        statuses[s] = statuses.get(s, 0) + 1
        conns.append((r, w))

    tasks, t_start = [], time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        delay = t_start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t_start
    for _, w in conns:
        w.close()
    return n / elapsed, lat, statuses


def overhead(router, rate, seconds):
    before = router.metrics()
    achieved, lat, statuses = asyncio.run(open_loop(router.port, rate, seconds, 64))
    m = router.metrics()
    out = {"rate_target": rate, "rate_achieved": achieved, "statuses": statuses,
           "client_p50_ms": statistics.median(lat) * 1e3,
           "client_p99_ms": sorted(lat)[int(0.99 * len(lat)) - 1] * 1e3}
    for key, name in [("dispatch", "switchyard_router_dispatch_overhead_seconds"),
                      ("parse", "switchyard_router_parse_seconds")]:
        out[key + "_p50_us"] = quantile_from_histogram(m, name, 0.5, before) * 1e6
        out[key + "_p99_us"] = quantile_from_histogram(m, name, 0.99, before) * 1e6
    return out


def prompt_ids(i, n=128):
    text = f"Request {i}. " + " ".join(f"word{j % 50}" for j in range(400))
    return tokenize(text, chat=False)[:n]


def e2e_router(router, prompts, new_tokens):
    """All streams at once from one asyncio loop, counting SSE events on raw bytes (a client as
    light as the ZeroMQ one of the direct path, so the comparison measures the router)."""
    async def one(ids, t0):
        r, w = await asyncio.open_connection("127.0.0.1", router.port)
        body = json.dumps({"model": MODEL_ID, "prompt": ids, "max_tokens": new_tokens, "ignore_eos": True,
                           "temperature": 0, "stream": True}).encode()
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await w.drain()
        first, n, tail = None, 0, b""
        while True:
            chunk = await r.read(65536)
            if not chunk:
                break
            data = tail + chunk
            k = data.count(b"data: {")
            if k and first is None:
                first = time.perf_counter() - t0
            n += k
            if b"data: [DONE]" in data:
                break
            tail = data[-8:]
        w.close()
        return first, n

    async def run():
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one(p, t0) for p in prompts))
        return res, time.perf_counter() - t0

    res, elapsed = asyncio.run(run())
    # One event per token here (each chunk carries one token's text; the last adds finish_reason).
    return [f for f, _ in res], sum(n for _, n in res) / elapsed


def e2e_direct(worker, prompts, new_tokens):
    c = Client(worker.endpoint)
    c.hello()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        c.submit(f"d{i}", p, max_tokens=new_tokens, ignore_eos=True)
    first, total, pending = {}, 0, set(f"d{i}" for i in range(len(prompts)))
    while pending:
        typ, body = c.recv(600)
        if typ != "tokens":
            continue
        rid = body["request_id"]
        if body.get("token_ids") and rid not in first:
            first[rid] = time.perf_counter() - t0
        total += len(body.get("token_ids", []))
        if body.get("finish_reason"):
            pending.discard(rid)
    elapsed = time.perf_counter() - t0
    c.close()
    return list(first.values()), total / elapsed


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()

    results = {}
    # Overhead: the worker gets one core, so the router and the load generator have the other.
    worker = Worker("--kv-memory-mb", "256", "--max-running", "64", "--threads", "1")
    worker.settle()
    router = Router([worker.endpoint], "--local-queue", "64")
    try:
        results["overhead"] = ov = overhead(router, a.rate, a.seconds)
    finally:
        router.stop()
        worker.stop()
    worker = Worker("--kv-memory-mb", "512", "--max-running", str(max(32, a.clients)), "--threads", str(a.threads))
    worker.settle()
    router = Router([worker.endpoint])
    try:
        print(f"router overhead at {ov['rate_achieved']:.0f} requests/s (target {a.rate:.0f}; statuses "
              f"{ov['statuses']}):")
        print(f"  parsed -> submit sent      p50 {ov['dispatch_p50_us']:7.0f} us   p99 {ov['dispatch_p99_us']:7.0f} us")
        print(f"  request read -> parsed     p50 {ov['parse_p50_us']:7.0f} us   p99 {ov['parse_p99_us']:7.0f} us")
        print(f"  client-side latency        p50 {ov['client_p50_ms']:7.1f} ms   p99 {ov['client_p99_ms']:7.1f} ms")

        rows = {"router": [], "direct": []}
        before = router.metrics()
        run = 0
        for rnd in range(a.rounds):  # alternate, so drift on a shared machine hits both
            for name in ("direct", "router"):
                # Fresh prompts every run: no run may profit from another's prefix cache.
                prompts = [prompt_ids(1000 * run + i) for i in range(a.clients)]
                run += 1
                ttft, tps = (e2e_router(router, prompts, a.new_tokens) if name == "router"
                             else e2e_direct(worker, prompts, a.new_tokens))
                rows[name].append((pct(ttft, 0.5), pct(ttft, 0.99), tps))
                print(f"  round {rnd + 1} {name:6s}: TTFT p50 {pct(ttft, 0.5) * 1e3:6.0f} ms  p99 "
                      f"{pct(ttft, 0.99) * 1e3:6.0f} ms  output {tps:6.1f} tok/s")
        m = router.metrics()
        ov["write_p50_us"] = quantile_from_histogram(m, "switchyard_router_write_overhead_seconds", 0.5, before) * 1e6
        ov["write_p99_us"] = quantile_from_histogram(m, "switchyard_router_write_overhead_seconds", 0.99, before) * 1e6
        print(f"  token in -> bytes written  p50 {ov['write_p50_us']:7.0f} us   p99 {ov['write_p99_us']:7.0f} us"
              f"   (during the {a.clients} streams below)")
        med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in rows.items()}
        results["e2e"] = med
        cost = 1 - med["router"][2] / med["direct"][2]
        print(f"\n{a.clients} concurrent streams, {len(prompts[0])}-token prompts, {a.new_tokens} new tokens "
              f"(median of {a.rounds} rounds):")
        print("  path      TTFT p50   TTFT p99   output tok/s")
        for k in ("direct", "router"):
            print(f"  {k:8s} {med[k][0] * 1e3:7.0f} ms {med[k][1] * 1e3:7.0f} ms   {med[k][2]:9.1f}")
        print(f"  router throughput cost: {cost * 100:.1f} %")
        results["router_cost"] = cost
    finally:
        router.stop()
        worker.stop()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
