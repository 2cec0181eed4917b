#!/usr/bin/env python3
"""Constrained decoding's cost: output tokens/s with and without a JSON Schema constraint, side by side.

C requests in flight (closed loop; default 1 and 32), each the same chat prompt asking for a JSON
document, sampled at temperature 1 with a seed per request, sent straight to a worker over ZeroMQ
as a router does; the constrained run sends a schema (an array of objects, so documents are long)
and the unconstrained one does not. Alternating rounds in one run; output tokens/s and the ratio.
The mask cache starts cold in each round (a fresh worker): the first documents pay for it.

usage: tests/bench/bench_structured.py [--concurrency 1,32] [--requests 32] [--max-tokens 128] [--rounds 2]
Not part of CI (it times things).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from bench_itl import cpu_name  # noqa: E402
from worker_client import Client, Worker, tokenize  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "cities": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "country": {"type": "string"},
                               "population": {"type": "integer"}, "capital": {"type": "boolean"}},
                "required": ["name", "country", "population", "capital"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["cities"],
    "additionalProperties": False,
}


def run_once(constrained, concurrency, args, prompt):
    w = Worker("--max-running", "64", "--kv-memory-mb", "512")
    w.settle()
    c = Client(w.endpoint)
    try:
        c.hello()
        cons = {"kind": "json_schema", "schema": json.dumps(SCHEMA)} if constrained else {}
        next_i, live, n_tokens, valid = 0, set(), 0, 0
        texts = {}

        def submit():
            nonlocal next_i
            rid = f"s{next_i}"
            c.send("submit", {"request_id": rid, "prompt": prompt, "stream": True, "constraint": cons,
                              "sampling": {"max_tokens": args.max_tokens, "temperature": 1.0, "seed": next_i,
                                           "has_seed": True}})
            live.add(rid)
            texts[rid] = ""
            next_i += 1

        t0 = time.perf_counter()
        while next_i < min(concurrency, args.requests):
            submit()
        deadline = time.time() + 1200
        while live and time.time() < deadline:
            typ, body = c.recv(120)
            if typ == "error":
                raise RuntimeError(str(body))
            if typ != "tokens":
                continue
            rid = body["request_id"]
            n_tokens += len(body.get("token_ids", []))
            texts[rid] += body.get("text", "")
            if body.get("finish_reason"):
                live.discard(rid)
                if constrained and body["finish_reason"] == "stop":
                    json.loads(texts[rid])
                    valid += 1
                if next_i < args.requests:
                    submit()
        wall = time.perf_counter() - t0
        return {"tok_s": n_tokens / wall, "tokens": n_tokens, "complete_documents": valid}
    finally:
        c.close()
        w.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    prompt = tokenize("List some large cities as JSON: name, country, population and whether each is a capital.")
    rows = []
    for conc in [int(x) for x in args.concurrency.split(",")]:
        res = {False: [], True: []}
        for rnd in range(args.rounds):
            for constrained in (False, True):
                r = run_once(constrained, conc, args, prompt)
                res[constrained].append(r)
                print(f"c={conc} round {rnd + 1} {'schema' if constrained else 'free  '}: {r['tok_s']:.1f} tok/s "
                      f"({r['tokens']} tokens, {r['complete_documents']} complete documents)", flush=True)
        free = statistics.median(r["tok_s"] for r in res[False])
        cons = statistics.median(r["tok_s"] for r in res[True])
        rows.append((conc, free, cons))
    print(f"\nCPU: {cpu_name()}, {os.cpu_count()} cores; {args.requests} requests, max {args.max_tokens} tokens, "
          f"median of {args.rounds} rounds")
    print("| concurrency | unconstrained tok/s | JSON Schema tok/s | ratio |")
    print("|---|---|---|---|")
    for conc, free, cons in rows:
        print(f"| {conc} | {free:.1f} | {cons:.1f} | {cons / free:.2f} |")


if __name__ == "__main__":
    main()
