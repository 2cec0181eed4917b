"""The Anthropic Messages API end to end with the official anthropic SDK: /v1/messages through the
router to the real SmolLM2 worker (docs/router.md, "Anthropic Messages API"). A message with a
system prompt; a stream that adds up to the same text at temperature 0 (live, and replayed from
the response cache); stop reasons max_tokens and stop_sequence, the sequence that matched named
exactly among several (whole, streamed, replayed from the cache); usage's cache_read_input_tokens
for a repeated prompt (whole and streamed); a tool forced by tool_choice
{"type": "tool"} whose input validates against its input_schema, streamed or not; a tool_result
turn taken back; output_config.format decoded under its JSON Schema; the raw stream's event
lines, and a deadline mid-stream ending in an `error` event; count_tokens equal to the message's
usage.input_tokens + cache_read_input_tokens; thinking enabled or disabled on a model that does
not think (no thinking block, the same answer), a budget under 1024 refused; the key by x-api-key
or Authorization: Bearer; errors in Anthropic's shape (missing max_tokens, unsupported blocks,
a bad key).
"""
import json

import anthropic
import jsonschema
import pytest

from cluster import MODEL_ID, Router, Redis
from worker_client import Worker
from tool_schemas import WEATHER

KEY = "sk-anthropic-test"
TOOLS = [{"name": "get_weather", "description": "The current weather in a city", "input_schema": WEATHER}]
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]
SYSTEM = "You are a helpful assistant who answers briefly."
# The SDK's signatures no longer carry temperature, top_p and top_k: they travel in extra_body, as
# the router reads them. "cache": False (Switchyard's) has a worker serve it, not the response cache.
GREEDY = {"temperature": 0}
LIVE = {"cache": False, "temperature": 0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = tmp_path_factory.mktemp("anthropic") / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"name": "claude", "keys": [KEY]}]}))
    redis = Redis()
    w = Worker("--max-running", "8")
    r = Router([w.endpoint], "--tenants", str(path), "--redis", redis.url)
    yield r
    r.stop()
    w.stop()
    redis.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return anthropic.Anthropic(base_url=cluster.url, api_key=KEY, max_retries=0, timeout=120)


def prompt_of(usage):
    """The whole prompt: Anthropic's input_tokens leave out what the prefix cache served."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def test_message_with_a_system_prompt(client):
    m = client.messages.create(model=MODEL_ID, max_tokens=24, system=SYSTEM, messages=HELLO, extra_body=LIVE)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == MODEL_ID
    assert [b.type for b in m.content] == ["text"] and text_of(m)
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 24
    # The system prompt reaches the template (in place of the default one SmolLM2's template adds).
    bare = client.messages.create(model=MODEL_ID, max_tokens=1, messages=HELLO, extra_body=LIVE)
    assert prompt_of(bare.usage) != prompt_of(m.usage)


def test_system_as_text_blocks_is_the_same_prompt(client):
    kw = dict(model=MODEL_ID, max_tokens=8, messages=HELLO, extra_body=LIVE)
    a = client.messages.create(system=SYSTEM, **kw)
    b = client.messages.create(system=[{"type": "text", "text": SYSTEM}], **kw)
    assert prompt_of(a.usage) == prompt_of(b.usage) and text_of(a) == text_of(b)


def stream_message(client, **kw):
    """The text a stream's deltas add up to, the final message and the event types in order."""
    types = []
    with client.messages.stream(**kw) as s:
        for event in s:
            types.append(event.type)
        final = s.get_final_message()
    return final, types


def check_sequence(types):
    raw = [t for t in types if t in ("message_start", "content_block_start", "content_block_stop",
                                     "message_delta", "message_stop")]
    assert raw[0] == "message_start" and raw[-2:] == ["message_delta", "message_stop"], types
    assert raw.count("content_block_start") == raw.count("content_block_stop"), types


def test_stream_adds_up_to_the_message(client):
    kw = dict(model=MODEL_ID, max_tokens=32, system=SYSTEM, messages=HELLO)
    whole = client.messages.create(**kw, extra_body=LIVE)
    live, types = stream_message(client, **kw, extra_body=LIVE)
    check_sequence(types)
    assert "text" in types  # the SDK's event for each text_delta
    assert text_of(live) == text_of(whole)
    assert live.stop_reason == whole.stop_reason and live.usage.output_tokens == whole.usage.output_tokens
    assert prompt_of(live.usage) == prompt_of(whole.usage)
    # Twice more through the cache (stored by the first, replayed as a stream): the same text.
    client.messages.create(**kw, extra_body=GREEDY)
    cached, types = stream_message(client, **kw, extra_body=GREEDY)
    check_sequence(types)
    assert text_of(cached) == text_of(whole) and cached.stop_reason == whole.stop_reason


def test_max_tokens_stop_reason(client):
    m = client.messages.create(model=MODEL_ID, max_tokens=3, messages=HELLO, extra_body=LIVE)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    s, _ = stream_message(client, model=MODEL_ID, max_tokens=3, messages=HELLO, extra_body=LIVE)
    assert s.stop_reason == "max_tokens" and text_of(s) == text_of(m)


def test_stop_sequence_stop_reason(client):
    full = text_of(client.messages.create(model=MODEL_ID, max_tokens=40, messages=HELLO, extra_body=LIVE))
    words = full.split()
    assert len(words) >= 4, full
    seq = words[2]
    m = client.messages.create(model=MODEL_ID, max_tokens=40, messages=HELLO, stop_sequences=[seq], extra_body=LIVE)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == seq
    assert text_of(m) == full[:full.index(seq)]
    s, _ = stream_message(client, model=MODEL_ID, max_tokens=40, messages=HELLO, stop_sequences=[seq],
                          extra_body=LIVE)
    assert s.stop_reason == "stop_sequence" and s.stop_sequence == seq and text_of(s) == text_of(m)


def test_the_stop_sequence_that_matched_is_named_exactly(client):
    """Several sequences, the first never matching: the answer names the one complete first in the
    text, the text stops before it; streamed, and replayed from the response cache, alike."""
    full = text_of(client.messages.create(model=MODEL_ID, max_tokens=40, messages=HELLO, extra_body=LIVE))
    words = full.split()
    assert len(words) >= 6, full
    stops = ["zzqqxx", words[5], words[2]]
    found = {s: full.index(s) for s in stops if s in full}
    want = min(found, key=lambda s: (found[s] + len(s), found[s], stops.index(s)))
    first = found[want]
    assert want != stops[0]
    m = client.messages.create(model=MODEL_ID, max_tokens=40, messages=HELLO, stop_sequences=stops, extra_body=LIVE)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == want, (full, stops)
    assert text_of(m) == full[:first] and want not in text_of(m)
    s, _ = stream_message(client, model=MODEL_ID, max_tokens=40, messages=HELLO, stop_sequences=stops,
                          extra_body=LIVE)
    assert s.stop_reason == "stop_sequence" and s.stop_sequence == want and text_of(s) == text_of(m)
    # Stored by the first, replayed by the second (whole, then streamed): the same sequence.
    client.messages.create(model=MODEL_ID, max_tokens=40, messages=HELLO, stop_sequences=stops, extra_body=GREEDY)
    c = client.messages.create(model=MODEL_ID, max_tokens=40, messages=HELLO, stop_sequences=stops,
                               extra_body=GREEDY)
    assert c.stop_reason == "stop_sequence" and c.stop_sequence == want and text_of(c) == text_of(m)
    cs, _ = stream_message(client, model=MODEL_ID, max_tokens=40, messages=HELLO, stop_sequences=stops,
                           extra_body=GREEDY)
    assert cs.stop_sequence == want and text_of(cs) == text_of(m)


def test_a_repeated_prompt_reads_from_the_prefix_cache(client):
    """The second time a long prompt is sent, the worker's prefix cache serves most of it:
    cache_read_input_tokens, as the OpenAI routes' cached_tokens; streamed the same."""
    system = SYSTEM + " " + " ".join(f"Rule {i}: answer in plain words, never in lists." for i in range(12))
    kw = dict(model=MODEL_ID, max_tokens=4, system=system, messages=HELLO, extra_body=LIVE)
    counted = client.messages.count_tokens(model=MODEL_ID, system=system, messages=HELLO).input_tokens
    client.messages.create(**kw)
    again = client.messages.create(**kw)
    u = again.usage
    assert u.cache_read_input_tokens >= counted // 2, u
    assert u.input_tokens + u.cache_read_input_tokens == counted and u.cache_creation_input_tokens == 0
    streamed, _ = stream_message(client, **kw)
    su = streamed.usage
    assert su.cache_read_input_tokens >= counted // 2, su
    assert su.input_tokens + su.cache_read_input_tokens == counted and su.cache_creation_input_tokens == 0


def test_end_of_turn_with_stop_sequences_is_end_turn(client):
    # The worker ends a turn and a stop string alike ("stop"); the turn's end-of-generation token
    # tells them apart.
    kw = dict(model=MODEL_ID, max_tokens=400, messages=[{"role": "user", "content": "Say hello."}], extra_body=LIVE)
    plain = client.messages.create(**kw)
    if plain.stop_reason != "end_turn":
        pytest.skip("the model did not end its turn within max_tokens")
    for stream in (False, True):
        m = (stream_message(client, stop_sequences=["zzqqxx"], **kw)[0] if stream
             else client.messages.create(stop_sequences=["zzqqxx"], **kw))
        assert m.stop_reason == "end_turn" and m.stop_sequence is None and text_of(m) == text_of(plain)


def tool_uses(message):
    return [b for b in message.content if b.type == "tool_use"]


def test_forced_tool_gives_valid_input(client):
    for seed in range(3):
        m = client.messages.create(model=MODEL_ID, max_tokens=256, messages=QUESTION, tools=TOOLS,
                                   tool_choice={"type": "tool", "name": "get_weather"},
                                   extra_body={"temperature": 1.0, "seed": seed, "cache": False})
        assert m.stop_reason == "tool_use", m
        calls = tool_uses(m)
        assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
        jsonschema.validate(calls[0].input, WEATHER)


def test_forced_tool_streams_the_same_call(client):
    kw = dict(model=MODEL_ID, max_tokens=256, messages=QUESTION, tools=TOOLS, tool_choice={"type": "any"},
              extra_body=LIVE)
    whole = client.messages.create(**kw)
    s, types = stream_message(client, **kw)
    check_sequence(types)
    assert "input_json" in types  # the SDK's event for each input_json_delta
    assert s.stop_reason == "tool_use" == whole.stop_reason
    [a], [b] = tool_uses(s), tool_uses(whole)
    assert (a.name, a.input) == (b.name, b.input) and a.id.startswith("toolu_")  # ids: per response
    jsonschema.validate(a.input, WEATHER)


def test_tool_result_turn_is_taken(client):
    m = client.messages.create(model=MODEL_ID, max_tokens=256, messages=QUESTION, tools=TOOLS,
                               tool_choice={"type": "tool", "name": "get_weather"}, extra_body=LIVE)
    [call] = tool_uses(m)
    turns = QUESTION + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "21 celsius"}]},
            {"type": "text", "text": "Thanks. Summarise it."}]},
    ]
    r = client.messages.create(model=MODEL_ID, max_tokens=24, messages=turns, tools=TOOLS, extra_body=LIVE)
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert prompt_of(r.usage) > prompt_of(m.usage)
    # An error result is taken too.
    turns[-1]["content"][0]["is_error"] = True
    r = client.messages.create(model=MODEL_ID, max_tokens=4, messages=turns, tools=TOOLS, extra_body=LIVE)
    assert r.type == "message"


def test_output_config_format_gives_json_of_the_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    for seed in range(2):
        m = client.messages.create(model=MODEL_ID, max_tokens=128, messages=[{"role": "user", "content": "Paris?"}],
                                   output_config={"format": {"type": "json_schema", "schema": schema}},
                                   extra_body={"temperature": 1.0, "seed": seed, "cache": False})
        assert m.stop_reason == "end_turn", m
        jsonschema.validate(json.loads(text_of(m)), schema)


def test_count_tokens_equals_usage(client):
    for kw in (dict(system=SYSTEM, messages=HELLO), dict(messages=QUESTION, tools=TOOLS)):
        counted = client.messages.count_tokens(model=MODEL_ID, **kw)
        m = client.messages.create(model=MODEL_ID, max_tokens=2, extra_body=LIVE, **kw)
        assert counted.input_tokens == prompt_of(m.usage) > 0
        assert m.usage.cache_creation_input_tokens == 0


def check_error(status, raw, want_status, want_type, mentions):
    assert status == want_status, raw
    body = json.loads(raw)
    assert body["type"] == "error" and body["error"]["type"] == want_type, body
    assert mentions in body["error"]["message"], body


def post(cluster, body, path="/v1/messages", key=KEY, bearer=False):
    headers = {"Authorization": "Bearer " + key} if bearer else {"x-api-key": key}
    return cluster.post(path, body, headers=headers)


def sse_events(raw):
    """(event, data) of each SSE event of a raw body; every event has its event line and JSON data."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, data = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert data["type"] == name, block
        out.append((name, data))
    return out


def test_raw_stream_has_event_lines(cluster):
    status, headers, raw = post(cluster, {"model": MODEL_ID, "max_tokens": 8, "messages": HELLO, "stream": True,
                                          **LIVE})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(raw)
    names = [n for n, _ in events if n != "ping"]
    assert names[0] == "message_start" and names[1] == "content_block_start", names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert events[0][1]["message"]["usage"]["input_tokens"] > 0
    start, end = events[0][1]["message"]["usage"], events[-2][1]["usage"]
    assert set(start) == set(end) == {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                                      "output_tokens"}
    assert end["input_tokens"] + end["cache_read_input_tokens"] == start["input_tokens"]
    assert events[-2][1]["usage"]["output_tokens"] == 8 and events[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_deadline_mid_stream_ends_in_an_error_event(cluster):
    # A deadline (Switchyard's "timeout") that passes while generating: a stream already started
    # ends with Anthropic's error event, one not yet started gets the error as a response.
    # ignore_eos: the answer cannot end on its own before the deadline.
    status, _, raw = post(cluster, {"model": MODEL_ID, "max_tokens": 1900, "messages": HELLO, "stream": True,
                                    "timeout": 0.3, "cache": False, "temperature": 1.0, "top_k": 0,
                                    "ignore_eos": True})
    if status != 200:
        check_error(status, raw, 504, json.loads(raw)["error"]["type"], "")
        return
    events = sse_events(raw)
    assert events[-1][0] == "error", [n for n, _ in events][-3:]
    assert events[-1][1]["error"]["message"]


def test_bearer_key_works_as_well(cluster):
    status, _, raw = post(cluster, {"model": MODEL_ID, "max_tokens": 2, "messages": HELLO}, bearer=True)
    assert status == 200 and json.loads(raw)["type"] == "message"


def test_missing_max_tokens_is_a_400(cluster, client):
    status, _, raw = post(cluster, {"model": MODEL_ID, "messages": HELLO})
    check_error(status, raw, 400, "invalid_request_error", "max_tokens")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL_ID, messages=HELLO, max_tokens=0)


@pytest.mark.parametrize("body, mentions", [
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}, "image"),
    ({"messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 1000}}, "thinking.budget_tokens"),
    ({"messages": HELLO, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"messages": HELLO, "thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "t", "signature": ""}]}]},
     "thinking"),
    ({"messages": [{"role": "system", "content": "x"}]}, "system"),
    ({"messages": HELLO, "tool_choice": {"type": "tool", "name": "nope"}, "tools": TOOLS}, "nope"),
    ({"messages": HELLO, "stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"messages": HELLO, "tools": [{"name": "f"}]}, "input_schema"),
])
def test_unsupported_or_bad_fields_are_named(cluster, body, mentions):
    status, _, raw = post(cluster, {"model": MODEL_ID, "max_tokens": 4, **body})
    check_error(status, raw, 400, "invalid_request_error", mentions)


def test_thinking_on_a_model_that_does_not_think_answers_as_usual(client):
    # SmolLM2's template has no thinking switch and its answers are not split: enabled or
    # disabled, the answer is the same text block, with no thinking block, as vLLM answers.
    kw = dict(model=MODEL_ID, max_tokens=1100, messages=HELLO, extra_body=LIVE)
    plain = client.messages.create(**kw)
    for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        m = client.messages.create(thinking=thinking, **kw)
        assert [b.type for b in m.content] == ["text"] and text_of(m) == text_of(plain)
        assert prompt_of(m.usage) == prompt_of(plain.usage)
        with client.messages.stream(thinking=thinking, **kw) as s:
            streamed = s.get_final_message()
        assert [b.type for b in streamed.content] == ["text"] and text_of(streamed) == text_of(plain)
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        client.messages.create(thinking={"type": "enabled", "budget_tokens": 512}, **kw)


def test_bad_key_is_a_401(cluster):
    bad = anthropic.Anthropic(base_url=cluster.url, api_key="sk-wrong", max_retries=0, timeout=30)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model=MODEL_ID, max_tokens=2, messages=HELLO)
    status, _, raw = post(cluster, {"model": MODEL_ID, "max_tokens": 2, "messages": HELLO}, key="sk-wrong")
    check_error(status, raw, 401, "authentication_error", "not valid")
    status, _, raw = post(cluster, {"model": MODEL_ID, "messages": HELLO}, path="/v1/messages/count_tokens",
                          key="sk-wrong")
    check_error(status, raw, 401, "authentication_error", "not valid")


def test_unknown_model_is_a_404(client):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=2, messages=HELLO)
