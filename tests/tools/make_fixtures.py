#!/usr/bin/env python3
"""Regenerates the llama.cpp reference fixtures used by tests/unit/test_tokenizer.cpp (and the
model tests that read logits.json).

One-off tool, NOT part of CI: it needs llama-cpp-python (0.3.36 was used) and numpy, e.g.

    python3 -m venv /opt/llamaref && /opt/llamaref/bin/pip install numpy llama-cpp-python==0.3.36
    /opt/llamaref/bin/python tests/tools/make_fixtures.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]

Writes, next to the other fixtures:
  tests/fixtures/tokenizer.json  llama.cpp token ids of varied strings (add_bos=False)
  tests/fixtures/logits.json     64 greedy tokens per prompt plus the top-10 logits each was
                                 chosen from, read under teacher forcing in a single batch
"""

import argparse
import json
import os
import sys

import llama_cpp
import numpy as np
from llama_cpp import Llama

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODEL = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
FIXTURES = os.path.join(REPO, "tests", "fixtures")

N_GEN = 64   # greedy tokens per prompt
TOP_K = 10   # (id, logit) pairs kept per position
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

LONG_PARAGRAPH = (
    "The history of computing is a story of abstraction layered upon abstraction. Early machines "
    "were programmed by physically rewiring plugboards; later, stored-program computers allowed "
    "instructions to live in memory alongside data. Assemblers replaced raw opcodes with mnemonics, "
    "compilers translated high-level languages into machine code, and operating systems hid the "
    "details of hardware behind files, processes and sockets. Today, a single request to a large "
    "language model may pass through a load balancer, a router, a scheduler, a KV-cache manager and "
    "dozens of GPU kernels, each written by a different team, in 2024 or 2025, with latencies "
    "measured in microseconds (us) rather than seconds. Isn't that remarkable? We'd say so!"
)

# (text, parse_special)
TOKENIZER_CASES = [
    ("Hello world", False),
    ("The quick brown fox jumps over the lazy dog.", False),
    ("What is the capital of France?", False),
    ("", False),
    (" ", False),
    ("  ", False),
    ("     ", False),
    ("\t", False),
    ("\t\tindented with tabs", False),
    ("\n", False),
    ("\n\n\n", False),
    ("line one\nline two\r\nline three", False),
    ("   leading", False),
    ("trailing   ", False),
    ("a  b   c    d", False),
    (" \n \n  \t x", False),
    ("12345678", False),
    ("3.14159", False),
    ("1,000,000", False),
    ("The year 2024 had 366 days and 8784 hours.", False),
    ("!!!???...,,,;;;", False),
    ("(a+b)*[c-d]/{e^f} == <g|h> && !i || ~j", False),
    ("don't", False),
    ("I'M", False),
    ("we'll they've she'd it's you're", False),
    ("'quoted' and \"double quoted\" text", False),
    ("def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n", False),
    ("#include <vector>\n\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto x : v) {\n    if (x % 2 == 0) continue;\n  }\n  return 0;\n}\n", False),
    ("https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?download=true#files", False),
    ("Contact: someone@example.com, +1 (555) 123-4567", False),
    ("I love pizza 🍕 and tacos 🌮!", False),
    ("Family: 👨‍👩‍👧‍👦 and 👩🏽‍💻 at work", False),
    ("Flags: 🇫🇷 🇯🇵 🇺🇸", False),
    ("你好，世界！今天天气很好。", False),
    ("日本語のテキストとカタカナ、ひらがな。", False),
    ("안녕하세요, 세계! 반갑습니다.", False),
    ("مرحبا بالعالم، كيف حالك؟", False),
    ("नमस्ते दुनिया, आप कैसे हैं?", False),
    ("Café crème, naïve façade, Ångström, jalapeño, Øresund", False),
    ("Привет, мир! Как дела?", False),
    ("Mixed: English, 中文, русский, العربية, and 😀 in one line.", False),
    ("Ελληνικά: Γειά σου Κόσμε", False),
    ("non\u00a0breaking\u2003em space\u3000ideographic", False),
    ("zero\u200bwidth and soft\u00adhyphen", False),
    ("Math: ∀x ∈ ℝ, x² ≥ 0 ⇒ √(x²) = |x|, ½ + ¼ = ¾", False),
    ("Numbers of other kinds: Ⅻ ① ² ٣ ३ 〇", False),
    ("next\u0085line, line\u2028sep, para\u2029sep, wide\u3000 \u3000space", False),
    ("a\r\n\r\nb  \n  \n", False),
    ("can't won't 'tis O'Neill's rock'n'roll", False),
    ("unassigned \u0378 and private \ue000 and tag \U000e0041 chars", False),
    ("<|im_start|>user\nhi<|im_end|>", True),
    ("<|im_start|>user\nhi<|im_end|>", False),
    ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n", True),
    ("text before<|endoftext|>text after", True),
    ("<|endoftext|><|endoftext|>", True),
    ("<file_sep><filename>main.py<repo_name>", True),
    ("<|im_start|", True),
    ("<|im_end|> leading space after special", True),
    (LONG_PARAGRAPH, False),
    (LONG_PARAGRAPH * 3, False),
]

PLAIN_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n",
    "The three primary colors are",
]

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How do I register an account?",
    "Explain in one sentence what a GPU is.",
]


def chatml(user_message):
    """SmolLM2's chat template with one user turn and the generation prompt."""
    return (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{user_message}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def tokenizer_fixture(llm, model_name):
    cases = []
    for text, parse_special in TOKENIZER_CASES:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=parse_special)
        back = llm.detokenize(ids, special=parse_special).decode("utf-8")
        if back != text:
            sys.exit(f"round trip failed for {text!r}: {back!r}")
        cases.append({"text": text, "add_bos": False, "parse_special": parse_special, "ids": ids})
    return {"model": model_name, "cases": cases}


def top_pairs(logits):
    order = np.argsort(-logits, kind="stable")[:TOP_K]
    return [[int(i), round(float(logits[i]), 4)] for i in order]


def logits_case(llm, prompt, chat):
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=chat)
    n = len(ids)

    # Greedy generation, 64 tokens whatever they are (EOS does not stop it). Each step
    # re-evaluates prompt + tokens so far in one batch: in this llama.cpp build one-token decode
    # steps drift from batched evaluation of the same sequence by up to ~1.3 logits (even with
    # an F32 KV cache), enough to flip near-ties, while batched rows are identical whatever the
    # batch length. Choosing from batched logits keeps tokens[j] == argmax of top[j] exactly.
    tokens = []
    for j in range(N_GEN):
        llm.reset()
        llm.eval(ids + tokens)
        tokens.append(int(np.argmax(llm.scores[n - 1 + j])))

    # Teacher forcing: prompt + tokens[:63] in one batch gives the top lists.
    llm.reset()
    llm.eval(ids + tokens[:-1])
    forced = [np.array(llm.scores[n - 1 + j], dtype=np.float32) for j in range(N_GEN)]
    for j in range(N_GEN):
        if int(np.argmax(forced[j])) != tokens[j]:
            sys.exit(f"{prompt!r}: step {j}: teacher-forced argmax {int(np.argmax(forced[j]))} "
                     f"!= greedy {tokens[j]}")

    # Diagnostic only: the same sequence decoded one token at a time.
    llm.reset()
    llm.eval(ids)
    max_diff, flips = 0.0, 0
    for j in range(N_GEN):
        step = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        max_diff = max(max_diff, float(np.max(np.abs(step - forced[j]))))
        flips += int(np.argmax(step)) != tokens[j]
        llm.eval([tokens[j]])
    print(f"  {prompt[:40]!r}: {n} prompt tokens; one-token decode vs batched: max |logit diff| "
          f"{max_diff:.3f}, argmax differs at {flips}/{N_GEN} steps", file=sys.stderr)
    return {"prompt": prompt, "chat": chat, "prompt_ids": ids, "tokens": tokens,
            "top": [top_pairs(l) for l in forced]}


def write_json(path, head, key, rows):
    """Compact JSON with one array element per line."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("{")
        for k, v in head.items():
            f.write(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}, ")
        f.write(f"{json.dumps(key)}: [\n")
        f.write(",\n".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in rows))
        f.write("\n]}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=FIXTURES)
    ap.add_argument("--tokenizer-only", action="store_true", help="skip logits.json (minutes)")
    args = ap.parse_args()

    # F32 KV cache: the reference should carry no F16 rounding of keys and values.
    llm = Llama(model_path=args.model, n_ctx=512, n_threads=2, n_batch=512, logits_all=True,
                type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
    model_name = os.path.basename(args.model)
    os.makedirs(args.out, exist_ok=True)

    tok = tokenizer_fixture(llm, model_name)
    write_json(os.path.join(args.out, "tokenizer.json"), {"model": model_name}, "cases", tok["cases"])
    print(f"tokenizer.json: {len(tok['cases'])} cases", file=sys.stderr)

    if args.tokenizer_only:
        return
    cases = [logits_case(llm, p, False) for p in PLAIN_PROMPTS]
    cases += [logits_case(llm, chatml(p), True) for p in CHAT_PROMPTS]
    head = {"model": model_name, "n_gen": N_GEN, "top_k": TOP_K, "kv_cache": "f32",
            "note": "top[j]: logits (4 decimals) at position len(prompt_ids)-1+j under teacher forcing"}
    write_json(os.path.join(args.out, "logits.json"), head, "cases", cases)
    print(f"logits.json: {len(cases)} prompts", file=sys.stderr)


if __name__ == "__main__":
    main()
