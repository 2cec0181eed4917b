#!/usr/bin/env python3
"""Inter-token latency under load, with and without the step-time budget (serve --max-step-ms).

C streaming requests in flight at all times (closed loop, default 8), each a fresh prompt of P
random token ids (default 150: no prefix-cache hits) and N new tokens (default 128, EOS ignored),
sent straight to a worker over ZeroMQ as a router does. For each setting of --max-step-ms, in
alternating rounds in one run: output tokens/s, TTFT p50/p99, ITL p50/p99/max (the gap between a
stream's successive token frames; the worker sends one frame per step per stream).
A setting "MS:resident" also keeps the prompt GEMM's weight panels resident (serve
--prompt-panels resident), which makes the small prompt chunks of a budget cheap.

usage: tests/bench/bench_itl.py [--concurrency 8] [--requests 32] [--prompt-tokens 150]
                                [--new-tokens 128] [--step-ms 0,100,100:resident] [--rounds 2]
                                [--json FILE]
Not part of CI (it times things). Prints a table.
"""
import argparse
import json
import os
import platform
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from bench_router import pct  # noqa: E402
from worker_client import Client, Worker  # noqa: E402


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def parse_setting(text):
    """"100" or "100:resident" -> (100.0, "per-step" | "resident")."""
    ms, _, panels = text.partition(":")
    return float(ms), panels or "per-step"


def label_of(text):
    ms, panels = parse_setting(text)
    return ("off" if ms == 0 else f"{ms:g}") + (" + resident panels" if panels == "resident" else "")


def run_once(setting, args, seed):
    step_ms, panels = parse_setting(setting)
    w = Worker("--max-step-ms", str(step_ms), "--prompt-panels", panels, "--max-running", "32", "--kv-memory-mb", "512")
    w.settle()
    c = Client(w.endpoint)
    try:
        c.hello()
        rng = random.Random(seed)
        prompts = [[rng.randrange(1000, 40000) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]
        sent, first, last, gaps, n_tokens = {}, {}, {}, [], 0
        next_i, live = 0, set()
        t0 = time.perf_counter()

        def submit():
            nonlocal next_i
            rid = f"itl-{next_i + 1}"
            c.submit(rid, prompts[next_i], max_tokens=args.new_tokens, ignore_eos=True, temperature=0)
            sent[rid] = time.perf_counter()
            live.add(rid)
            next_i += 1

        while next_i < min(args.concurrency, args.requests):
            submit()
        deadline = time.time() + 900
        while live and time.time() < deadline:
            typ, body = c.recv(60)
            now = time.perf_counter()
            if typ == "error":
                raise RuntimeError(f"worker error: {body}")
            if typ != "tokens":
                continue
            rid = body["request_id"]
            k = len(body.get("token_ids", []))
            if k:
                n_tokens += k
                if rid not in first:
                    first[rid] = now
                else:
                    gaps.append((now - last[rid]) * 1000.0)
                last[rid] = now
            if body.get("finish_reason"):
                live.discard(rid)
                if next_i < args.requests:
                    submit()
        wall = time.perf_counter() - t0
        ttft = [(first[r] - sent[r]) * 1000.0 for r in first]
        return {
            "setting": setting,
            "output_tok_s": n_tokens / wall,
            "ttft_p50_ms": pct(ttft, 0.5),
            "ttft_p99_ms": pct(ttft, 0.99),
            "itl_p50_ms": pct(gaps, 0.5),
            "itl_p99_ms": pct(gaps, 0.99),
            "itl_max_ms": max(gaps) if gaps else float("nan"),
            "tokens": n_tokens,
        }
    finally:
        c.close()
        w.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=150)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--step-ms", default="0,100,100:resident",
                    help="comma-separated --max-step-ms values (0: off), each optionally :resident")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    settings = args.step_ms.split(",")
    for s in settings:
        parse_setting(s)  # a bad value fails before any worker starts
    results = {s: [] for s in settings}
    for rnd in range(args.rounds):
        for s in settings:
            r = run_once(s, args, seed=rnd)
            results[s].append(r)
            print(f"round {rnd + 1} {label_of(s)}: {r['output_tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms, "
                  f"ITL p50 {r['itl_p50_ms']:.0f} p99 {r['itl_p99_ms']:.0f} max {r['itl_max_ms']:.0f} ms", flush=True)
    print(f"\nCPU: {cpu_name()}, {os.cpu_count()} cores; c={args.concurrency}, {args.requests} requests, "
          f"{args.prompt_tokens}-token prompts, {args.new_tokens} new tokens; median of {args.rounds} rounds")
    print("| --max-step-ms | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 / max (ms) |")
    print("|---|---|---|---|")
    base = statistics.median(r["output_tok_s"] for r in results[settings[0]])
    summary = []
    for s in settings:
        med = {k: statistics.median(r[k] for r in results[s]) for k in results[s][0] if k != "setting"}
        med["setting"] = s
        summary.append(med)
        print(f"| {label_of(s)} | {med['output_tok_s']:.1f} ({med['output_tok_s'] / base:.2f}x) | {med['ttft_p50_ms']:.0f} / "
              f"{med['ttft_p99_ms']:.0f} | {med['itl_p50_ms']:.0f} / {med['itl_p99_ms']:.0f} / {med['itl_max_ms']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "args": vars(args), "rounds": results, "median": summary}, f, indent=1)


if __name__ == "__main__":
    main()
