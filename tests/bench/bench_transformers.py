#!/usr/bin/env python3
"""Hugging Face transformers on the GPU, the reference for `switchyard-worker bench-engine --device cuda:0`.

The same workload as the engine's [decode] section: per batch size B (default 1,8,64,256), B
sequences of P random token ids (default 128; ids 200..40000, as the engine's benchmark draws
them) and G new tokens each (default 128, greedy, EOS suppressed with min_new_tokens), fp16 on
cuda:0, one `generate` call per batch (no padding: every prompt has the same length). Reported:

  TTFT ms        wall time of generate(max_new_tokens=1) for the whole batch (prefill + first token)
  output tok/s   B x G / wall time of generate(max_new_tokens=G)
  decode tok/s   B x (G - 1) / (that time - TTFT): the steps after the first token

One warm-up generate per batch size precedes the timing. The model is loaded from our GGUF file
(SmolLM2-135M-Instruct, models/; the GPU machine has no network): through transformers' own
`gguf_file` support when the `gguf` package is importable, otherwise (or if that fails) with the
small GGUF reader below, which dequantizes F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1 tensors with numpy,
undoes llama.cpp's Q/K row permutation and builds a LlamaConfig.

Without torch, transformers or a CUDA device it prints one line starting "transformers: skipped"
and exits 0 (deploy/gpu-check.sh reads it). Not part of CI.

usage: tests/bench/bench_transformers.py [--model PATH] [--batches 1,8,64,256] [--prompt 128]
                                         [--gen 128] [--json out.json]
"""
import argparse
import json
import os
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


# --------------------------------------------------------------------------- GGUF reader
class GGUF:
    """Metadata and tensors of a GGUF v2/v3 file (little-endian), read with numpy."""

    # ggml type id -> (elements per block, bytes per block)
    BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 8: (32, 34), 30: (1, 2)}
    NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 30: "BF16"}
    SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def __init__(self, path):
        import numpy as np

        self.np = np
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0
        if self.buf[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        self.pos = 4
        version = self._u32()
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} (2 or 3 supported)")
        n_tensors, n_kv = self._u64(), self._u64()
        self.meta = {}
        for _ in range(n_kv):
            key = self._str()
            self.meta[key] = self._value(self._u32())
        self.tensors = {}  # name -> (numpy shape, ggml type, offset from the data start)
        for _ in range(n_tensors):
            name = self._str()
            dims = [self._u64() for _ in range(self._u32())]
            typ, off = self._u32(), self._u64()
            self.tensors[name] = (tuple(reversed(dims)), typ, off)
        align = int(self.meta.get("general.alignment", 32))
        self.data = (self.pos + align - 1) // align * align

    def _unpack(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def _u32(self):
        return self._unpack("<I")

    def _u64(self):
        return self._unpack("<Q")

    def _str(self):
        n = self._u64()
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def _value(self, typ):
        if typ == 8:
            return self._str()
        if typ == 9:
            item, n = self._u32(), self._u64()
            return [self._value(item) for _ in range(n)]
        if typ in self.SCALARS:
            return self._unpack(self.SCALARS[typ])
        raise ValueError(f"GGUF metadata value type {typ}")

    def tensor(self, name):
        """The tensor as float32, numpy shape = GGUF dims reversed ([rows][cols] for a matrix)."""
        np = self.np
        shape, typ, off = self.tensors[name]
        if typ not in self.BLOCKS:
            raise ValueError(f"{name}: ggml type {typ} is not supported by this reader")
        n = 1
        for d in shape:
            n *= d
        per, size = self.BLOCKS[typ]
        if n % per:
            raise ValueError(f"{name}: {n} elements are not whole blocks of {per}")
        start = self.data + off
        raw = np.frombuffer(self.buf, dtype=np.uint8, count=n // per * size, offset=start)
        if typ == 0:
            x = raw.view("<f4").astype(np.float32)
        elif typ == 1:
            x = raw.view("<f2").astype(np.float32)
        elif typ == 30:
            x = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            blocks = raw.reshape(-1, size)
            d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # [n_blocks][1]
            if typ == 8:  # Q8_0: d, 32 x int8
                x = d * blocks[:, 2:].view(np.int8).astype(np.float32)
            else:  # Q4_0: d, 16 bytes; Q4_1: d, m, 16 bytes. Low nibbles are elements 0-15, high 16-31.
                qs = blocks[:, 2:] if typ == 2 else blocks[:, 4:]
                q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
                if typ == 2:
                    x = d * (q - 8.0)
                else:
                    m = blocks[:, 2:4].copy().view("<f2").astype(np.float32)
                    x = d * q + m
        return x.reshape(shape)


def unpermute(w, n_head):
    """Undoes llama.cpp's conversion of Q/K rows (interleaved RoPE pairs) back to the Hugging Face
    layout (halves): within each head, GGUF row 2i + j holds HF row j * (head_dim / 2) + i."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_from_gguf(path, torch, transformers):
    """LlamaForCausalLM with the GGUF file's weights (float32 on the CPU)."""
    g = GGUF(path)
    m = g.meta
    arch = m.get("general.architecture", "llama")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch} (llama expected)")
    n_head = int(m["llama.attention.head_count"])
    n_kv = int(m.get("llama.attention.head_count_kv", n_head))
    n_layer = int(m["llama.block_count"])
    embd = g.tensor("token_embd.weight")
    tied = "output.weight" not in g.tensors
    cfg = transformers.LlamaConfig(
        vocab_size=embd.shape[0],
        hidden_size=int(m["llama.embedding_length"]),
        intermediate_size=int(m["llama.feed_forward_length"]),
        num_hidden_layers=n_layer,
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        max_position_embeddings=int(m.get("llama.context_length", 2048)),
        rms_norm_eps=float(m.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(m.get("llama.rope.freq_base", 10000.0)),
        tie_word_embeddings=tied,
        bos_token_id=int(m.get("tokenizer.ggml.bos_token_id", 1)),
        eos_token_id=int(m.get("tokenizer.ggml.eos_token_id", 2)),
    )
    sd = {"model.embed_tokens.weight": embd, "model.norm.weight": g.tensor("output_norm.weight")}
    sd["lm_head.weight"] = embd if tied else g.tensor("output.weight")
    names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(n_layer):
        for src, dst in names.items():
            w = g.tensor(f"blk.{i}.{src}.weight")
            if src == "attn_q":
                w = unpermute(w, n_head)
            elif src == "attn_k":
                w = unpermute(w, n_kv)
            sd[f"model.layers.{i}.{dst}.weight"] = w
    model = transformers.LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


def load_model(path, torch, transformers):
    """(model in fp16 on cuda:0, how it was loaded)."""
    try:
        import gguf  # noqa: F401  (transformers' GGUF loading needs it)

        have_gguf = True
    except ImportError:
        have_gguf = False
    model, how = None, ""
    if have_gguf:
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path), torch_dtype=torch.float32)
            how = "transformers gguf_file"
        except Exception as e:  # any failure: fall back to our reader
            print(f"  (transformers gguf_file failed: {type(e).__name__}: {str(e)[:200]}; using the numpy reader)")
    if model is None:
        model = llama_from_gguf(path, torch, transformers)
        how = "numpy GGUF reader"
    return model.to(device="cuda:0", dtype=torch.float16).eval(), how


# --------------------------------------------------------------------------- benchmark
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import numpy as np
        import torch
        import transformers
    except ImportError as e:
        print(f"transformers: skipped ({e})")
        return 0
    if not torch.cuda.is_available():
        print("transformers: skipped (torch sees no CUDA device)")
        return 0
    if not os.path.exists(args.model):
        print(f"transformers: skipped (model file {args.model} not found)")
        return 0
    transformers.logging.set_verbosity_error()
    t0 = time.time()
    model, how = load_model(args.model, torch, transformers)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}; "
          f"model loaded via {how} in {time.time() - t0:.1f} s, fp16, attention {model.config._attn_implementation}")
    eos = model.config.eos_token_id
    pad = eos if isinstance(eos, int) else 0
    print(f"{'batch':>8} {'TTFT ms':>10} {'output tok/s':>14} {'decode tok/s':>14}")
    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        rng = np.random.default_rng(1234 + b)
        ids = torch.from_numpy(rng.integers(200, 40001, size=(b, args.prompt), dtype=np.int64)).to("cuda:0")
        mask = torch.ones_like(ids)

        def gen(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                     do_sample=False, pad_token_id=pad)
            torch.cuda.synchronize()
            assert out.shape == (b, args.prompt + n), out.shape
            return time.perf_counter() - t

        gen(2)  # warm-up
        ttft = gen(1)
        total = gen(args.gen)
        out_s = b * args.gen / total
        dec_s = b * (args.gen - 1) / max(total - ttft, 1e-9)
        print(f"{b:>8} {ttft * 1000:>10.1f} {out_s:>14.0f} {dec_s:>14.0f}", flush=True)
        rows.append({"batch": b, "ttft_ms": ttft * 1000, "output_tok_s": out_s, "decode_tok_s": dec_s})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"engine": "transformers", "version": transformers.__version__, "loaded_via": how,
                       "prompt": args.prompt, "gen": args.gen, "levels": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
