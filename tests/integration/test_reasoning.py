"""Reasoning output end to end: real router and worker processes, the official openai SDK reading
`reasoning_content` and `reasoning` from the raw response (model_extra). No reasoning model is
needed: the worker's test backend `--fault-inject sim:0:TEXT` answers every request with TEXT
through the real engine, detokenizer and link (worker/cli/fault_injection.hpp), so the router sees a
model's `<think>...</think>` text token by token, with the tags cut over several tokens.

Two small clusters:
  * a Qwen3-like model: a ChatML template that mentions <think> and `enable_thinking` (the router's
    default `--reasoning-parser auto` finds it), whose output opens thinking itself;
  * a DeepSeek-R1-like one: `--reasoning-parser deepseek_r1`, thinking open from the first byte,
    the output holds only `</think>`;
  * one serving the DeepSeek-R1 distills' own template (recognised as deepseek3) under the default
    `auto`: its generation prompt opens the thinking, so the same output splits the same way, and
    a past answer given back with its thinking is rendered without it;
  * one serving DeepSeek-V3.1's own template under `auto`: its `thinking` switch (either name in
    chat_template_kwargs) opens the thinking in the prompt, and the same output splits; off, its
    default, the prompt closes it and nothing splits.
Checked: the split whole and streamed (reasoning deltas before any content), usage's
reasoning_tokens (whole, in the last usage chunk and, with continuous_usage_stats, in every chunk),
a max_tokens cut while thinking, `enable_thinking: false`, a cache hit replayed
with the same split (whole and streamed), the Anthropic route's thinking block (and, with the
anthropic SDK, `thinking` enabled and disabled: the block whole and streamed with its
signature_delta, given back and dropped) and the Responses route's reasoning item; a thinking
budget (thinking_token_budget, Anthropic's budget_tokens, on a model whose thinking runs long)
closing the thinking.
"""
import json
import os
import tempfile
import time

import anthropic
import openai
import pytest

from cluster import MODEL_ID, Redis, Router
from worker_client import Worker

REASONING = "\nTwo and two make four.\n"
ANSWER = "The answer is 4."
QWEN3_OUTPUT = "<think>" + REASONING + "</think>\n\n" + ANSWER
LONG_REASONING = "\n" + " step" * 1500 + "\n"
LONG_OUTPUT = "<think>" + LONG_REASONING + "</think>\n\n" + ANSWER
R1_REASONING = "Adding two and two.\n"
R1_OUTPUT = R1_REASONING + "</think>\n\n" + ANSWER

# Qwen3's template, cut to what Switchyard's recognition reads: ChatML, with the thinking switch.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")
QUESTION = [{"role": "user", "content": "What is two and two?"}]
R1_TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "chat_templates",
                           "deepseek-r1-distill.jinja")
V31_TEMPLATE = os.path.join(os.path.dirname(R1_TEMPLATE), "deepseek-v3.1.jinja")


@pytest.fixture(scope="module")
def qwen3():
    redis = Redis()
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(QWEN3_TEMPLATE)
    w = Worker("--fault-inject", "sim:0:" + QWEN3_OUTPUT, "--chat-template", f.name)
    r = Router([w.endpoint], "--redis", redis.url)
    yield r
    r.stop()
    w.stop()
    redis.stop()
    os.unlink(f.name)


@pytest.fixture(scope="module")
def r1_template():
    w = Worker("--fault-inject", "sim:0:" + R1_OUTPUT, "--chat-template", R1_TEMPLATE)
    r = Router([w.endpoint])
    yield r
    r.stop()
    w.stop()


@pytest.fixture(scope="module")
def v31():
    w = Worker("--fault-inject", "sim:0:" + R1_OUTPUT, "--chat-template", V31_TEMPLATE)
    r = Router([w.endpoint])
    yield r
    r.stop()
    w.stop()


@pytest.fixture(scope="module")
def r1():
    w = Worker("--fault-inject", "sim:0:" + R1_OUTPUT)
    r = Router([w.endpoint], "--reasoning-parser", "deepseek_r1")
    yield r
    r.stop()
    w.stop()


def client_of(router):
    return openai.OpenAI(base_url=router.url + "/v1", api_key="anything", max_retries=0, timeout=120)


def ask(router, live=True, **kw):
    extra = kw.pop("extra_body", {})
    if live:
        extra["cache"] = False
    return client_of(router).chat.completions.create(model=MODEL_ID, messages=QUESTION, extra_body=extra, **kw)


def streamed(router, live=True, **kw):
    """(reasoning, content, finish_reason, usage, order) of a stream; order: "r" and "c" per delta."""
    extra = kw.pop("extra_body", {})
    if live:
        extra["cache"] = False
    chunks = client_of(router).chat.completions.create(
        model=MODEL_ID, messages=QUESTION, stream=True, stream_options={"include_usage": True}, extra_body=extra, **kw)
    reasoning = reasoning2 = content = ""
    finish, usage, order = None, None, ""
    for chunk in chunks:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            extra = c.delta.model_extra or {}
            if extra.get("reasoning_content"):
                reasoning += extra["reasoning_content"]
                reasoning2 += extra["reasoning"]
                order += "r"
            if c.delta.content:
                content += c.delta.content
                order += "c"
            finish = c.finish_reason or finish
    assert reasoning == reasoning2
    return reasoning, content, finish, usage, order


def reasoning_tokens(usage):
    details = usage.completion_tokens_details
    return details.reasoning_tokens if details else None


def test_a_model_that_opens_thinking_answers_apart_from_its_reasoning(qwen3):
    resp = ask(qwen3)
    msg = resp.choices[0].message
    assert msg.content == ANSWER
    assert msg.model_extra["reasoning_content"] == REASONING
    assert msg.model_extra["reasoning"] == REASONING
    assert resp.choices[0].finish_reason == "stop"
    n = reasoning_tokens(resp.usage)
    assert n is not None and 0 < n < resp.usage.completion_tokens, resp.usage


def test_a_stream_sends_reasoning_deltas_then_content(qwen3):
    whole = ask(qwen3)
    reasoning, content, finish, usage, order = streamed(qwen3)
    assert reasoning == REASONING
    assert content == ANSWER
    assert finish == "stop"
    assert "r" in order and "c" in order and "r" not in order[order.index("c"):], order
    assert "<think>" not in content and "</think>" not in reasoning + content
    assert reasoning_tokens(usage) == reasoning_tokens(whole.usage)


def test_continuous_usage_counts_the_reasoning_tokens_so_far(qwen3):
    """stream_options.continuous_usage_stats: every chunk's usage has reasoning_tokens, the count so
    far (never falling, never above completion_tokens), ending where the whole answer's does; the
    last usage chunk (include_usage) agrees."""
    whole = ask(qwen3)
    chunks = list(client_of(qwen3).chat.completions.create(
        model=MODEL_ID, messages=QUESTION, stream=True, extra_body={"cache": False},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = []
    for chunk in chunks:
        assert chunk.usage is not None, chunk
        n = reasoning_tokens(chunk.usage)
        assert n is not None and n <= chunk.usage.completion_tokens, chunk.usage
        counts.append(n)
    assert counts == sorted(counts) and 0 < counts[-1]
    assert counts[-1] == reasoning_tokens(whole.usage)
    assert not chunks[-1].choices  # the usage chunk
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_output_cut_while_thinking_is_all_reasoning(qwen3):
    resp = ask(qwen3, max_tokens=8)
    msg = resp.choices[0].message
    assert resp.choices[0].finish_reason == "length"
    assert msg.content is None
    assert REASONING.startswith(msg.model_extra["reasoning_content"]) and msg.model_extra["reasoning_content"]
    reasoning, content, finish, usage, _ = streamed(qwen3, max_tokens=8)
    assert (reasoning, content, finish) == (msg.model_extra["reasoning_content"], "", "length")
    # Every token but the ones spelling <think> is inside the thinking.
    assert 0 < reasoning_tokens(usage) < usage.completion_tokens


def test_enable_thinking_false_turns_the_split_off(qwen3):
    # The template writes an empty thinking block; this scripted worker still writes its text,
    # which then is content as it stands.
    for extra in ({"chat_template_kwargs": {"enable_thinking": False}}, {"enable_thinking": False}):
        resp = ask(qwen3, extra_body=dict(extra))
        msg = resp.choices[0].message
        assert msg.content == QWEN3_OUTPUT
        assert "reasoning_content" not in (msg.model_extra or {})
        assert resp.usage.completion_tokens_details is None


def test_a_cache_hit_replays_the_same_split(qwen3):
    first = ask(qwen3, live=False, temperature=0)
    client = client_of(qwen3)
    for _ in range(50):  # the store lands shortly after the answer
        raw = client.chat.completions.with_raw_response.create(model=MODEL_ID, messages=QUESTION, temperature=0)
        if raw.headers.get("x-cache") == "hit":
            break
        time.sleep(0.1)
    assert raw.headers.get("x-cache") == "hit"
    hit = raw.parse()
    assert hit.choices[0].message.content == ANSWER
    assert hit.choices[0].message.model_extra["reasoning_content"] == REASONING
    assert reasoning_tokens(hit.usage) == reasoning_tokens(first.usage)
    reasoning, content, finish, usage, order = streamed(qwen3, live=False, temperature=0)
    assert (reasoning, content, finish) == (REASONING, ANSWER, "stop")
    assert "r" not in order[order.index("c"):]
    assert reasoning_tokens(usage) == reasoning_tokens(first.usage)


def test_the_anthropic_route_answers_with_a_thinking_block(qwen3):
    status, _, raw = qwen3.post("/v1/messages", {"model": MODEL_ID, "max_tokens": 64, "messages": QUESTION,
                                                 "cache": False})
    assert status == 200, raw
    content = json.loads(raw)["content"]
    assert content == [{"type": "thinking", "thinking": REASONING, "signature": ""},
                       {"type": "text", "text": ANSWER}]


def test_anthropic_thinking_enabled_gives_a_thinking_block_whole_and_streamed(qwen3):
    c = anthropic.Anthropic(base_url=qwen3.url, api_key="anything", max_retries=0, timeout=120)
    kw = dict(model=MODEL_ID, max_tokens=1100, messages=QUESTION, thinking={"type": "enabled", "budget_tokens": 1024},
              extra_body={"cache": False})
    m = c.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert (m.content[0].thinking, m.content[0].signature) == (REASONING, "")
    assert m.content[1].text == ANSWER and m.stop_reason == "end_turn"
    # The raw events: the thinking block's deltas, its signature_delta, its end, then the text block.
    seq = []
    for e in c.messages.create(stream=True, **kw):
        if e.type == "content_block_start":
            seq.append("start " + e.content_block.type)
        elif e.type == "content_block_delta":
            if not seq or seq[-1] != e.delta.type:
                seq.append(e.delta.type)
        elif e.type == "content_block_stop":
            seq.append("stop")
    assert seq == ["start thinking", "thinking_delta", "signature_delta", "stop", "start text", "text_delta",
                   "stop"], seq
    # The SDK's stream helper adds the same message up, signature included.
    with c.messages.stream(**kw) as s:
        thinking = "".join(e.thinking for e in s if e.type == "thinking")
        final = s.get_final_message()
    assert thinking == REASONING
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content]
    # Given back on the next turn, the thinking block is dropped: the same prompt as without it.
    turn = [*QUESTION, {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": "And 3+3?"}]
    bare = [*QUESTION, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "And 3+3?"}]
    count = lambda msgs: c.messages.count_tokens(model=MODEL_ID, messages=msgs).input_tokens
    assert count(turn) == count(bare)


def test_anthropic_thinking_disabled_is_enable_thinking_false(qwen3):
    c = anthropic.Anthropic(base_url=qwen3.url, api_key="anything", max_retries=0, timeout=120)
    kw = dict(model=MODEL_ID, max_tokens=64, messages=QUESTION, extra_body={"cache": False})
    off = c.messages.create(thinking={"type": "disabled"}, **kw)
    # The template writes an empty thinking block; this scripted worker still writes its text,
    # which is then the answer as it stands (as with enable_thinking false on the OpenAI route).
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == QWEN3_OUTPUT
    on = c.messages.create(thinking={"type": "enabled", "budget_tokens": 2048}, **kw)
    prompt = lambda m: m.usage.input_tokens + m.usage.cache_read_input_tokens  # the prefix cache's share apart
    assert prompt(off) > prompt(on)  # the empty block is in the prompt
    default = c.messages.create(**kw)
    assert prompt(default) == prompt(on) and default.content == on.content


def test_thinking_token_budget_closes_the_thinking(qwen3):
    """vLLM's thinking_token_budget: the worker closes a thinking still open after that many tokens
    by writing the end of the thinking itself; the scripted worker then writes on from where its
    script is, so the answer is the script's rest. Under the budget, nothing changes."""
    cut = ask(qwen3, extra_body={"thinking_token_budget": 8})
    msg = cut.choices[0].message
    reasoning = msg.model_extra["reasoning_content"]
    # The thinking as far as the budget went, then the line break the end text starts with.
    assert reasoning.strip() and len(reasoning) < len(REASONING), reasoning
    assert reasoning.endswith("\n") and REASONING.startswith(reasoning[:-1]), reasoning
    assert 0 < reasoning_tokens(cut.usage) <= 8
    assert msg.content and cut.choices[0].finish_reason == "stop"
    roomy = ask(qwen3, extra_body={"thinking_token_budget": 1000})
    assert roomy.choices[0].message.content == ANSWER
    assert roomy.choices[0].message.model_extra["reasoning_content"] == REASONING


@pytest.fixture(scope="module")
def long_thinker():
    """A Qwen3-like model whose thinking runs to more tokens than Anthropic's least budget."""
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(QWEN3_TEMPLATE)
    w = Worker("--fault-inject", "sim:0:" + LONG_OUTPUT, "--chat-template", f.name)
    r = Router([w.endpoint])
    yield r
    r.stop()
    w.stop()
    os.unlink(f.name)


def test_anthropic_budget_tokens_is_enforced(long_thinker):
    """thinking.budget_tokens closes a thinking that reaches it: the thinking block holds at most
    that many tokens' text, and the text block follows (whole and streamed)."""
    c = anthropic.Anthropic(base_url=long_thinker.url, api_key="anything", max_retries=0, timeout=300)
    kw = dict(model=MODEL_ID, max_tokens=2000, messages=QUESTION, extra_body={"cache": False},
              thinking={"type": "enabled", "budget_tokens": 1024})
    m = c.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"], m.content
    thought = m.content[0].thinking
    assert thought.endswith("\n") and LONG_REASONING.startswith(thought[:-1])
    assert 300 < thought.count(" step") < 1024  # at most one word a token, and cut before the script's end
    assert m.content[1].text and m.stop_reason == "end_turn"
    assert m.usage.output_tokens > 1024
    with c.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content]
    # A budget the thinking fits in changes nothing.
    roomy = c.messages.create(**dict(kw, thinking={"type": "enabled", "budget_tokens": 2500}))
    assert roomy.content[0].thinking == LONG_REASONING and roomy.content[1].text == ANSWER


def test_the_responses_route_answers_with_a_reasoning_item(qwen3):
    c = client_of(qwen3)
    kw = dict(model=MODEL_ID, input=QUESTION[0]["content"], max_output_tokens=64, extra_body={"cache": False})
    r = c.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text == REASONING
    assert r.output_text == ANSWER and r.usage.output_tokens_details.reasoning_tokens > 0
    events = list(c.responses.create(stream=True, **kw))
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thinking, text) == (REASONING, ANSWER)
    assert events[-1].type == "response.completed"
    strip = lambda output: [o.model_dump(exclude={"id"}) for o in output]  # ids are per response
    assert strip(events[-1].response.output) == strip(r.output)


def test_thinking_opened_by_the_prompt_ends_at_its_close(r1):
    resp = ask(r1)
    msg = resp.choices[0].message
    assert msg.content == ANSWER
    assert msg.model_extra["reasoning_content"] == R1_REASONING
    n = reasoning_tokens(resp.usage)
    assert n is not None and 0 < n < resp.usage.completion_tokens
    reasoning, content, finish, usage, order = streamed(r1)
    assert (reasoning, content, finish) == (R1_REASONING, ANSWER, "stop")
    assert "r" not in order[order.index("c"):]
    assert reasoning_tokens(usage) == n
    cut = ask(r1, max_tokens=3)
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.content is None
    assert reasoning_tokens(cut.usage) == cut.usage.completion_tokens == 3


def test_the_r1_distill_template_opens_thinking_under_auto(r1_template):
    resp = ask(r1_template)
    msg = resp.choices[0].message
    assert msg.content == ANSWER
    assert msg.model_extra["reasoning_content"] == R1_REASONING
    assert 0 < reasoning_tokens(resp.usage) < resp.usage.completion_tokens
    reasoning, content, finish, _, order = streamed(r1_template)
    assert (reasoning, content, finish) == (R1_REASONING, ANSWER, "stop")
    assert "r" not in order[order.index("c"):]


def test_past_thinking_given_back_is_not_rendered(r1_template):
    def prompt_ids(answer, **fields):
        history = QUESTION + [dict(role="assistant", content=answer, **fields), {"role": "user", "content": "And 3+3?"}]
        status, _, body = r1_template.post("/tokenize", {"model": MODEL_ID, "messages": history})
        assert status == 200, body
        return json.loads(body)["tokens"]

    bare = prompt_ids("\n\n" + ANSWER)
    assert prompt_ids(R1_OUTPUT) == bare  # the thinking up to </think> is dropped
    assert prompt_ids("\n\n" + ANSWER, reasoning_content="Adding.") == bare  # the field is never rendered
    assert prompt_ids(ANSWER) != bare


def test_deepseek_v31_thinks_when_its_switch_is_on(v31):
    def prompt_ids(**kwargs):
        body = {"model": MODEL_ID, "messages": QUESTION}
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        status, _, raw = v31.post("/tokenize", body)
        assert status == 200, raw
        return json.loads(raw)["tokens"]

    # On (under either name): the prompt opens the thinking and the output splits at its </think>.
    for kwargs in ({"thinking": True}, {"enable_thinking": True}):
        msg = ask(v31, extra_body={"chat_template_kwargs": kwargs}).choices[0].message
        assert msg.content == ANSWER
        assert msg.model_extra["reasoning_content"] == R1_REASONING
    reasoning, content, finish, _, order = streamed(v31, extra_body={"chat_template_kwargs": {"thinking": True}})
    assert (reasoning, content, finish) == (R1_REASONING, ANSWER, "stop")
    assert "r" not in order[order.index("c"):]
    # Off, the template's default: the prompt closes the thinking, nothing splits.
    for extra in ({}, {"chat_template_kwargs": {"thinking": False}}):
        msg = ask(v31, extra_body=dict(extra)).choices[0].message
        assert msg.content == R1_OUTPUT
        assert "reasoning_content" not in (msg.model_extra or {})
    assert prompt_ids() == prompt_ids(thinking=False) != prompt_ids(thinking=True) == prompt_ids(enable_thinking=True)
    status, _, raw = v31.post("/v1/chat/completions", {"model": MODEL_ID, "messages": QUESTION,
                                                       "chat_template_kwargs": {"thinking": True,
                                                                                "enable_thinking": False}})
    assert status == 400 and json.loads(raw)["error"]["param"] == "chat_template_kwargs.thinking"
