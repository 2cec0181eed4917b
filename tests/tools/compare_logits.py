#!/usr/bin/env python3
"""How close Switchyard's logits are to llama.cpp's and to exact arithmetic on any GGUF file, as
llamacpp_ref_logits.py checks the generated test models: for a few prompts, llama.cpp's 32 greedy
tokens, then the logits of every generated position under teacher forcing from llama.cpp, from
`switchyard-worker score` and from a float64 forward on the dequantized weights (ExactModel).
Prints top-1 agreement with the exact forward (over the positions whose exact top-2 margin is at
least --margin: below it rounding picks either) and the largest |logit difference| among the exact
top 10, per runtime.

    compare_logits.py --model F [--worker build/worker/switchyard-worker] [--margin 0.5]

Needs llama.cpp's Python bindings (run it with build/llama.cpp-bench/bin/python, which
tests/bench/setup_llamacpp.sh writes, or PYTHONPATH / LLAMA_CPP_LIB_PATH as build_llamacpp.sh
sets them) and memory for the largest tensor in float64 (the 1B files' head: 2 GB).
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_ref_logits import PLAIN_PROMPTS, N_GEN, ExactModel, greedy_forced  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--worker", default="build/worker/switchyard-worker")
    ap.add_argument("--margin", type=float, default=0.5)
    args = ap.parse_args()
    from llama_cpp import Llama

    llm = Llama(model_path=args.model, n_ctx=512, n_threads=os.cpu_count(), n_threads_batch=os.cpu_count(),
                n_batch=512, logits_all=True, verbose=False)
    exact = ExactModel(args.model, lazy=True)
    runs = {"llama.cpp": [], "switchyard": []}
    ref = []
    with tempfile.TemporaryDirectory() as tmp:
        for text in PLAIN_PROMPTS:
            ids = llm.tokenize(text.encode("utf-8"), add_bos=True)
            n = len(ids)
            tokens, forced = greedy_forced(llm, ids)
            seq = ids + tokens[:-1]
            runs["llama.cpp"] += forced
            out = os.path.join(tmp, "logits.f32")
            subprocess.run([args.worker, "score", "--model", args.model, "--tokens", ",".join(map(str, seq)),
                            "--out", out], check=True, capture_output=True)
            sy = np.fromfile(out, dtype=np.float32).reshape(len(seq), -1)
            runs["switchyard"] += [sy[n - 1 + j].astype(np.float64) for j in range(N_GEN)]
            ex = exact.logits(np.array(seq))
            ref += [ex[n - 1 + j] for j in range(N_GEN)]
    clear = [j for j, r in enumerate(ref) if np.diff(np.sort(r)[-2:])[0] >= args.margin]
    top10 = {j: np.argsort(-ref[j])[:10] for j in clear}
    print(f"compare_logits: {os.path.basename(args.model)}, {len(ref)} positions, {len(clear)} with an exact "
          f"top-2 margin >= {args.margin}")
    for name, rows in runs.items():
        agree = sum(int(np.argmax(rows[j]) == np.argmax(ref[j])) for j in clear)
        diff = [np.abs(rows[j][top10[j]] - ref[j][top10[j]]).max() for j in clear]
        print(f"  {name:10s} top-1 = exact's {agree}/{len(clear)}; max |diff| over exact's top 10: median "
              f"{np.median(diff):.2f}, largest {np.max(diff):.2f}")
    same = sum(int(np.argmax(runs["switchyard"][j]) == np.argmax(runs["llama.cpp"][j])) for j in clear)
    print(f"  switchyard top-1 = llama.cpp's {same}/{len(clear)}")
    return 0 if clear else 1


if __name__ == "__main__":
    sys.exit(main())
