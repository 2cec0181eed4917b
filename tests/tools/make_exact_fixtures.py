#!/usr/bin/env python3
"""Exact-arithmetic reference logits for SmolLM2 (a one-off tool, not run in CI).

llama.cpp quantizes activations to 8 bits inside every matrix product, so its logits carry
their own error (measured: mean |logit difference| ~0.3 from exact arithmetic on the same
weights, top-1 agreement ~96.7%). This script runs the same Llama forward in float64 numpy on
the dequantized GGUF weights, for the same token sequences as tests/fixtures/logits.json, and
writes tests/fixtures/exact_logits.json in the same shape ("top": per position the top-10
[id, logit] pairs). The C++ parity test checks Switchyard against both references.

Needs: pip install numpy gguf. Run: python3 tests/tools/make_exact_fixtures.py
"""
import json
import os

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def field(r, key):
    return r.fields[key].contents()


def main():
    r = GGUFReader(MODEL)
    w = {t.name: dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)]).astype(np.float64)
         for t in r.tensors}
    n_layer = field(r, "llama.block_count")
    n_head = field(r, "llama.attention.head_count")
    n_kv = field(r, "llama.attention.head_count_kv")
    eps = field(r, "llama.attention.layer_norm_rms_epsilon")
    base = field(r, "llama.rope.freq_base")
    n_embd = field(r, "llama.embedding_length")
    hd = n_embd // n_head

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x, pos):  # llama.cpp "normal" mode: adjacent pairs
        i = np.arange(hd // 2)
        th = pos[:, None] * base ** (-2 * i / hd)
        c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        o = np.empty_like(x)
        o[..., 0::2], o[..., 1::2] = a * c - b * s, a * s + b * c
        return o

    def forward(ids):
        n = len(ids)
        x = w["token_embd.weight"][ids]
        pos = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), 1)[None]
        for l in range(n_layer):
            p = f"blk.{l}."
            h = rms(x, w[p + "attn_norm.weight"])
            q = rope((h @ w[p + "attn_q.weight"].T).reshape(n, n_head, hd), pos)
            k = rope((h @ w[p + "attn_k.weight"].T).reshape(n, n_kv, hd), pos)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
            k, v = np.repeat(k, n_head // n_kv, axis=1), np.repeat(v, n_head // n_kv, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            x = x + np.einsum("hqk,khd->qhd", s, v).reshape(n, n_embd) @ w[p + "attn_output.weight"].T
            h = rms(x, w[p + "ffn_norm.weight"])
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        head = w["output.weight"] if "output.weight" in w else w["token_embd.weight"]
        return rms(x, w["output_norm.weight"]) @ head.T

    src = json.load(open(os.path.join(ROOT, "tests", "fixtures", "logits.json")))
    cases = []
    for c in src["cases"]:
        ids = c["prompt_ids"] + c["tokens"][:-1]
        logits = forward(ids)
        n_prompt = len(c["prompt_ids"])
        top = []
        for j in range(len(c["tokens"])):
            row = logits[n_prompt - 1 + j]
            best = np.argsort(-row)[:10]
            top.append([[int(t), round(float(row[t]), 4)] for t in best])
        cases.append({"prompt": c["prompt"], "chat": c["chat"], "prompt_ids": c["prompt_ids"],
                      "tokens": c["tokens"], "top": top})
        print(f"{c['prompt'][:40]!r}: done", flush=True)
    out = {"model": os.path.basename(MODEL), "reference": "float64 numpy forward on dequantized weights",
           "cases": cases}
    with open(os.path.join(ROOT, "tests", "fixtures", "exact_logits.json"), "w") as f:
        f.write("{\"model\": %s, \"reference\": %s, \"cases\": [\n" % (json.dumps(out["model"]), json.dumps(out["reference"])))
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()
