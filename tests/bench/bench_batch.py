#!/usr/bin/env python3
"""Batched generation throughput: Switchyard vs llama.cpp, side by side, one run.

For each concurrency level L (default 1,4,16,32): L sequences, each a distinct prompt of P random
token ids (default 128) and G new tokens (default 128, greedy, EOS ignored). Reported, in tokens/s:

  output tok/s  all generated tokens (L x G) / wall time from the start of prefill to the last token
  decode tok/s  tokens sampled by pure decode steps (every live sequence feeds one token) / the time
                of those steps; prefill (which samples each sequence's first token) is excluded

for three engines:
  * Switchyard continuous batching and Switchyard one request at a time: `switchyard-worker
    bench-engine --concurrency L --skip prefix,memory --json F` (its [batching] section);
  * llama.cpp batched, the same GGUF file and thread count, through llama-cpp-python's low-level API
    in a child process (what llama.cpp's own `llama-batched-bench` measures): one context with
    n_seq_max = L and n_ctx = L x 256, one seq_id per sequence; all L prompts go in as one stream of
    llama_decode calls of up to n_batch tokens (logits only for each prompt's last token), then every
    decode step submits one token per sequence in a single llama_decode and picks the argmax of
    llama_get_logits_ith for each. A one-step warm-up (then llama_memory_clear) precedes the timing.

Per level the engines alternate (Switchyard, then llama.cpp) so machine drift hits both; with
--rounds N every figure is the median of N rounds. Not part of CI.

llama.cpp comes from llama-cpp-python's bindings over a llama.cpp built for this CPU, which this
script does not build (~8 minutes): run tests/bench/setup_llamacpp.sh once, or pass --python for a
Python that has llama_cpp.

usage: tests/bench/bench_batch.py [--levels 1,4,16,32] [--prompt 128] [--gen 128] [--threads N]
                                  [--rounds 1] [--model FILE] [--no-sequential] [--json out.json]
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
CHILD = "_llama_child"  # argv[1] of the child process that drives llama.cpp


# --------------------------------------------------------------------------- llama.cpp child
def _first_attr(mod, *names):
    """The first of `names` that `mod` has (llama.cpp renamed many functions across versions)."""
    for n in names:
        f = getattr(mod, n, None)
        if f is not None:
            return f
    raise AttributeError("llama_cpp has none of: " + ", ".join(names))


def llama_child(argv):
    """Runs in the llama-cpp-python venv; prints one JSON line with the level's figures."""
    cfg = json.loads(argv[0])
    import collections

    import numpy as np

    import llama_cpp as L

    # llama.cpp logs everything to stderr by default: keep errors, and the recent rest for failures.
    recent = collections.deque(maxlen=40)
    level = [0]

    @L.llama_log_callback
    def on_log(lvl, text, _user):
        if lvl != 5:  # 5 = GGML_LOG_LEVEL_CONT: same level as the previous line
            level[0] = lvl
        msg = text.decode(errors="replace") if text else ""
        recent.append(msg)
        if level[0] == 3:  # GGML_LOG_LEVEL_ERROR
            sys.stderr.write(msg)

    L.llama_log_set(on_log, None)
    try:
        _llama_child_run(L, np, cfg)
    except Exception:
        sys.stderr.write("".join(recent)[-4000:] + "\n")
        raise


def _llama_child_run(L, np, cfg):
    import random

    model_path, threads = cfg["model"], cfg["threads"]
    n_seq, n_prompt, n_gen = cfg["level"], cfg["prompt"], cfg["gen"]
    n_batch = max(1, min(cfg["n_batch"], n_seq * n_prompt))
    n_ubatch = max(1, min(cfg["n_ubatch"], n_batch))

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = _first_attr(L, "llama_model_load_from_file", "llama_load_model_from_file")(model_path.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {model_path}")
    if hasattr(L, "llama_model_get_vocab") and hasattr(L, "llama_vocab_n_tokens"):
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    else:
        n_vocab = L.llama_n_vocab(model)

    cp = L.llama_context_default_params()
    cp.n_ctx = n_seq * 256
    cp.n_batch = n_batch
    cp.n_ubatch = n_ubatch
    cp.n_seq_max = n_seq
    cp.n_threads = threads
    cp.n_threads_batch = threads
    if hasattr(cp, "kv_unified") and cfg["kv_unified"] is not None:
        cp.kv_unified = cfg["kv_unified"]
    fa = {"auto": "LLAMA_FLASH_ATTN_TYPE_AUTO", "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED",
          "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED"}[cfg["flash_attn"]]
    if hasattr(cp, "flash_attn_type"):
        cp.flash_attn_type = getattr(L, fa)
    elif hasattr(cp, "flash_attn"):
        cp.flash_attn = cfg["flash_attn"] == "on"
    ctx = _first_attr(L, "llama_init_from_model", "llama_new_context_with_model")(model, cp)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context "
                           f"(n_ctx {cp.n_ctx}, n_seq_max {n_seq}, n_batch {n_batch}, n_ubatch {n_ubatch})")

    if hasattr(L, "llama_memory_clear") and hasattr(L, "llama_get_memory"):
        def clear_kv():
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
    else:
        _clear = _first_attr(L, "llama_kv_self_clear", "llama_kv_cache_clear")

        def clear_kv():
            _clear(ctx)

    batch = L.llama_batch_init(max(n_batch, n_seq), 0, 1)

    def submit(entries):
        """entries: (token, pos, seq, want_logits) tuples, at most n_batch of them; one llama_decode."""
        for i, (tok, pos, seq, out) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = out
        batch.n_tokens = len(entries)
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} ({len(entries)} tokens; 1 = no KV slot)")

    def argmax(i):
        p = L.llama_get_logits_ith(ctx, i)
        if not p:
            raise RuntimeError(f"llama_get_logits_ith({i}) returned NULL")
        return int(np.ctypeslib.as_array(p, shape=(n_vocab,)).argmax())

    rng = random.Random(4321 + n_seq)
    prompts = [[rng.randint(200, 40000) for _ in range(n_prompt)] for _ in range(n_seq)]

    # Warm-up (page in the weights, build the graphs), then an empty cache.
    submit([(prompts[s][0], 0, s, 1) for s in range(n_seq)])
    argmax(n_seq - 1)
    clear_kv()

    t0 = time.perf_counter()
    # Prefill: every prompt token once, chunks of up to n_batch tokens; the last token of each
    # prompt asks for logits, from which that sequence's first new token is picked.
    flat = [(prompts[s][p], p, s, 1 if p == n_prompt - 1 else 0) for s in range(n_seq) for p in range(n_prompt)]
    last = [0] * n_seq
    for c in range(0, len(flat), n_batch):
        chunk = flat[c:c + n_batch]
        submit(chunk)
        for i, (_, pos, seq, out) in enumerate(chunk):
            if out:
                last[seq] = argmax(i)
    generated = n_seq  # one token per sequence from prefill
    t_dec = time.perf_counter()
    # Decode: each step feeds every live sequence its last token (all finish together: fixed length).
    for step in range(n_gen - 1):
        submit([(last[s], n_prompt + step, s, 1) for s in range(n_seq)])
        last = [argmax(i) for i in range(n_seq)]
        generated += n_seq
    t_end = time.perf_counter()

    dec_tokens = n_seq * (n_gen - 1)
    res = {
        "engine": "llama.cpp",
        "version": getattr(L, "__version__", "?"),
        "concurrency": n_seq,
        "output_tok_s": generated / (t_end - t0),
        "decode_tok_s": dec_tokens / (t_end - t_dec) if dec_tokens else float("nan"),
        "prefill_s": t_dec - t0,
        "decode_s": t_end - t_dec,
        "n_ctx": L.llama_n_ctx(ctx),
        "n_batch": n_batch,
        "n_ubatch": n_ubatch,
        "kv_unified": bool(getattr(cp, "kv_unified", True)),
        "flash_attn": cfg["flash_attn"],
        "system_info": L.llama_print_system_info().decode(errors="replace"),
    }
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    _first_attr(L, "llama_model_free", "llama_free_model")(model)
    L.llama_backend_free()
    print(json.dumps(res), flush=True)


# --------------------------------------------------------------------------- driver
def fail(msg, code=2):
    print(f"bench_batch: {msg}", file=sys.stderr)
    sys.exit(code)


def tail(text, n=20):
    return "\n".join((text or "").strip().splitlines()[-n:])


def find_python(arg):
    cands = [arg] if arg else [os.path.join(ROOT, "build", "llama.cpp-bench", "bin", "python"), "/opt/llamaref/bin/python",
                               os.path.join(ROOT, ".venv-bench", "bin", "python")]
    for py in cands:
        if not os.path.exists(py):
            continue
        p = subprocess.run([py, "-c", "import llama_cpp, numpy; print(llama_cpp.__version__)"],
                           capture_output=True, text=True)
        if p.returncode == 0:
            return py, p.stdout.strip()
        if arg:
            fail(f"{py} cannot import llama_cpp and numpy:\n{tail(p.stderr, 5)}\n"
                 "build it with tests/bench/setup_llamacpp.sh (compiles llama.cpp, ~8 min)")
    fail("llama-cpp-python not found (looked for " + ", ".join(cands) + ").\n"
         "  create it with: tests/bench/setup_llamacpp.sh   (compiles llama.cpp into build/llama.cpp-bench, ~8 min)\n"
         "  or point at an existing one: --python /path/to/venv/bin/python")


def run_ours(a, level, out):
    cmd = [a.worker, "bench-engine", "--model", a.model, "--threads", str(a.threads),
           "--concurrency", str(level), "--prompt-tokens", str(a.prompt), "--gen-tokens", str(a.gen),
           "--skip", "prefix,memory" + (",sequential" if a.no_sequential else ""), "--json", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"switchyard-worker bench-engine failed (exit {p.returncode}): {' '.join(cmd)}\n"
             f"{tail(p.stdout)}\n{tail(p.stderr)}", 1)
    with open(out) as f:
        js = json.load(f)
    row = next((r for r in js.get("batching", []) if r["concurrency"] == level), None)
    if row is None:
        fail(f"no batching row for concurrency {level} in {out}: {js}", 1)
    nan = float("nan")
    return {"continuous_tok_s": row["continuous_tok_s"], "continuous_decode_tok_s": row["continuous_decode_tok_s"],
            "sequential_tok_s": row.get("sequential_tok_s", nan),
            "sequential_decode_tok_s": row.get("sequential_decode_tok_s", nan),
            "kernels": js.get("kernels"), "threads": js.get("threads"), "kv_type": js.get("kv_type")}


def run_llama(a, py, level):
    cfg = {"model": a.model, "threads": a.threads, "level": level, "prompt": a.prompt, "gen": a.gen,
           "n_batch": a.llama_n_batch, "n_ubatch": a.llama_n_ubatch, "flash_attn": a.llama_flash_attn,
           "kv_unified": a.llama_kv_unified}
    cmd = [py, os.path.abspath(__file__), CHILD, json.dumps(cfg)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"llama.cpp batched run failed at concurrency {level} (exit {p.returncode}):\n"
             f"{tail(p.stdout)}\n{tail(p.stderr)}", 1)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        fail(f"unreadable output from the llama.cpp child at concurrency {level}:\n{tail(p.stdout)}\n"
             f"{tail(p.stderr)}", 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--worker", default=os.path.join(ROOT, "build", "worker", "switchyard-worker"))
    ap.add_argument("--python", default=None,
                    help="python with llama_cpp and numpy (default: build/llama.cpp-bench/bin/python, made by "
                         "tests/bench/setup_llamacpp.sh)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--levels", default="1,4,16,32", help="comma-separated concurrency levels")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--gen", type=int, default=128, help="new tokens per sequence")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds; figures are medians")
    ap.add_argument("--llama-n-batch", type=int, default=2048,
                    help="llama.cpp n_batch = prefill chunk (capped at L x prompt; llama.cpp's default 2048)")
    ap.add_argument("--llama-n-ubatch", type=int, default=512, help="llama.cpp n_ubatch (default 512)")
    ap.add_argument("--llama-flash-attn", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--llama-kv-unified", action=argparse.BooleanOptionalAction, default=None,
                    help="one KV buffer shared by all sequences (default: the library's, off in recent versions)")
    ap.add_argument("--no-sequential", action="store_true",
                    help="skip Switchyard's one-request-at-a-time runs (long on large models)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    try:
        levels = [int(x) for x in a.levels.split(",") if x.strip()]
    except ValueError:
        fail(f"--levels: expected comma-separated integers, got {a.levels!r}")
    if not levels or min(levels) < 1 or a.prompt < 1 or a.gen < 1 or a.rounds < 1 or a.threads < 1:
        fail("--levels, --prompt, --gen, --rounds and --threads must be positive")
    if a.prompt + a.gen > 256:
        fail(f"--prompt + --gen = {a.prompt + a.gen} exceeds the 256 KV tokens per sequence (n_ctx = L x 256)")
    if not os.path.isfile(a.model):
        fail(f"model not found: {a.model}")
    if not os.access(a.worker, os.X_OK):
        fail(f"Switchyard worker not found: {a.worker}\n"
             "  build it: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j")
    py, version = find_python(a.python)
    print(f"bench_batch: {os.path.basename(a.model)}, {a.threads} threads, levels {levels}, "
          f"{a.prompt}-token prompts, {a.gen} new tokens, {a.rounds} round(s); llama-cpp-python {version} ({py})",
          flush=True)

    ours = {l: [] for l in levels}
    theirs = {l: [] for l in levels}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for l in levels:
                t = time.perf_counter()
                ours[l].append(run_ours(a, l, os.path.join(tmp, f"sy_{r}_{l}.json")))
                t_ours = time.perf_counter() - t
                t = time.perf_counter()
                theirs[l].append(run_llama(a, py, l))
                t_llama = time.perf_counter() - t
                o, b = ours[l][-1], theirs[l][-1]
                print(f"round {r + 1} L={l:<3} switchyard continuous {o['continuous_tok_s']:8.1f} "
                      f"(decode {o['continuous_decode_tok_s']:8.1f}) sequential {o['sequential_tok_s']:8.1f} | "
                      f"llama.cpp batched {b['output_tok_s']:8.1f} (decode {b['decode_tok_s']:8.1f})   "
                      f"[{t_ours:.0f}s + {t_llama:.0f}s]", flush=True)

    med = lambda rows, k: statistics.median(x[k] for x in rows)
    table = []
    for l in levels:
        row = {"concurrency": l,
               "switchyard_continuous_tok_s": med(ours[l], "continuous_tok_s"),
               "switchyard_continuous_decode_tok_s": med(ours[l], "continuous_decode_tok_s"),
               "switchyard_sequential_tok_s": med(ours[l], "sequential_tok_s"),
               "switchyard_sequential_decode_tok_s": med(ours[l], "sequential_decode_tok_s"),
               "llama_cpp_batched_tok_s": med(theirs[l], "output_tok_s"),
               "llama_cpp_batched_decode_tok_s": med(theirs[l], "decode_tok_s")}
        row["continuous_vs_sequential"] = row["switchyard_continuous_tok_s"] / row["switchyard_sequential_tok_s"]
        row["switchyard_vs_llama_cpp"] = row["switchyard_continuous_tok_s"] / row["llama_cpp_batched_tok_s"]
        row["switchyard_vs_llama_cpp_decode"] = (row["switchyard_continuous_decode_tok_s"]
                                                 / row["llama_cpp_batched_decode_tok_s"])
        table.append(row)

    first = theirs[levels[0]][0]
    print()
    print(f"{'':>5} {'Switchyard continuous':>21} {'Switchyard sequential':>21} {'llama.cpp batched':>21} "
          f"{'cont/seq':>9} {'Switchyard/llama.cpp':>21}")
    print(f"{'L':>5} {'output':>10} {'decode':>10} {'output':>10} {'decode':>10} {'output':>10} {'decode':>10} "
          f"{'output':>9} {'output':>10} {'decode':>10}")
    for x in table:
        print(f"{x['concurrency']:>5} {x['switchyard_continuous_tok_s']:10.1f} "
              f"{x['switchyard_continuous_decode_tok_s']:10.1f} {x['switchyard_sequential_tok_s']:10.1f} "
              f"{x['switchyard_sequential_decode_tok_s']:10.1f} {x['llama_cpp_batched_tok_s']:10.1f} "
              f"{x['llama_cpp_batched_decode_tok_s']:10.1f} {x['continuous_vs_sequential']:8.2f}x "
              f"{x['switchyard_vs_llama_cpp']:9.2f}x {x['switchyard_vs_llama_cpp_decode']:9.2f}x")
    o0 = ours[levels[0]][0]
    print(f"(tokens/s; {'median of ' + str(a.rounds) + ' alternating rounds' if a.rounds > 1 else '1 round'}, "
          f"{a.threads} threads; Switchyard kernels {o0['kernels']}, KV {o0['kv_type'] or 'default'}; llama-cpp-python "
          f"{first['version']}, n_batch {a.llama_n_batch}, n_ubatch {a.llama_n_ubatch}, flash_attn "
          f"{a.llama_flash_attn}, kv_unified {first['kv_unified']})")

    if a.json:
        res = {"model": os.path.basename(a.model), "prompt_tokens": a.prompt, "gen_tokens": a.gen,
               "rounds": a.rounds,
               "machine": {"cpus": os.cpu_count(), "threads": a.threads, "kernels": o0["kernels"]},
               "switchyard": {"kv_type": o0["kv_type"]},
               "llama_cpp": {"version": first["version"], "n_batch": a.llama_n_batch, "n_ubatch": a.llama_n_ubatch,
                             "flash_attn": a.llama_flash_attn, "kv_unified": first["kv_unified"],
                             "system_info": first["system_info"]},
               "levels": table,
               "raw": {str(l): {"switchyard": ours[l], "llama_cpp": theirs[l]} for l in levels}}
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        llama_child(sys.argv[2:])
    else:
        main()
