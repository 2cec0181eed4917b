#!/usr/bin/env python3
"""Records llama.cpp's chat-template renderings into tests/fixtures/chat_templates.json.

llama.cpp's C function llama_chat_apply_template (called through llama-cpp-python's low-level
ctypes bindings, no model loaded) renders a set of conversations, with and without the
generation prompt:

  formats  every format Switchyard renders, given by name ("chatml", "llama3", ...);
  sources  every Jinja file in tests/fixtures/chat_templates/, given as the template source, so
           llama.cpp recognises the format itself. `llama_cpp_format` is the format whose renderings
           equal those of the source (null when llama.cpp recognises none); SOURCES below names the
           one expected, and the tool stops if llama.cpp disagrees.

Switchyard differs from llama.cpp in a few places on purpose: a ChatML template's fixed default
system prompt (SmolLM2's, Qwen2.5's) is kept. For those sources llama.cpp is given the
conversation with that system message in front (when it does not start with one), which is
what the template itself renders; the prompt is stored as `default_system`. And a DeepSeek-R1
template's generation prompt opens the thinking (`<think>\n` after llama.cpp's `<｜Assistant｜>`):
GENERATION_SUFFIX appends it to llama.cpp's renderings with the generation prompt, stored as
`generation_suffix`. DeepSeek-V3.1's template closes the thinking instead (`</think>`, its
default: `thinking` off) there and writes `</think>` at the start of every past assistant turn:
ASSISTANT_PREFIX puts that in front of each assistant message's content given to llama.cpp (as
for the default system prompt, what the template itself renders), stored as `assistant_prefix`.
Qwen3's template gives a final assistant turn without thinking an empty thinking block:
FINAL_ASSISTANT_PREFIX does the same for llama.cpp, stored as `final_assistant_prefix`.

Past turns' thinking, which Qwen3's and R1's templates drop and llama.cpp keeps, is recorded from
the templates themselves: jinja2 renders THINKING_CONVERSATIONS with each file of
THINKING_SOURCES (as Hugging Face's apply_chat_template does: sandboxed, trim_blocks,
lstrip_blocks; bos_token empty, since Switchyard's text never starts with BOS) into
`template_renders`. They hold no system message, which R1's and V3.1's templates place apart
from llama.cpp's deepseek3. TEMPLATE_KWARGS adds renderings with template variables set
(Qwen3's `enable_thinking`, V3.1's `thinking` switch), each entry with its `kwargs`;
THINKING_SKIP leaves out conversations (recorded as `template_renders_skip`) where a template
differs from llama.cpp outside the thinking.

Usage (llama.cpp built by tests/tools/build_llamacpp.sh build/llama.cpp; a Python with numpy and
typing_extensions, which importing llama_cpp needs; jinja2, when present, syntax-checks the files):
  PYTHONPATH=build/llama.cpp/python LLAMA_CPP_LIB_PATH=build/llama.cpp/lib \
      python3 tests/tools/make_chat_fixtures.py [--out tests/fixtures/chat_templates.json]
"""
import argparse
import ctypes
import json
import os
import sys

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_DIR = os.path.join(ROOT, "tests", "fixtures", "chat_templates")

FORMATS = [
    "chatml", "llama3", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1",
    "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "zephyr", "gemma",
    "deepseek3",
]

# file -> (the format llama.cpp is expected to recognise, or None; ChatML default system prompt)
SOURCES = {
    "smollm2-instruct.jinja": ("chatml", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    "qwen2.5-instruct.jinja": ("chatml", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
    "qwen3.jinja": ("chatml", ""),
    "llama-3.1-instruct.jinja": ("llama3", ""),
    "llama-3.2-instruct.jinja": ("llama3", ""),
    "mistral-7b-instruct-v0.1.jinja": ("mistral-v1", ""),
    "mistral-7b-instruct-v0.1-2023.jinja": ("llama2", ""),
    "mistral-7b-instruct-v0.3.jinja": ("mistral-v3", ""),
    "mistral-nemo-instruct.jinja": ("mistral-v3-tekken", ""),
    "mistral-small-3-instruct.jinja": ("mistral-v7", ""),
    "llama-2-chat.jinja": ("llama2-sys-strip", ""),
    "codellama-instruct.jinja": ("llama2-sys-bos", ""),
    "llama-2-sys-single-bos.jinja": ("llama2-sys", ""),
    "phi-3-mini-instruct.jinja": ("phi3", ""),
    # Phi-4-mini: no newline after the role markers in its own Jinja; llama.cpp renders it as phi3.
    "phi-4-mini-instruct.jinja": ("phi3", ""),
    "zephyr-7b-beta.jinja": ("glmedge", ""),  # llama.cpp's rules read <|user|> + <|assistant|> as GLM-Edge
    "zephyr-role-tags.jinja": ("zephyr", ""),
    "gemma-2-it.jinja": ("gemma", ""),
    "phi-4.jinja": ("phi4", ""),
    "role-colon.jinja": (None, ""),
    "deepseek-r1-distill.jinja": ("deepseek3", ""),
    "deepseek-v3.1.jinja": ("deepseek3", ""),
}

# file -> what the template's generation prompt writes after llama.cpp's (the R1 distills open the
# thinking); Switchyard renders it too, so it is appended to llama.cpp's renderings with one.
GENERATION_SUFFIX = {
    "deepseek-r1-distill.jinja": "<think>\n",
    "deepseek-v3.1.jinja": "</think>",
}

# file -> what the template writes in front of every assistant message's content (DeepSeek-V3.1
# closes the thinking of past turns); Switchyard renders it too, so llama.cpp is given the
# conversation with it.
ASSISTANT_PREFIX = {
    "deepseek-v3.1.jinja": "</think>",
}

# file -> what the template writes in front of the content of a conversation's last message
# when that is an assistant turn answering a user (Qwen3 gives such a turn without thinking an
# empty thinking block); Switchyard renders it too, so llama.cpp is given the conversation with it.
FINAL_ASSISTANT_PREFIX = {
    "qwen3.jinja": "<think>\n\n</think>\n\n",
}


def msg(role, content):
    return {"role": role, "content": content}


THINKING_SOURCES = ["qwen3.jinja", "deepseek-r1-distill.jinja", "deepseek-v3.1.jinja"]

# file -> template variables to render THINKING_CONVERSATIONS with too (beyond none at all).
TEMPLATE_KWARGS = {
    "qwen3.jinja": [{"enable_thinking": True}, {"enable_thinking": False}],
    "deepseek-v3.1.jinja": [{"thinking": True}, {"thinking": False}],
}

# file -> THINKING_CONVERSATIONS it is not rendered with, where the template and llama.cpp's
# format differ outside the thinking and Switchyard follows llama.cpp (docs/worker.md): V3.1's
# template writes no generation prompt after an assistant turn and no <｜Assistant｜> between two
# assistant turns.
THINKING_SKIP = {
    "deepseek-v3.1.jinja": ["ends_with_thinking", "ends_with_answer", "untidy_thinking", "tool_steps"],
}


CONVERSATIONS = [
    ("system_user", [msg("system", "You are a helpful assistant."), msg("user", "Hello!")]),
    ("user_only", [msg("user", "What is the capital of France?")]),
    ("multi_turn", [
        msg("system", "Answer in one sentence."),
        msg("user", "Hi"),
        msg("assistant", "Hello! How can I help?"),
        msg("user", "Tell me a joke."),
    ]),
    ("multi_turn_no_system", [
        msg("user", "2+2?"),
        msg("assistant", "4"),
        msg("user", "And times 3?"),
        msg("assistant", "12"),
        msg("user", "Thanks"),
    ]),
    ("ends_with_assistant", [msg("user", "Say hi"), msg("assistant", "Hi!")]),
    ("whitespace", [
        msg("system", "  Be terse.\n"),
        msg("user", "\n  Hello there  \n\n"),
        msg("assistant", "  Hi!  \n"),
        msg("user", "\tbye\t"),
    ]),
    ("ascii_space_kinds", [msg("user", "\r\n\v\f line one\nline two \t\r\n")]),
    ("non_ascii_space", [msg("user", "\u00a0nbsp kept\u00a0")]),
    ("empty_contents", [msg("system", ""), msg("user", ""), msg("assistant", ""), msg("user", "x")]),
    ("empty_user", [msg("user", "")]),
    ("two_systems", [msg("system", " First. "), msg("system", "Second."), msg("user", "Go")]),
    ("system_mid", [msg("user", "a"), msg("assistant", "b"), msg("system", "c"), msg("user", "d")]),
    ("unicode", [msg("user", "Gr\u00fc\u00dfe, \u4e16\u754c \U0001f30d")]),
    ("empty", []),
]

THINKING_CONVERSATIONS = [
    ("past_thinking", [
        msg("user", "2+2?"),
        msg("assistant", "<think>\nAdd them.\n</think>\n\n4"),
        msg("user", "Times 3?"),
        msg("assistant", "12"),
        msg("user", "Minus 1?"),
    ]),
    ("several_closes", [msg("user", "Hi"), msg("assistant", "<think>a</think>b</think>\n\nHello"), msg("user", "Bye")]),
    ("no_thinking", [msg("user", "Hi"), msg("assistant", "Hello"), msg("user", "Bye")]),
    # Qwen3 rewrites the assistant turns after the last user query: the last one, and any other
    # with thinking, as "<think>\nREASONING\n</think>\n\nANSWER" (untidy tags tidied, an answer
    # without thinking given an empty block); a user turn that is only a <tool_response> is not a
    # query, so the steps of the answer being written keep their thinking.
    ("ends_with_thinking", [msg("user", "Hi"), msg("assistant", "<think>a</think>b")]),
    ("ends_with_answer", [msg("user", "Hi"), msg("assistant", "\nHello")]),
    ("untidy_thinking", [
        msg("user", "Q1"),
        msg("assistant", "Sure. <think>\n\n r \n\n</think>\n\n\nans"),
        msg("user", "Q2"),
        msg("assistant", "pre<think>x<think>y\n</think>\nz</think>w"),
    ]),
    ("tool_steps", [
        msg("user", "Q"),
        msg("assistant", "<think>\nplan\n</think>\n\nstep one"),
        msg("user", "<tool_response>\n42\n</tool_response>"),
        msg("assistant", "<think></think>\n\nstep two"),
        msg("assistant", "no thinking"),
        msg("user", "<tool_response>\n43\n</tool_response>"),
    ]),
    ("query_after_tool", [
        msg("user", "<tool_response>\n1\n</tool_response>"),
        msg("assistant", "<think>t</think>one"),
        msg("user", "Q <tool_response>"),
        msg("assistant", "<think>u</think>two"),
        msg("user", "<tool_response>2</tool_response>"),
    ]),
]


def render(tmpl, messages, add_generation_prompt):
    """llama.cpp's rendering, or None when it refuses the template."""
    keep = []  # the encoded strings must outlive the call
    chat = (llama_cpp.llama_chat_message * max(1, len(messages)))()
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        chat[i].role = role
        chat[i].content = content
    t = tmpl.encode()
    n = llama_cpp.llama_chat_apply_template(t, chat, len(messages), add_generation_prompt, None, 0)
    if n < 0:
        return None
    buf = ctypes.create_string_buffer(n + 1)
    n2 = llama_cpp.llama_chat_apply_template(t, chat, len(messages), add_generation_prompt, buf, n + 1)
    assert n2 == n, (n, n2)
    return buf.raw[:n].decode("utf-8")


def render_all(tmpl, default_system="", generation_suffix="", assistant_prefix="", final_assistant_prefix=""):
    """[{conversation, add_generation_prompt, text}] for every conversation, or None."""
    out = []
    for name, messages in CONVERSATIONS:
        if default_system and messages and messages[0]["role"] != "system":
            messages = [msg("system", default_system)] + messages
        if assistant_prefix:
            messages = [msg(m["role"], assistant_prefix + m["content"]) if m["role"] == "assistant" else m
                        for m in messages]
        if final_assistant_prefix and messages and messages[-1]["role"] == "assistant" and \
                any(m["role"] == "user" for m in messages):
            messages = messages[:-1] + [msg("assistant", final_assistant_prefix + messages[-1]["content"])]
        for gen in (True, False):
            text = render(tmpl, messages, gen)
            if text is None:
                return None
            if gen:
                text += generation_suffix
            out.append({"conversation": name, "add_generation_prompt": gen, "text": text})
    return out


def template_renders(file, source):
    """[{conversation, add_generation_prompt, text}]: the template's own renderings (jinja2)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    tmpl = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
    out = []
    for kwargs in [{}] + TEMPLATE_KWARGS.get(file, []):
        for name, messages in THINKING_CONVERSATIONS:
            if name in THINKING_SKIP.get(file, []):
                continue
            for gen in (True, False):
                r = {"conversation": name, "add_generation_prompt": gen}
                if kwargs:
                    r["kwargs"] = kwargs
                r["text"] = tmpl.render(messages=messages, add_generation_prompt=gen, bos_token="", **kwargs)
                out.append(r)
    return out


def builtin_names():
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(arr, n)
    return [arr[i].decode() for i in range(n)]


def syntax_check(path, source):
    try:
        import jinja2
    except ImportError:
        return
    try:
        jinja2.Environment().parse(source)
    except jinja2.TemplateSyntaxError as e:
        sys.exit(f"{path}: not valid Jinja: {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "chat_templates.json"))
    args = ap.parse_args()

    names = builtin_names()
    for f in FORMATS:
        if f not in names:
            sys.exit(f"llama.cpp has no built-in format '{f}'")
    by_name = {n: render_all(n) for n in names}

    formats = [{"name": f, "renders": by_name[f]} for f in FORMATS]

    on_disk = sorted(f for f in os.listdir(SOURCE_DIR) if f.endswith(".jinja"))
    if sorted(SOURCES) != on_disk:
        sys.exit(f"SOURCES and {SOURCE_DIR} differ: {sorted(set(SOURCES) ^ set(on_disk))}")
    sources = []
    for file in on_disk:
        expected, default_system = SOURCES[file]
        path = os.path.join(SOURCE_DIR, file)
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
        syntax_check(path, source)
        raw = render_all(source)
        matches = sorted(n for n, r in by_name.items() if raw is not None and r == raw)
        if expected is None:
            if raw is not None:
                sys.exit(f"{file}: llama.cpp renders it (as {matches}), expected no format")
        elif expected not in matches:
            sys.exit(f"{file}: llama.cpp's renderings match {matches or 'no built-in format'}, expected {expected}")
        entry = {
            "file": file,
            "llama_cpp_format": expected,
            "default_system": default_system,
            "generation_suffix": GENERATION_SUFFIX.get(file, ""),
        }
        if file in ASSISTANT_PREFIX:
            entry["assistant_prefix"] = ASSISTANT_PREFIX[file]
        if file in FINAL_ASSISTANT_PREFIX:
            entry["final_assistant_prefix"] = FINAL_ASSISTANT_PREFIX[file]
        entry["renders"] = render_all(source, default_system, GENERATION_SUFFIX.get(file, ""),
                                      ASSISTANT_PREFIX.get(file, ""),
                                      FINAL_ASSISTANT_PREFIX.get(file, "")) if expected in FORMATS else []
        sources.append(entry)
        if file in THINKING_SOURCES:
            sources[-1]["template_renders"] = template_renders(file, source)
            sources[-1]["template_renders_skip"] = THINKING_SKIP.get(file, [])
        print(f"{file:40s} {expected or '(none)':18s} {'also matches ' + str(matches) if len(matches) > 1 else ''}")

    doc = {
        "about": "llama.cpp's llama_chat_apply_template output (llama-cpp-python " + llama_cpp.__version__ +
                 "), recorded by tests/tools/make_chat_fixtures.py; checked by tests/unit/test_chat_template.cpp",
        "conversations": [{"name": n, "messages": m} for n, m in CONVERSATIONS],
        "thinking_conversations": [{"name": n, "messages": m} for n, m in THINKING_CONVERSATIONS],
        "formats": formats,
        "sources": sources,
    }
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    n_cases = sum(len(f["renders"]) for f in formats) + sum(len(s["renders"]) for s in sources)
    print(f"wrote {args.out}: {len(formats)} formats, {len(sources)} sources, {n_cases} renderings")


if __name__ == "__main__":
    main()
