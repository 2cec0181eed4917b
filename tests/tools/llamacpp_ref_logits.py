#!/usr/bin/env python3
"""Reference outputs for the generated test models (tests/tools/make_test_models.py), read by
tests/unit/test_model_families.cpp. For every model of the manifest, next to the file:

  <model>.logits.json
    cases[]: a prompt's token ids (llama.cpp's tokenizer), 32 greedy tokens chosen by llama.cpp,
             and at each of those positions, under teacher forcing in one batch:
               top:   llama.cpp's top-10 (id, logit)
               exact: the top-10 of a float64 numpy forward on the dequantized weights
    rows{}:  for each weight tensor, rows 0, n/2 and n-1 dequantized by gguf-py (llama.cpp's own
             Python reader), to check our dequantization value by value.

    llamacpp_ref_logits.py --models DIR

Needs numpy, gguf and llama.cpp through llama-cpp-python's bindings (tests/tools/test_models.sh
sets PYTHONPATH and LLAMA_CPP_LIB_PATH). A json newer than its model is kept.
"""

import argparse
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

N_GEN = 32
TOP_K = 10

PLAIN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:",
    "Il était une fois, dans un petit village au bord de la mer,",
    "数据",
]
CHATS = [
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def dequantized(t):
    return dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)]).astype(np.float64)


class LazyWeights(dict):
    """Tensors dequantized to float64 when read instead of all at load (a 1B model's would take 10
    GB): the layers' each time they are read, the others (embedding, head, norms) once."""

    def __init__(self, tensors):
        super().__init__()
        self.tensors = {t.name: t for t in tensors}

    def __contains__(self, k):
        return dict.__contains__(self, k) or k in self.tensors

    def get(self, k, default=None):
        return self[k] if k in self else default

    def __getitem__(self, k):
        if dict.__contains__(self, k):
            return dict.__getitem__(self, k)
        v = dequantized(self.tensors[k])
        if not k.startswith("blk."):
            dict.__setitem__(self, k, v)
        return v

    def pop(self, k):
        v = self[k]
        self.tensors.pop(k, None)
        dict.pop(self, k, None)
        return v


class ExactModel:
    """The Llama / Qwen2 / Qwen3 / Gemma 3 / Phi-3 forward in float64 on the dequantized weights
    (`lazy`: dequantized as each layer runs, for files too large to hold in float64)."""

    def __init__(self, path, lazy=False):
        r = GGUFReader(path)
        self.arch = field(r, "general.architecture")
        a = self.arch + "."
        self.w = LazyWeights(r.tensors) if lazy else {t.name: dequantized(t) for t in r.tensors}
        self.n_layer = field(r, a + "block_count")
        self.n_head = field(r, a + "attention.head_count")
        self.n_kv = field(r, a + "attention.head_count_kv")
        self.eps = field(r, a + "attention.layer_norm_rms_epsilon")
        self.base = field(r, a + "rope.freq_base", 10000.0)
        n_embd = field(r, a + "embedding_length")
        self.hd = field(r, a + "attention.key_length", n_embd // self.n_head)
        self.neox = self.arch != "llama"
        self.gemma = self.arch == "gemma3"
        # Gemma 3: 5 of every 6 layers (or attention.sliding_window_pattern: a period, or a
        # boolean per layer) see a window of the last `window` tokens, with RoPE base 10k (or
        # rope.freq_base_swa); logits soft-capped where final_logit_softcapping is given.
        self.window = field(r, a + "attention.sliding_window", 0) if self.gemma else 0
        pattern = field(r, a + "attention.sliding_window_pattern", 6)
        if isinstance(pattern, (list, tuple)):
            self.local = [bool(b) for b in pattern]
        else:
            self.local = [pattern == 0 or l % pattern < pattern - 1 for l in range(self.n_layer)]
        self.local = [self.window > 0 and b for b in self.local]
        self.base_swa = field(r, a + "rope.freq_base_swa", 10000.0)
        self.softcap = field(r, a + "final_logit_softcapping", 0.0) if self.gemma else 0.0
        self.embd_scale = np.sqrt(n_embd) if self.gemma else 1.0
        self.ff = self.w.get("rope_freqs.weight")
        # Phi-3 LongRoPE at the references' 512-token context: the short factors, cos and sin
        # times the attention factor.
        self.mscale = 1.0
        if self.arch == "phi3":
            self.ff = self.w.get("rope_factors_short.weight")
            self.mscale = field(r, a + "rope.scaling.attn_factor", 1.0)
        for l in range(self.n_layer):  # fused matrices split as the runtimes do
            p = f"blk.{l}."
            if p + "attn_qkv.weight" in self.w:
                qkv = self.w.pop(p + "attn_qkv.weight")
                nq, nkv = self.n_head * self.hd, self.n_kv * self.hd
                self.w[p + "attn_q.weight"], self.w[p + "attn_k.weight"], self.w[p + "attn_v.weight"] = (
                    qkv[:nq], qkv[nq:nq + nkv], qkv[nq + nkv:])
            if p + "ffn_gate.weight" not in self.w:
                up = self.w.pop(p + "ffn_up.weight")
                half = up.shape[0] // 2
                self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"] = up[:half], up[half:]
        self.out = self.w["output.weight"] if "output.weight" in self.w else self.w["token_embd.weight"]

    def rms(self, x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * g

    def rope(self, x, pos, base):
        hd = self.hd
        i = np.arange(hd // 2)
        th = pos[:, None] * base ** (-2.0 * i / hd)
        if self.ff is not None:
            th = th / self.ff[None, :]
        c, s = np.cos(th)[:, None, :] * self.mscale, np.sin(th)[:, None, :] * self.mscale
        o = np.empty_like(x)
        if self.neox:
            a, b = x[..., : hd // 2], x[..., hd // 2:]
            o[..., : hd // 2], o[..., hd // 2:] = a * c - b * s, a * s + b * c
        else:
            a, b = x[..., 0::2], x[..., 1::2]
            o[..., 0::2], o[..., 1::2] = a * c - b * s, a * s + b * c
        return o

    def logits(self, ids):
        w, n, hd = self.w, len(ids), self.hd
        x = w["token_embd.weight"][ids] * self.embd_scale
        pos = np.arange(n, dtype=np.float64)
        causal = np.triu(np.full((n, n), -np.inf), 1)
        # Query i sees key j when i - window < j <= i.
        windowed = causal + np.tril(np.full((n, n), -np.inf), -self.window) if self.window else causal
        group = self.n_head // self.n_kv
        for l in range(self.n_layer):
            p = f"blk.{l}."
            local = self.local[l]
            h = self.rms(x, w[p + "attn_norm.weight"])
            q, k, v = h @ w[p + "attn_q.weight"].T, h @ w[p + "attn_k.weight"].T, h @ w[p + "attn_v.weight"].T
            if p + "attn_q.bias" in w:
                q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
            q, k = q.reshape(n, self.n_head, hd), k.reshape(n, self.n_kv, hd)
            if p + "attn_q_norm.weight" in w:
                q, k = self.rms(q, w[p + "attn_q_norm.weight"]), self.rms(k, w[p + "attn_k_norm.weight"])
            base = self.base_swa if local else self.base
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            v = v.reshape(n, self.n_kv, hd)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + (windowed if local else causal)[None]
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", att, v).reshape(n, self.n_head * hd) @ w[p + "attn_output.weight"].T
            if self.gemma:
                o = self.rms(o, w[p + "post_attention_norm.weight"])
            x = x + o
            h = self.rms(x, w[p + "ffn_norm.weight"])
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            if self.gemma:
                act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
            else:
                act = g / (1 + np.exp(-g))
            o = (act * u) @ w[p + "ffn_down.weight"].T
            if self.gemma:
                o = self.rms(o, w[p + "post_ffw_norm.weight"])
            x = x + o
        out = self.rms(x, w["output_norm.weight"]) @ self.out.T
        return self.softcap * np.tanh(out / self.softcap) if self.softcap else out


def top_pairs(row):
    order = np.argsort(-row, kind="stable")[:TOP_K]
    return [[int(i), round(float(row[i]), 4)] for i in order]


def chat_prompt(llm, messages, arch):
    import ctypes
    import llama_cpp
    tmpl = llama_cpp.llama_model_chat_template(llm.model, None)
    if tmpl is None and arch == "gemma3":
        tmpl = b"gemma"  # Gemma 3 files come without a template; Switchyard uses Gemma's turns
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(tmpl, arr, len(messages), True, buf, len(buf))
    if n < 0:
        raise RuntimeError("llama_chat_apply_template failed")
    return buf.raw[:n].decode("utf-8")


def greedy_forced(llm, ids):
    """llama.cpp's N_GEN greedy tokens after ids, and its logits at each of them under teacher
    forcing (prompt + tokens[:-1] in one batch)."""
    n = len(ids)
    # Greedy tokens chosen from batched evaluation of prompt + tokens so far: llama.cpp's one-token
    # decode steps drift from batched rows, and the reference must be its own argmax.
    tokens = []
    for j in range(N_GEN):
        llm.reset()
        llm.eval(ids + tokens)
        tokens.append(int(np.argmax(llm.scores[n - 1 + j])))
    llm.reset()
    llm.eval(ids + tokens[:-1])
    return tokens, [np.array(llm.scores[n - 1 + j], dtype=np.float64) for j in range(N_GEN)]


def logits_case(llm, exact, text, chat):
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=chat)
    n = len(ids)
    tokens, forced = greedy_forced(llm, ids)
    ex = exact.logits(np.array(ids + tokens[:-1]))
    return {"prompt": text, "chat": chat, "prompt_ids": ids, "tokens": tokens,
            "top": [top_pairs(l) for l in forced],
            "exact": [top_pairs(ex[n - 1 + j]) for j in range(N_GEN)]}


def sample_rows(path):
    r = GGUFReader(path)
    rows = {}
    for t in r.tensors:
        if len(t.shape) != 2:
            continue
        m = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
        idx = sorted({0, m.shape[0] // 2, m.shape[0] - 1})
        rows[t.name] = {"type": t.tensor_type.name, "index": idx,
                        "values": [[float(v) for v in m[i].astype(np.float32)] for i in idx]}
    return rows


def write_reference(path, family, type_name, threads=1):
    import llama_cpp
    from llama_cpp import Llama
    out = path + ".logits.json"
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(path):
        return
    llm = Llama(model_path=path, n_ctx=512, n_threads=threads, n_threads_batch=threads, n_batch=512, logits_all=True,
                type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
    exact = ExactModel(path)
    cases = [logits_case(llm, exact, p, False) for p in PLAIN_PROMPTS]
    cases += [logits_case(llm, exact, chat_prompt(llm, c, exact.arch), True) for c in CHATS]
    agree = sum(c["top"][j][0][0] == c["exact"][j][0][0] for c in cases for j in range(N_GEN))
    print(f"llamacpp_ref_logits: {path}: llama.cpp vs exact top-1 {agree}/{len(cases) * N_GEN}", file=sys.stderr)
    doc = {"model": os.path.basename(path), "family": family, "type": type_name, "n_gen": N_GEN, "top_k": TOP_K,
           "llamacpp_exact_top1": agree, "cases": cases, "rows": sample_rows(path)}
    with open(out + ".part", "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
    os.replace(out + ".part", out)
    del llm


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="a folder with manifest.json (its tiny models)")
    args = ap.parse_args()
    with open(os.path.join(args.models, "manifest.json")) as f:
        manifest = json.load(f)
    for m in manifest["models"]:
        # A real model's 262k-token head makes its reference minutes long: it gets every core
        # (llama.cpp splits each product by rows, so the logits do not depend on the count).
        if m["shape"] in ("tiny", "real"):
            write_reference(os.path.join(args.models, m["path"]), m["family"], m["type"],
                            threads=os.cpu_count() if m["shape"] == "real" else 1)


if __name__ == "__main__":
    main()
