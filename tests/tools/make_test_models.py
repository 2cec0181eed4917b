#!/usr/bin/env python3
"""Writes small random-weight GGUF models of the families Switchyard serves, with real
tokenizers trained offline and each family's chat template and metadata, then quantizes them
with llama.cpp's own quantizer (llama_model_quantize through llama-cpp-python's bindings).

No model hub is reachable on these machines and only SmolLM2-135M ships in a package, so the
weight types and architectures people bring (Llama 3.x, Qwen2/2.5, Mistral; Q4_K_M, Q5_K_M,
Q6_K, Q8_0, F16, BF16, ...) are checked on files made here. Shapes are realistic at small width
(GQA, head dim 64, widths multiples of 256 so every K-quant applies); `--shape 1b`, `--shape 3b` and
`--shape 8b` make Llama-3.2-1B-, 3B- and Llama-3.1-8B-shaped files for the benchmarks, `--shape 1.5b`
a Qwen2.5-1.5B-shaped one (with `--families qwen2`).

    make_test_models.py --out DIR [--families llama3,qwen2,mistral] [--types f16,q4_k_m,...]
                        [--shape tiny|1b|1.5b|3b|8b]

Needs numpy, gguf, tokenizers, sentencepiece, and llama.cpp (tests/tools/build_llamacpp.sh:
PYTHONPATH=<dir>/python LLAMA_CPP_LIB_PATH=<dir>/lib). Writes DIR/<family>/<family>-<type>.gguf
and DIR/manifest.json. Deterministic for a given environment; reruns skip files that exist.
"""

import argparse
import io
import json
import math
import os
import sys

import numpy as np

import gguf

HERE = os.path.dirname(os.path.abspath(__file__))

# ------------------------------------------------------------------------------------------------
# Training text: English prose and code from the Python standard library, plus short passages in
# other scripts (accents, Cyrillic, Greek, CJK, Arabic, Devanagari, emoji) so that the byte-level
# and byte-fallback paths are exercised.

MULTILINGUAL = [
    "Le petit déjeuner est servi à huit heures. Où est la gare ? Ça coûte vingt-cinq euros.",
    "Die Straße ist schön, aber die Brücke über den Fluss wird gerade repariert. Grüße aus Köln!",
    "El niño comió jalapeños en la mañana; ¿quién pagó la cuenta? ¡Qué día tan largo!",
    "Привет, мир! Как дела? Сегодня хорошая погода, и мы идём гулять в парк.",
    "Γειά σου Κόσμε. Η θάλασσα είναι ήρεμη σήμερα και ο ουρανός καθαρός.",
    "你好，世界！今天天气很好，我们去公园散步吧。机器学习模型需要大量的数据。",
    "日本語のテキストとカタカナ、ひらがな。東京は大きな都市です。",
    "안녕하세요, 세계! 반갑습니다. 오늘은 날씨가 좋네요.",
    "مرحبا بالعالم، كيف حالك؟ هذا نص قصير باللغة العربية.",
    "नमस्ते दुनिया, आप कैसे हैं? यह एक छोटा वाक्य है।",
    "Emoji: 😀 😃 😄 🍕 🌮 🚀 ✨ 👍🏽 👨‍👩‍👧‍👦 🇫🇷 🇯🇵 — and math: ∀x ∈ ℝ, x² ≥ 0, ½ + ¼ = ¾.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 1,000,000 +1 (555) 123-4567.",
    "Café crème, naïve façade, Ångström, Øresund, Ærø, Łódź, Kraków, İstanbul.",
]

STDLIB_MODULES = ["textwrap", "argparse", "json/__init__", "json/decoder", "shlex", "string", "heapq",
                  "bisect", "fnmatch", "glob", "calendar", "csv", "difflib", "base64", "colorsys"]


def corpus():
    import sysconfig
    lib = sysconfig.get_paths()["stdlib"]
    texts = []
    for m in STDLIB_MODULES:
        path = os.path.join(lib, m + ".py")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
    texts += MULTILINGUAL * 20
    return texts


# ------------------------------------------------------------------------------------------------
# Tokenizers

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k (Phi-4-mini's tokenizer.json, GGUF pre-tokenizer `gpt-4o`): case runs and contractions.
GPT4O_PAT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


# Extra training text for the `gpt-4o` vocabulary: contractions in both cases, so that its merges
# join a word and its contraction (n+', '+RE, ...), which llama-bpe's split cuts apart: a tokenizer
# that ignored gpt-4o's rule gives other ids. Mixed-case words and slashes too (no merge can cross
# a case change in a vocabulary trained with this split; test_tokenizer.cpp checks those cuts).
CASE_TEXT = ("HTTPS PSF SPS TPS HTTPServer getHTTPResponse XMLHttpRequest iPhone iPad eBay McDonald's "
             "I'M I'm they'RE they're we'VE don't DON'T can't it's IT'S you'LL she'D "
             "a/b//c http://x/y/ path/to/ and/or 1/2 ") * 30


def train_bpe(pattern, vocab_size, specials, pad_to=0, extra_text=()):
    """Byte-level BPE (tokenizers), specials appended at the end as in Llama 3 / Qwen2.
    Returns (tokens, token_types, merges, id_of)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus() + list(extra_text), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [TOKEN_NORMAL] * len(tokens)
    # Filler up to a realistic vocabulary size (never produced: no merge leads to them).
    for i in range(max(0, pad_to - len(tokens) - len(specials))):
        tokens.append(f"<|filler_{i}|>")
        types.append(TOKEN_UNUSED)
    for s in specials:
        tokens.append(s)
        types.append(TOKEN_CONTROL)
    return tokens, types, merges, {t: i for i, t in enumerate(tokens)}


def train_spm(vocab_size, control):
    """SentencePiece BPE with byte fallback, the way Llama 2 / Mistral vocabularies are made:
    <unk>=0, <s>=1, </s>=2, then `control` symbols, digits split, no normalization."""
    import sentencepiece as spm
    buf = io.BytesIO()
    lines = [line for t in corpus() for line in t.splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, control_symbols=control, character_coverage=0.9995,
        shuffle_input_sentence=False, num_threads=1, minloglevel=2, max_sentence_length=1 << 16)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(TOKEN_UNKNOWN)
        elif sp.is_control(i):
            types.append(TOKEN_CONTROL)
        elif sp.is_byte(i):
            types.append(TOKEN_BYTE)
        elif sp.is_unused(i):
            types.append(TOKEN_UNUSED)
        else:
            types.append(TOKEN_NORMAL)
    return tokens, scores, types


# ------------------------------------------------------------------------------------------------
# Chat templates, as the families' model cards publish them (abridged where tools are involved).

LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n")

# Every turn but a leading system message, as ChatML (Qwen2.5's and Qwen3's templates share it).
CHATML_TURNS = (
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'system' and loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
)

QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    + CHATML_TURNS +
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")

# Qwen3's, abridged (no tools, no reasoning_content): ChatML with the enable_thinking switch.
QWEN3_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    + CHATML_TURNS +
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n")

# Phi-3.5-mini's.
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")

# Phi-4-mini-instruct's template (no newline after the role markers; tools in the system turn).
PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
    "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
    "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")

MISTRAL_V3_TEMPLATE = (
    "{%- if messages[0][\"role\"] == \"system\" %}\n"
    "    {%- set system_message = messages[0][\"content\"] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message[\"role\"] == \"user\" %}\n"
    "        {%- if tools is not none and (message == user_messages[-1]) %}\n"
    "            {{- \"[AVAILABLE_TOOLS] [\" }}{{- tools|tojson }}{{- \"[/AVAILABLE_TOOLS]\" }}\n"
    "        {%- endif %}\n"
    "        {%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- else %}\n"
    "            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif message[\"role\"] == \"assistant\" %}\n"
    "        {{- \" \" + message[\"content\"]|trim + eos_token}}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n")

# ------------------------------------------------------------------------------------------------
# Families

SHAPES = {
    # n_embd, n_ff, n_layer, n_head, n_head_kv, vocab (trained merges), vocab padded to
    "tiny": dict(n_embd=256, n_ff=768, n_layer=2, n_head=4, n_head_kv=2, vocab=1200, pad_to=0, ctx=4096),
    "1b": dict(n_embd=2048, n_ff=8192, n_layer=16, n_head=32, n_head_kv=8, vocab=8000, pad_to=128256, ctx=131072),
    # Llama-3.2-3B-shaped (head dim 128); the f32 source is ~13 GB on disk and in memory while written.
    "3b": dict(n_embd=3072, n_ff=8192, n_layer=28, n_head=24, n_head_kv=8, vocab=8000, pad_to=128256, ctx=131072),
    # Llama-3.1-8B-shaped: its own output head (not tied), an f16 source (16 GB on disk; tensors are
    # generated one at a time while written, so memory holds one tensor).
    "8b": dict(n_embd=4096, n_ff=14336, n_layer=32, n_head=32, n_head_kv=8, vocab=8000, pad_to=128256, ctx=131072,
               tied=False, src_type="f16"),
    # Qwen2.5-1.5B-shaped (head dim 128, 2 KV heads for 12 query heads, a 151,936-token vocabulary
    # and a tied head), for `--families qwen2`: the wide head and the biases of that family.
    "1.5b": dict(n_embd=1536, n_ff=8960, n_layer=28, n_head=12, n_head_kv=2, vocab=8000, pad_to=151936, ctx=32768),
}

FAMILIES = ["llama3", "qwen2", "mistral", "qwen3", "gemma3", "phi3", "phi4"]
# Families added later get fewer weight types (each costs CI time): the float, 8-bit and
# K-quant paths, which is where their new arithmetic could differ.
FAMILY_TYPES = {"qwen3": ["f16", "q8_0", "q4_k_m"], "gemma3": ["f16", "q8_0", "q4_k_m"],
                "phi3": ["f16", "q8_0", "q4_k_m"],
                "phi4": ["f16"]}  # Phi-4-mini: phi3 weights again, new here is its tokenizer
# Per family: heads wider than n_embd / n_head (attention.key_length), layers (Gemma 3 needs six
# for one global layer after five sliding-window ones), and the sliding window (short, so the
# test prompts cross it and block boundaries).
FAMILY_SHAPE = {"qwen3": dict(head_dim=128), "gemma3": dict(head_dim=128, n_head_kv=1, n_layer=6, window=12)}
SHAPE_SEEDS = {"1b": 0, "tiny": 1, "3b": 2, "8b": 3, "1.5b": 4}  # fixed, so a new shape changes no existing file
# Gemma 3 keys the common files leave out but other converters and checkpoints write, each set
# away from llama.cpp's default so that a runtime ignoring one gives other logits: the
# sliding-window layers as a per-layer array (default: 5 of every 6), the windowed layers' RoPE
# base (default 10k) and a final logit soft-cap (default none). The same weights and vocabulary
# as the gemma3 file, in its own file, gemma3/gemma3-keys-f16.gguf.
GEMMA3_KEYS = dict(pattern=[True, False, True, True, False, True], freq_base_swa=20000.0, softcap=30.0)

# llama.cpp ftype per weight-type name (llama_cpp.LLAMA_FTYPE_*).
FTYPES = {
    "f32": "LLAMA_FTYPE_ALL_F32", "f16": "LLAMA_FTYPE_MOSTLY_F16", "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0", "q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q4_k_s": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "q2_k": "LLAMA_FTYPE_MOSTLY_Q2_K",
}
DEFAULT_TYPES = ["f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k_m", "q5_k_m", "q6_k"]


def llama3_rope_factors(head_dim, base, factor=32.0, low=1.0, high=4.0, original_ctx=8192):
    """Per-frequency divisors of Llama 3.1/3.2 RoPE scaling (rope_freqs.weight in GGUF)."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original_ctx / high:
            out.append(1.0)
        elif wavelen > original_ctx / low:
            out.append(factor)
        else:
            smooth = (original_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def add_spm_vocab(w, vocab_size, control, eos, add_bos, space_prefix):
    """A SentencePiece vocabulary trained here (train_spm), with its ids and flags, into writer w.
    `eos`: the end-of-generation token's text, or None for </s> (id 2). Returns the token list."""
    tokens, scores, types = train_spm(max(vocab_size, 1000), control)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(tokens.index(eos) if eos else 2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(space_prefix)
    return tokens


def write_family(family, shape, path, arch=None, gemma3_keys=None):
    s = dict(SHAPES[shape])
    s.update(FAMILY_SHAPE.get(family, {}) if shape == "tiny" else {})
    E, F, L, H, HKV = s["n_embd"], s["n_ff"], s["n_layer"], s["n_head"], s["n_head_kv"]
    HD = s.get("head_dim", E // H)
    arch = arch or ("phi3" if family == "phi4" else family if family in ("qwen2", "qwen3", "gemma3", "phi3") else "llama")
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"switchyard-test-{family}-{shape}")
    w.add_context_length(s["ctx"] if family not in ("mistral", "phi3", "phi4") else 32768 if family == "mistral" else 131072)
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_dimension_count(HD)
    if HD != E // H:
        w.add_key_length(HD)
        w.add_value_length(HD)
    w.add_layer_norm_rms_eps(1e-5 if family not in ("qwen2", "qwen3", "gemma3") else 1e-6)
    f16_src = s.get("src_type") == "f16"
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16_src else gguf.LlamaFileType.ALL_F32)

    tied = family in ("llama3", "qwen2", "gemma3", "phi4")  # phi3: separate output, as Phi-3.5-mini
    tied = s.get("tied", tied)
    extra = {}
    if family == "llama3":
        w.add_rope_freq_base(500000.0)
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
        tokens, types, merges, id_of = train_bpe(LLAMA3_PAT, s["vocab"], specials, s["pad_to"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("llama-bpe")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(id_of["<|begin_of_text|>"])
        w.add_eos_token_id(id_of["<|eot_id|>"])
        w.add_pad_token_id(id_of["<|finetune_right_pad_id|>"])
        w.add_add_bos_token(True)
        w.add_chat_template(LLAMA3_TEMPLATE)
        extra["rope_freqs.weight"] = llama3_rope_factors(HD, 500000.0)
    elif family in ("qwen2", "qwen3"):
        w.add_rope_freq_base(1000000.0)
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tokens, types, merges, id_of = train_bpe(QWEN2_PAT, s["vocab"], specials, s["pad_to"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(id_of["<|endoftext|>"])
        w.add_eos_token_id(id_of["<|im_end|>"])
        w.add_pad_token_id(id_of["<|endoftext|>"])
        w.add_add_bos_token(False)
        w.add_chat_template(QWEN3_TEMPLATE if family == "qwen3" else QWEN2_TEMPLATE)
    elif family == "gemma3":
        # SentencePiece without the space prefix, <start_of_turn>/<end_of_turn> as controls, no
        # chat template in the file (as the common conversions ship it), a short sliding window.
        w.add_rope_freq_base(1000000.0)
        w.add_sliding_window(s["window"])
        if gemma3_keys:
            w.add_sliding_window_pattern(gemma3_keys["pattern"])
            w.add_rope_freq_base_swa(gemma3_keys["freq_base_swa"])
            w.add_final_logit_softcapping(gemma3_keys["softcap"])
        tokens = add_spm_vocab(w, s["vocab"], ["<start_of_turn>", "<end_of_turn>"], None, True, False)
    elif family == "phi3":
        # Phi-3.5-mini's layout: SentencePiece vocabulary with its chat markers, fused attn_qkv and
        # gate/up ffn_up, LongRoPE short/long factors with an attention factor (a 4k original
        # context stretched to 128k: the tests' 512-token context takes the short factors).
        w.add_rope_freq_base(10000.0)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(32) / math.log(4096)))
        w.add_rope_scaling_orig_ctx_len(4096)
        control = ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>", "<|endoftext|>"]
        tokens = add_spm_vocab(w, s["vocab"], control, "<|end|>", False, True)
        w.add_chat_template(PHI3_TEMPLATE)
        i = np.arange(HD // 2)
        extra["rope_factors_short.weight"] = (1.0 + 0.05 * i).astype(np.float32)
        extra["rope_factors_long.weight"] = (1.0 + 0.5 * i).astype(np.float32)
    elif family == "phi4":
        # Phi-4-mini's layout: phi3 weights and LongRoPE as above, a byte-level BPE vocabulary split
        # by the `gpt-4o` pre-tokenizer, <|endoftext|> as BOS and EOS, <|end|> ending turns.
        w.add_rope_freq_base(10000.0)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(32) / math.log(4096)))
        w.add_rope_scaling_orig_ctx_len(4096)
        specials = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>",
                    "<|/tool|>", "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>", "<|tag|>"]
        tokens, types, merges, id_of = train_bpe(GPT4O_PAT, s["vocab"], specials, s["pad_to"], [CASE_TEXT])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-4o")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(id_of["<|endoftext|>"])
        w.add_eos_token_id(id_of["<|endoftext|>"])
        w.add_pad_token_id(id_of["<|endoftext|>"])
        w.add_add_bos_token(False)
        w.add_chat_template(PHI4_MINI_TEMPLATE)
        i = np.arange(HD // 2)
        extra["rope_factors_short.weight"] = (1.0 + 0.05 * i).astype(np.float32)
        extra["rope_factors_long.weight"] = (1.0 + 0.5 * i).astype(np.float32)
    else:  # mistral: llama architecture, SentencePiece vocabulary, [INST] template (v0.3)
        w.add_rope_freq_base(1000000.0)
        control = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                   "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
        tokens = add_spm_vocab(w, s["vocab"], control, None, True, True)
        w.add_chat_template(MISTRAL_V3_TEMPLATE)
    n_vocab = len(tokens)
    w.add_vocab_size(n_vocab)

    # Weights: N(0, 1/fan_in) products, norms near 1, an output head scaled so logits spread over a
    # few units (clear winners at most positions, as in trained models).
    rng = np.random.default_rng(FAMILIES.index(family) * 1000 + SHAPE_SEEDS[shape])

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * (gain / math.sqrt(cols))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    KV, Q = HKV * HD, H * HD
    lazy = []  # (name, shape, dtype, make): written in this order

    def put(name, shape, make):
        lazy.append((name, tuple(shape), np.float16 if f16_src and len(shape) == 2 else np.float32, make))

    embd_gain = 6.0 / math.sqrt(E) if tied else 1.0
    put("token_embd.weight", (n_vocab, E), lambda: rng.standard_normal((n_vocab, E), dtype=np.float32) * embd_gain)
    for name, arr in extra.items():
        put(name, arr.shape, lambda arr=arr: arr)
    for l in range(L):
        p = f"blk.{l}."
        put(p + "attn_norm.weight", (E,), lambda: norm(E))
        if family in ("phi3", "phi4"):  # one fused matrix: Q rows, then K, then V
            put(p + "attn_qkv.weight", (Q + 2 * KV, E), lambda: np.concatenate([mat(Q, E, 2.0), mat(KV, E, 2.0), mat(KV, E)]))
        else:
            put(p + "attn_q.weight", (Q, E), lambda: mat(Q, E, 2.0))
            put(p + "attn_k.weight", (KV, E), lambda: mat(KV, E, 2.0))
            put(p + "attn_v.weight", (KV, E), lambda: mat(KV, E))
        if family == "qwen2":
            put(p + "attn_q.bias", (E,), lambda: (0.5 * rng.standard_normal(E, dtype=np.float32)).astype(np.float32))
            put(p + "attn_k.bias", (KV,), lambda: (0.5 * rng.standard_normal(KV, dtype=np.float32)).astype(np.float32))
            put(p + "attn_v.bias", (KV,), lambda: (0.1 * rng.standard_normal(KV, dtype=np.float32)).astype(np.float32))
        if family in ("qwen3", "gemma3"):
            put(p + "attn_q_norm.weight", (HD,), lambda: norm(HD))
            put(p + "attn_k_norm.weight", (HD,), lambda: norm(HD))
        put(p + "attn_output.weight", (E, Q), lambda: mat(E, Q))
        put(p + "ffn_norm.weight", (E,), lambda: norm(E))
        if family == "gemma3":
            # Block outputs as large as the scaled embedding (rms ~6), so that the context, and
            # with it the sliding window, decides the logits rather than the current token alone.
            put(p + "post_attention_norm.weight", (E,), lambda: 6.0 * norm(E))
            put(p + "post_ffw_norm.weight", (E,), lambda: 6.0 * norm(E))
        if family in ("phi3", "phi4"):  # gate rows, then up rows
            put(p + "ffn_up.weight", (2 * F, E), lambda: np.concatenate([mat(F, E), mat(F, E)]))
        else:
            put(p + "ffn_gate.weight", (F, E), lambda: mat(F, E))
            put(p + "ffn_up.weight", (F, E), lambda: mat(F, E))
        put(p + "ffn_down.weight", (E, F), lambda: mat(E, F))
    put("output_norm.weight", (E,), lambda: norm(E))
    if not tied:
        put("output.weight", (n_vocab, E), lambda: mat(n_vocab, E, 6.0))
    # Tensor infos first, then each tensor generated as it is written (in the order added, so the
    # random draws are those of adding them all at once).
    for name, shape, dtype, _ in lazy:
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, dtype, make in lazy:
        arr = np.asarray(make(), dtype=dtype)
        assert arr.shape == tuple(shape), (name, arr.shape, shape)
        w.write_tensor_data(arr)
    w.close()


def quantize(src, dst, type_name):
    import ctypes
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[type_name])
    params.nthread = os.cpu_count() or 2
    tmp = dst + ".part"
    rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize({src} -> {type_name}) failed: {rc}")
    os.replace(tmp, dst)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES))
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {"models": []}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    have = {(m["family"], m["type"], m["shape"]) for m in manifest["models"]}
    for family in args.families.split(","):
        if family not in FAMILIES:
            sys.exit(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
        d = os.path.join(args.out, family)
        os.makedirs(d, exist_ok=True)
        stem = family if args.shape == "tiny" else f"{family}-{args.shape}"
        src_type = SHAPES[args.shape].get("src_type", "f32")
        src = os.path.join(d, f"{stem}-{src_type}.gguf")
        if not os.path.exists(src):
            print(f"make_test_models: writing {src}", file=sys.stderr)
            write_family(family, args.shape, src + ".part")
            os.replace(src + ".part", src)
        types = args.types.split(",")
        if family in FAMILY_TYPES and args.types == ",".join(DEFAULT_TYPES):
            types = FAMILY_TYPES[family]
        for t in types:
            if t not in FTYPES:
                sys.exit(f"unknown type {t!r} (known: {', '.join(FTYPES)})")
            dst = src if t == src_type else os.path.join(d, f"{stem}-{t}.gguf")
            if not os.path.exists(dst):
                print(f"make_test_models: quantizing {os.path.basename(dst)}", file=sys.stderr)
                quantize(src, dst, t)
            if (family, t, args.shape) not in have:
                manifest["models"].append({"family": family, "type": t, "shape": args.shape,
                                           "path": os.path.relpath(dst, args.out)})
                have.add((family, t, args.shape))
    # The Gemma 3 file with the optional keys (GEMMA3_KEYS), checked as a gemma3 file like the others.
    if args.shape == "tiny" and "gemma3" in args.families.split(","):
        src = os.path.join(args.out, "gemma3", "gemma3-keys-f32.gguf")
        dst = os.path.join(args.out, "gemma3", "gemma3-keys-f16.gguf")
        if not os.path.exists(dst):
            print(f"make_test_models: writing {dst}", file=sys.stderr)
            write_family("gemma3", "tiny", src + ".part", gemma3_keys=GEMMA3_KEYS)
            os.replace(src + ".part", src)
            quantize(src, dst, "f16")
            os.remove(src)
        rel = os.path.relpath(dst, args.out)
        if all(m["path"] != rel for m in manifest["models"]):
            manifest["models"].append({"family": "gemma3", "type": "f16", "shape": "tiny", "variant": "keys",
                                       "path": rel})
    # Files a worker must refuse with one clear error (tests/unit/test_model_families.cpp): an
    # architecture it does not implement, and weight types it does not load (Q2_K: q2_K/q3_K).
    if args.shape == "tiny":
        d = os.path.join(args.out, "unsupported")
        os.makedirs(d, exist_ok=True)
        bad_arch = os.path.join(d, "gemma2-arch.gguf")
        if not os.path.exists(bad_arch):
            write_family("llama3", "tiny", bad_arch + ".part", arch="gemma2")
            os.replace(bad_arch + ".part", bad_arch)
        bad_type = os.path.join(d, "llama3-q2_k.gguf")
        if not os.path.exists(bad_type):
            quantize(os.path.join(args.out, "llama3", "llama3-f32.gguf"), bad_type, "q2_k")
        manifest["unsupported"] = [
            {"path": os.path.relpath(bad_arch, args.out), "error": ["architecture 'gemma2' is not supported"]},
            {"path": os.path.relpath(bad_type, args.out), "error": ["tensor 'blk.", "has type q2_K"]},
        ]
    with open(manifest_path + ".part", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(manifest_path + ".part", manifest_path)


if __name__ == "__main__":
    main()
