"""`switchyard-worker export-tokenizer` writes a Hugging Face tokenizer folder that `transformers`
loads offline and that tokenizes exactly as the worker does (so benchmark clients count the tokens
the server counts): token ids on the llama.cpp reference texts of SmolLM2 and the generated Llama 3,
Qwen2 and Mistral models, chat templates rendering llama.cpp's text for every format, and chat
prompts tokenized to the worker's ids."""
import json
import os
import subprocess
import tempfile

import pytest

from support import skip_module
from worker_client import BUILD, MODEL, ROOT, WORKER

try:
    import transformers
except ImportError:  # deploy/setup.sh installs it; a skip here would pass silently
    skip_module("transformers is not installed (deploy/setup.sh)")
MODELS_DIR = os.environ.get("SY_TEST_MODELS_DIR", os.path.join(BUILD, "test-models"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

# (model file, llama.cpp token reference)
CASES = {
    "smollm2": (MODEL, os.path.join(FIXTURES, "tokenizer.json")),
    **{fam: (os.path.join(MODELS_DIR, fam, f"{fam}-f16.gguf"), os.path.join(MODELS_DIR, fam, f"{fam}-f16.tokens.json"))
       for fam in ("llama3", "qwen2", "mistral", "qwen3", "gemma3", "phi3", "phi4")},
}


def export(model, out, *extra):
    subprocess.run([WORKER, "export-tokenizer", "--model", model, "--out", out, *extra], check=True,
                   capture_output=True)
    return transformers.AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def tmp():
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.mark.parametrize("name", sorted(CASES))
def test_exported_tokenizer_gives_the_workers_ids(tmp, name):
    model, reference = CASES[name]
    if not os.path.exists(model) or not os.path.exists(reference):
        pytest.skip(f"{model} or {reference} missing (deploy/setup.sh; ctest -R models/generate)")
    tok = export(model, os.path.join(tmp, name))
    specials = {t.content for t in tok.added_tokens_decoder.values()}
    checked = 0
    for c in json.load(open(reference, encoding="utf-8"))["cases"]:
        # Hugging Face always matches added tokens in text: cases that tokenize specials as plain
        # text are llama.cpp's parse_special=false, which it cannot express.
        if not c["parse_special"] and any(s and s in c["text"] for s in specials):
            continue
        assert tok.encode(c["text"], add_special_tokens=c["add_bos"]) == c["ids"], c["text"]
        checked += 1
    assert checked >= 50


def test_exported_chat_templates_render_llama_cpps_text_for_every_format(tmp):
    fx = json.load(open(os.path.join(FIXTURES, "chat_templates.json"), encoding="utf-8"))
    conversations = {c["name"]: c["messages"] for c in fx["conversations"]}
    checked = 0
    # A model without BOS (the templates then start with the format's own text): the small
    # generated Qwen2 file when it exists (fast to load), else SmolLM2.
    small = CASES["qwen2"][0] if os.path.exists(CASES["qwen2"][0]) else MODEL
    for f in fx["formats"]:
        tok = export(small, os.path.join(tmp, "fmt-" + f["name"]), "--chat-template", f["name"])
        for r in f["renders"]:
            if not conversations[r["conversation"]]:
                continue  # transformers refuses an empty conversation
            got = tok.apply_chat_template(conversations[r["conversation"]], tokenize=False,
                                          add_generation_prompt=r["add_generation_prompt"])
            assert got == r["text"], (f["name"], r["conversation"], r["add_generation_prompt"])
            checked += 1
    assert checked >= 15 * 10


def test_exported_r1_template_opens_thinking_and_drops_past_thinking(tmp):
    # The DeepSeek-R1 distills' template, exported as Switchyard renders it (the same strings as
    # tests/unit/test_chat_template.cpp expects of chat_template::apply).
    small = CASES["qwen2"][0] if os.path.exists(CASES["qwen2"][0]) else MODEL
    tok = export(small, os.path.join(tmp, "r1"), "--chat-template",
                 os.path.join(FIXTURES, "chat_templates", "deepseek-r1-distill.jinja"))
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
               {"role": "user", "content": "Times 3?"}]
    got = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    assert got == ("Be brief.\n\n<｜User｜>2+2?<｜Assistant｜>\n\n4<｜end▁of▁sentence｜><｜User｜>Times 3?"
                   "<｜Assistant｜><think>\n")


def test_exported_v31_template_reads_its_thinking_switch(tmp):
    # DeepSeek-V3.1's template, exported as Switchyard renders it: past turns closed, and the
    # generation prompt opened or closed by `thinking` (unset: closed, the template's default).
    small = CASES["qwen2"][0] if os.path.exists(CASES["qwen2"][0]) else MODEL
    tok = export(small, os.path.join(tmp, "v31"), "--chat-template",
                 os.path.join(FIXTURES, "chat_templates", "deepseek-v3.1.jinja"))
    history = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nAdd.\n</think>4"},
               {"role": "user", "content": "Times 3?"}]
    base = "<｜User｜>2+2?<｜Assistant｜></think>4<｜end▁of▁sentence｜><｜User｜>Times 3?<｜Assistant｜>"
    assert tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True) == base + "</think>"
    assert tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True, thinking=False) == \
        base + "</think>"
    assert tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True, thinking=True) == \
        base + "<think>"


def test_exported_thinking_templates_render_the_templates_own_text(tmp):
    # Qwen3's, R1's and V3.1's templates exported as Switchyard renders them give, under
    # transformers, what the templates themselves give (jinja2, recorded in the fixture): past
    # thinking dropped or rewritten, switches honoured.
    fx = json.load(open(os.path.join(FIXTURES, "chat_templates.json"), encoding="utf-8"))
    conversations = {c["name"]: c["messages"] for c in fx["thinking_conversations"]}
    small = CASES["qwen2"][0] if os.path.exists(CASES["qwen2"][0]) else MODEL
    checked = 0
    for s in fx["sources"]:
        if "template_renders" not in s:
            continue
        tok = export(small, os.path.join(tmp, "think-" + s["file"]), "--chat-template",
                     os.path.join(FIXTURES, "chat_templates", s["file"]))
        for r in s["template_renders"]:
            got = tok.apply_chat_template(conversations[r["conversation"]], tokenize=False,
                                          add_generation_prompt=r["add_generation_prompt"], **r.get("kwargs", {}))
            assert got == r["text"], (s["file"], r["conversation"], r["add_generation_prompt"], r.get("kwargs"))
            checked += 1
    assert checked >= 3 * 2 * len(conversations)


@pytest.mark.parametrize("name", sorted(CASES))
def test_exported_chat_prompt_tokenizes_to_the_workers_ids(tmp, name):
    model, _ = CASES[name]
    if not os.path.exists(model):
        pytest.skip(f"{model} missing")
    tok = export(model, os.path.join(tmp, "chat-" + name))
    system, user = "You are a helpful assistant.", "What is the capital of France?"
    ours = json.loads(subprocess.run([WORKER, "tokenize", "--model", model, "--chat", "--system", system, "--prompt",
                                      user], check=True, capture_output=True, text=True).stdout)
    theirs = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                     tokenize=True, add_generation_prompt=True)
    if not isinstance(theirs, list):  # transformers 5 returns a BatchEncoding
        theirs = theirs["input_ids"]
    assert theirs == ours
