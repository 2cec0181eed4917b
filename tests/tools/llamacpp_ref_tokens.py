#!/usr/bin/env python3
"""Records llama.cpp's tokenization of a varied text set for each generated test-model family,
the reference tests/unit/test_tokenizer_families.cpp compares Switchyard's tokenizer against.

    llamacpp_ref_tokens.py --models DIR

DIR is make_test_models.py's output (manifest.json). For one file per family (the f16 type:
tokenization does not depend on the weights) writes <model>.tokens.json next to the model, unless
that file is newer than the model, this script and make_fixtures.py (whose cases it reuses). Each case is one (text, add_bos, parse_special)
with llama.cpp's ids and, for those ids:
  pieces          concatenated llama_token_to_piece(special=False), what llama.cpp's server
                  streams for a completion;
  pieces_special  the same with special=True;
  detok           llama_detokenize(remove_special=False, unparse_special=False), which also drops
                  the first piece's leading space (SentencePiece add_space_prefix) and, for some
                  BPE pre-tokenizers, cleans up spaces before punctuation (clean_spaces).
`raw_cases` holds byte strings that are not valid UTF-8, in hex, with their ids and pieces. The
head holds the vocabulary facts llama.cpp derives: BOS/EOS/EOT, add_bos/add_eos, and every
end-of-generation and control id.

Needs llama.cpp's Python bindings: PYTHONPATH=<dir>/python LLAMA_CPP_LIB_PATH=<dir>/lib
(tests/tools/build_llamacpp.sh).
"""

import argparse
import ctypes
import json
import logging
import os
import sys

import llama_cpp
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_fixtures import LONG_PARAGRAPH, TOKENIZER_CASES  # noqa: E402  (the SmolLM2 parity set)

# Texts for every family, beyond make_fixtures.py's set.
EXTRA_TEXTS = [
    "Hello",
    " Hello",
    "  Hello  ",
    "Hello\n",
    "\nHello",
    "hello world",
    "HELLO WORLD",
    " " * 33,
    "\t \t\n \n",
    "x" + " " * 17 + "y",
    "\r\n\r\n",
    "\n\n\n\n\n\nend",
    "0",
    "007",
    "1234567890123456789",
    "3.14 2.718 -42 +7 1e10 0x1F 1_000",
    "v1.2.3-rc.4+build.5",
    "$100.00 €50 £20 ¥1000",
    "a.b,c;d:e!f?g",
    "\"'`~@#$%^&*()_+-=[]{}|\\/<>",
    "...---...",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"x\">Hi &amp; bye</div>",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "    def __init__(self):\n        self.x = 1\n",
    "e\u0301 a\u0308 n\u0303 (combining marks)",
    "Ünïcödé ÀÉÎÕÜ àéîõü ßøåæœ",
    "ﬁ ﬂ Ⅸ ㎏ ＡＢＣ １２３",
    "\ufeffbyte order mark",
    "\u2581 lower one eighth block ▁▁ and \u2581x",
    "<0x41> <0x0A> <unk> literal byte-token text",
    "\x01\x02\x1f\x7f control characters",
    "\U0010fffd \U0001f600 \U00020000 astral",
    "ไทย ภาษา",
    "עברית שלום",
    "Ελληνικά ΑΒΓ αβγ",
    "😀😃😄😁😆😅😂🤣",
    "👍🏻👍🏼👍🏽👍🏾👍🏿",
    "🏳️‍🌈 ❤️ ☺️ ✔︎",
    "中文English混合mixed文本text",
    "Ｋａｔａｋａｎａカタカナﾊﾝｶｸｶﾀｶﾅ",
    "a" * 300,
    "word " * 60,
]

# Each family's special tokens, as text (parsed with parse_special true, plain text otherwise).
SPECIAL_TEXTS = {
    # Phi-3: whitespace after a special token is dropped (llama.cpp's rstrip rule for Phi-3 names).
    "phi3": [
        "<|system|>\nBe brief.<|end|>\n<|user|>\nHi there!<|end|>\n<|assistant|>\n",
        "<|user|>   \t\n  spaced<|end|>",
        "<|end|> \n",
        "<s> kept</s> gone",
        "<|endoftext|>  kept",
        "text<|assistant|>\n\nmore",
    ],
    # Phi-4-mini (`gpt-4o` pre-tokenizer): case runs, contractions after either case, digit
    # triples, the slash kept with punctuation, then its chat markers.
    "phi4": [
        "HTTPServer iPhone McDonald's XMLHttpRequest getHTTPResponseCode ABCdef aBC",
        "I'M they'RE We'Ve it'S you'D THEY'LL o'clock 'tis rock'n'roll DON'T don't",
        "12345678 1,234,567.890 v2.0.1 0x1F3A 1e-10 ２０２４年 ①②③ ٣٤٥",
        "path/to/file.txt // comment /* c */ https://example.com/a/b?c=d&e=f",
        "Ünïcödé ÀÉÎÕÜ àéîõü ǅungla ǈ Σίσυφος ΣΊΣΥΦΟΣ İstanbul ß ẞ",
        "e\u0301 a\u0308b \u0301x 한국어 中文字符 日本語テキスト",
        "👍🏽 🇫🇷 👨‍👩‍👧‍👦 ✨ a😀b 😀😀😀",
        "  two  spaces\t\ttabs \n\n\n newlines \r\n crlf   \n  end   ",
        "\u00a0nbsp\u2003em\u3000ideo\u0085nel",
        "<|system|>You are brief.<|end|><|user|>Hi there!<|end|><|assistant|>",
        "<|system|>Tools here.<|tool|>[{\"name\": \"f\"}]<|/tool|><|end|>",
        "<|tool_call|>{\"a\": 1}<|/tool_call|><|endoftext|>",
        "<|end|> after <|user|>  spaced",
    ],
    "gemma3": [
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "<start_of_turn> spaced",
    ],
    "llama3": [
        "<|begin_of_text|>",
        "<|begin_of_text|>Hello",
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "answer<|eot_id|>",
        "<|eot_id|> after",
        "<|eom_id|><|python_tag|>print(1)<|eom_id|>",
        "<|end_of_text|><|end_of_text|>",
        "<|reserved_special_token_0|>x<|reserved_special_token_2|>",
        "<|finetune_right_pad_id|>",
        "<|eot_id|",
        "<|eot_id|><|eot_id|",
        "<|start_header_id|> user <|end_header_id|>",
    ],
    "qwen2": [
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>",
        "done<|im_end|>",
        "<|im_end|> trailing",
        "<|im_start|><|im_start|>",
        "<|im_end",
        "x<|endoftext|>y<|im_end|>z",
        " <|im_start|> spaced <|im_end|> ",
    ],
    "mistral": [
        "[INST] What is the capital of France? [/INST]",
        "<s>[INST] Hi [/INST] Hello!</s>[INST] Bye [/INST]",
        "[INST]Hi[/INST]",
        "[INST]\n\nhello",
        "x[INST]y",
        " [INST] leading space",
        "[/INST] The answer is 42.</s>",
        "<s>",
        "</s>",
        "<s><s>",
        "<unk>",
        "a<unk>b",
        "[TOOL_CALLS] [{\"name\": \"f\"}]",
        "[AVAILABLE_TOOLS] [][/AVAILABLE_TOOLS][INST] q [/INST]",
        "[TOOL_RESULTS] {} [/TOOL_RESULTS]",
        "[INST",
        "[INST] [INST] [INST]",
    ],
}


# Byte strings that are not valid UTF-8 (kept out of the text set, whose JSON holds text): BPE
# repairs them to U+FFFD first, SentencePiece takes them as they are. Not here: encoded
# surrogates (llama.cpp's BPE keeps them as code points, Switchyard makes them U+FFFD) and code
# points above U+10FFFF (llama.cpp's BPE aborts on them with "invalid codepoint").
RAW_BYTES = [
    b"a\xffb",
    b"\xe2\x82",
    b"caf\xc3",
    b"\xc3 x",
    b"\xf0 \xf0\x9f\x98 hi",
    b"\x80\x80 \xbf",
    b"\xc0\xaf overlong",
]


def texts_for(family):
    seen, out = set(), []
    for t in [t for t, _ in TOKENIZER_CASES] + EXTRA_TEXTS + SPECIAL_TEXTS.get(family, []) + [LONG_PARAGRAPH * 3]:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def pieces(vocab, ids, special):
    out = b""
    buf = ctypes.create_string_buffer(256)
    for t in ids:
        n = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, special)
        out += buf.raw[:n]
    return out


def detokenize(vocab, ids, remove_special, unparse_special):
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 64 + 16 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        if n >= 0:
            return buf.raw[:n]
        size = -n


def text_of(b, what):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        sys.exit(f"llamacpp_ref_tokens: {what} is not valid UTF-8: {b!r}")


def reference(path, family):
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    # Quiet: the double-BOS cases would each log a warning.
    logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    head = {
        "family": family,
        "model": os.path.basename(path),
        "n_vocab": n_vocab,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eot": llama_cpp.llama_vocab_eot(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "eog": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "control": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)],
    }
    cases = []
    for text in texts_for(family):
        raw = text.encode("utf-8")
        for parse_special in (False, True):
            for add_bos in (False, True):
                ids = llm.tokenize(raw, add_bos=add_bos, special=parse_special)
                what = f"{family} {text[:40]!r}"
                cases.append({
                    "text": text,
                    "add_bos": add_bos,
                    "parse_special": parse_special,
                    "ids": ids,
                    "pieces": text_of(pieces(vocab, ids, False), what),
                    "pieces_special": text_of(pieces(vocab, ids, True), what),
                    "detok": text_of(detokenize(vocab, ids, False, False), what),
                })
    raw_cases = []
    for raw in RAW_BYTES:
        for add_bos in (False, True):
            ids = llm.tokenize(raw, add_bos=add_bos, special=False)
            raw_cases.append({"hex": raw.hex(), "add_bos": add_bos, "ids": ids,
                              "pieces_hex": pieces(vocab, ids, False).hex()})
    return head, cases, raw_cases


def compact(v):
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def write_json(path, head, lists):
    """Compact JSON: one head entry per line, then each list with one case per line."""
    entries = [f"{json.dumps(k)}: {compact(v)}" for k, v in head.items()]
    entries += [f"{json.dumps(k)}: [\n" + ",\n".join(compact(row) for row in rows) + "\n]" for k, rows in lists.items()]
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("{" + ",\n".join(entries) + "}\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="make_test_models.py's output folder")
    args = ap.parse_args()
    with open(os.path.join(args.models, "manifest.json")) as f:
        manifest = json.load(f)
    chosen = {}
    for m in manifest["models"]:
        # One file per family: the generated f16 one, or a real model file (any type).
        if (m["type"] == "f16" and m.get("shape", "tiny") == "tiny") or m.get("shape") == "real":
            chosen.setdefault(m["family"], m["path"])
    if not chosen:
        sys.exit("llamacpp_ref_tokens: no f16 tiny or real model in the manifest")
    for family, rel in sorted(chosen.items()):
        model = os.path.join(args.models, rel)
        out = os.path.splitext(model)[0] + ".tokens.json"
        newest_input = max(os.path.getmtime(p) for p in (model, __file__, os.path.join(HERE, "make_fixtures.py")))
        if os.path.exists(out) and os.path.getmtime(out) > newest_input:
            continue
        head, cases, raw_cases = reference(model, family)
        write_json(out, head, {"cases": cases, "raw_cases": raw_cases})
        print(f"llamacpp_ref_tokens: {os.path.relpath(out, args.models)}: {len(cases)} text cases, "
              f"{len(raw_cases)} invalid-UTF-8 cases", file=sys.stderr)


if __name__ == "__main__":
    main()
