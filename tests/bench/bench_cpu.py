#!/usr/bin/env python3
"""Prompt processing and decode throughput: Switchyard vs llama.cpp, side by side, one run.

Both engines load the same GGUF file and use the same thread count. Definitions follow
llama-bench: pp = one forward over N prompt tokens from an empty cache (tokens/s); tg = M
single-token forwards from an empty cache (tokens/s). The engines alternate, R rounds each,
and the median of each figure is reported with the ratio.

llama.cpp is driven through llama-cpp-python's bindings over a llama.cpp built for this CPU, which
this script does not build (~8 minutes): run tests/bench/setup_llamacpp.sh once, or pass --python
for a Python that has llama_cpp. Not part of CI.

usage: tests/bench/bench_cpu.py [--threads 2] [--pp 512] [--tg 128] [--rounds 3] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LLAMA_SNIPPET = r"""
import json, sys, time
import llama_cpp
from llama_cpp import Llama
model, threads, n_pp, n_tg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=model, n_ctx=n_pp + n_tg + 16, n_batch=n_pp, n_ubatch=n_pp, n_threads=threads,
            n_threads_batch=threads, verbose=False)
text = ""
while len(llm.tokenize(text.encode(), add_bos=False)) < n_pp:
    text += "The quick brown fox jumps over the lazy dog while the engineers measure tokens per second. "
ids = llm.tokenize(text.encode(), add_bos=False)[:n_pp]
def run():
    llm.reset(); llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
    t0 = time.perf_counter(); llm.eval(ids); pp = n_pp / (time.perf_counter() - t0)
    llm.reset(); llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
    tok = ids[0]
    t0 = time.perf_counter()
    for _ in range(n_tg):
        llm.eval([tok]); tok = int(llm.scores[llm.n_tokens - 1].argmax())
    tg = n_tg / (time.perf_counter() - t0)
    return pp, tg
run()  # warm-up
pp, tg = run()
print(json.dumps({"engine": "llama.cpp", "version": llama_cpp.__version__, "pp_tok_s": pp, "tg_tok_s": tg,
                  "system_info": llama_cpp.llama_print_system_info().decode()}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--worker", default=os.path.join(ROOT, "build", "worker", "switchyard-worker"))
    ap.add_argument("--python", default=None, help="python with llama_cpp (default: build/llama.cpp-bench/bin/python)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    py = a.python
    if py is None:
        for cand in (os.path.join(ROOT, "build", "llama.cpp-bench", "bin", "python"),
                     os.path.join(ROOT, ".venv-bench", "bin", "python"), "/opt/llamaref/bin/python"):
            if os.path.exists(cand):
                py = cand
                break
    if py is None:
        sys.exit("llama-cpp-python not found: run tests/bench/setup_llamacpp.sh or pass --python")

    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            out = os.path.join(tmp, f"sy{r}.json")
            subprocess.run([a.worker, "bench", "--model", a.model, "--threads", str(a.threads),
                            "--prompt-tokens", str(a.pp), "--gen-tokens", str(a.tg), "--repeat", "1",
                            "--json", out], check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                ours.append(json.load(f))
            p = subprocess.run([py, "-c", LLAMA_SNIPPET, a.model, str(a.threads), str(a.pp), str(a.tg)],
                               check=True, capture_output=True, text=True)
            theirs.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}: switchyard pp {ours[-1]['pp_tok_s']:.1f} tg {ours[-1]['tg_tok_s']:.1f} | "
                  f"llama.cpp pp {theirs[-1]['pp_tok_s']:.1f} tg {theirs[-1]['tg_tok_s']:.1f}", flush=True)

    med = lambda rows, k: statistics.median(x[k] for x in rows)
    res = {
        "machine": {"cpus": os.cpu_count(), "threads": a.threads, "kernels": ours[0]["kernels"]},
        "model": os.path.basename(a.model), "rounds": a.rounds,
        "switchyard": {"pp_tok_s": med(ours, "pp_tok_s"), "tg_tok_s": med(ours, "tg_tok_s")},
        "llama_cpp": {"pp_tok_s": med(theirs, "pp_tok_s"), "tg_tok_s": med(theirs, "tg_tok_s"),
                      "version": theirs[0]["version"], "system_info": theirs[0]["system_info"]},
    }
    res["ratio"] = {k: res["switchyard"][k] / res["llama_cpp"][k] for k in ("pp_tok_s", "tg_tok_s")}
    print()
    print(f"{'':12}{'pp' + str(a.pp) + ' tok/s':>16}{'tg' + str(a.tg) + ' tok/s':>16}")
    print(f"{'switchyard':12}{res['switchyard']['pp_tok_s']:16.1f}{res['switchyard']['tg_tok_s']:16.1f}")
    print(f"{'llama.cpp':12}{res['llama_cpp']['pp_tok_s']:16.1f}{res['llama_cpp']['tg_tok_s']:16.1f}")
    print(f"{'ratio':12}{res['ratio']['pp_tok_s']:15.2f}x{res['ratio']['tg_tok_s']:15.2f}x")
    print(f"(median of {a.rounds} alternating rounds, {a.threads} threads, kernels {res['machine']['kernels']}, "
          f"llama-cpp-python {res['llama_cpp']['version']})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
