"""The OpenAI Responses API end to end with the openai SDK's client.responses: POST /v1/responses
through the router to the real SmolLM2 worker (docs/router.md, "Responses API"). A text response
and its echoed parameters; instructions reaching the prompt; a stream whose events come in the
documented order, numbered, and add up to the same response at temperature 0 (live and replayed
from the response cache); max_output_tokens ending in status incomplete, whole and streamed; a
forced function call whose arguments validate, streamed or not; its function_call_output turn
taken back, in the input and through previous_response_id alike; text.format json_schema
answered with JSON that validates, and the SDK's responses.parse with a pydantic model; previous_response_id chaining through real Redis giving the
prompt the whole conversation gives, and its input items; GET and DELETE of stored responses, per
tenant; store:
false; output_text logprobs (include and top_logprobs), whole and streamed; the errors (400 naming the field, 404 for an unknown previous_response_id); and a router
without Redis, which answers but stores nothing.
"""
import json
import os
import subprocess

import jsonschema
import openai
import pytest

from cluster import MODEL_ID, Router, Redis
from worker_client import Worker
from tool_schemas import WEATHER

KEY, OTHER_KEY = "sk-responses-test", "sk-responses-other"
TOOLS = [{"type": "function", "name": "get_weather", "description": "The current weather in a city",
          "parameters": WEATHER, "strict": True}]
FORCED = {"type": "function", "name": "get_weather"}
QUESTION = "What is the weather like in Paris today?"
HELLO = "Write one sentence about the sea."
# "cache": False (Switchyard's) has a worker serve it, not the response cache.
LIVE = {"cache": False}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                         "country": {"type": "string", "maxLength": 30}},
        "required": ["city", "country"], "additionalProperties": False}


@pytest.fixture(scope="module")
def worker():
    w = Worker("--max-running", "8")
    yield w
    w.stop()


@pytest.fixture(scope="module")
def cluster(worker, tmp_path_factory):
    path = tmp_path_factory.mktemp("responses") / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"name": "agents", "keys": [KEY]},
                                            {"name": "others", "keys": [OTHER_KEY]}]}))
    redis = Redis()
    r = Router([worker.endpoint], "--tenants", str(path), "--redis", redis.url, "--responses-ttl-s", "600")
    r.redis = redis
    yield r
    r.stop()
    redis.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=cluster.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def other(cluster):
    return openai.OpenAI(base_url=cluster.url + "/v1", api_key=OTHER_KEY, max_retries=0, timeout=120)


def create(client, **kw):
    kw.setdefault("model", MODEL_ID)
    kw.setdefault("temperature", 0)
    extra = dict(LIVE)
    extra.update(kw.pop("extra_body", {}))
    return client.responses.create(extra_body=extra, **kw)


def calls_of(response):
    return [o for o in response.output if o.type == "function_call"]


def test_text_response_and_its_echo(client):
    r = create(client, input=HELLO, max_output_tokens=24, metadata={"run": "t1"}, top_p=0.9)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL_ID
    assert r.status in ("completed", "incomplete") and r.created_at > 0
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    [part] = msg.content
    assert part.type == "output_text" and part.annotations == [] and part.text == r.output_text != ""
    u = r.usage
    assert u.input_tokens > 0 and 0 < u.output_tokens <= 24 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0 and u.output_tokens_details.reasoning_tokens == 0
    # The request's parameters, echoed as the API does.
    assert (r.temperature, r.top_p, r.max_output_tokens) == (0, 0.9, 24)
    assert r.metadata == {"run": "t1"} and r.store is True and r.previous_response_id is None
    assert r.tools == [] and r.tool_choice == "auto" and r.text.format.type == "text" and r.instructions is None


def test_instructions_reach_the_prompt(client):
    a = create(client, input=HELLO, max_output_tokens=1)
    b = create(client, input=HELLO, max_output_tokens=1, instructions="Answer in French.")
    assert b.instructions == "Answer in French." and b.usage.input_tokens != a.usage.input_tokens
    # A developer message in the input is the same system prompt.
    c = create(client, input=[{"role": "developer", "content": "Answer in French."},
                              {"role": "user", "content": [{"type": "input_text", "text": HELLO}]}],
               max_output_tokens=1)
    assert c.usage.input_tokens == b.usage.input_tokens


EXPECTED_TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added"]
EXPECTED_TEXT_END = ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]


def check_numbered(events):
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_stream_events_add_up_to_the_response(client):
    kw = dict(input=HELLO, max_output_tokens=200)
    whole = create(client, **kw)
    events = list(create(client, stream=True, **kw))
    types = [e.type for e in events]
    check_numbered(events)
    n_deltas = types.count("response.output_text.delta")
    assert n_deltas >= 1
    assert types == EXPECTED_TEXT_EVENTS + ["response.output_text.delta"] * n_deltas + EXPECTED_TEXT_END, types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert whole.status == final.status == "completed"
    assert text == final.output_text == whole.output_text
    assert events[2].item.id == final.output[0].id and final.usage.output_tokens == whole.usage.output_tokens
    # The SDK's stream helper accumulates the same, from a cache replay this time.
    with client.responses.stream(model=MODEL_ID, temperature=0, **kw) as s:
        for _ in s:
            pass
        replayed = s.get_final_response()
    assert replayed.output_text == whole.output_text


def test_output_text_logprobs(client):
    """include message.output_text.logprobs and top_logprobs: every output token with its logprob
    and alternatives, the same as the chat route's for the same prompt at temperature 0; streamed,
    the deltas' logprobs add up to the whole's; without the include, none."""
    kw = dict(input=HELLO, max_output_tokens=24, top_logprobs=3, include=["message.output_text.logprobs"])
    whole = create(client, **kw)
    part = whole.output[0].content[0]
    assert whole.usage.output_tokens == len(part.logprobs) > 0
    assert "".join(lp.token for lp in part.logprobs) == part.text
    for lp in part.logprobs:
        assert lp.logprob <= 0 and bytes(lp.bytes).decode("utf-8", "replace") == lp.token
        assert len(lp.top_logprobs) == 3 and lp.top_logprobs[0].logprob >= lp.top_logprobs[-1].logprob
        assert lp.logprob <= lp.top_logprobs[0].logprob + 1e-4  # greedy: the top one was chosen
    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": HELLO}], max_tokens=24,
                                          temperature=0, logprobs=True, top_logprobs=3, extra_body=LIVE)
    assert [lp.token for lp in part.logprobs] == [lp.token for lp in chat.choices[0].logprobs.content]
    events = list(create(client, stream=True, **kw))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, lp.logprob) for lp in part.logprobs]
    assert events[-1].response.output[0].content[0].logprobs == part.logprobs
    plain = create(client, input=HELLO, max_output_tokens=4, top_logprobs=3)  # top_logprobs alone: none, as the API
    assert plain.output[0].content[0].logprobs == [] and plain.top_logprobs == 3


def test_max_output_tokens_is_incomplete(client):
    r = create(client, input=HELLO, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    events = list(create(client, input=HELLO, max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == r.output_text


def test_forced_function_call(client):
    kw = dict(input=QUESTION, tools=TOOLS, tool_choice=FORCED, max_output_tokens=256)
    r = create(client, **kw)
    [call] = calls_of(r)
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert r.tool_choice.type == "function" and r.tool_choice.name == "get_weather"
    assert r.tools[0].name == "get_weather" and r.tools[0].parameters == WEATHER
    events = list(create(client, stream=True, **kw))
    types = [e.type for e in events]
    check_numbered(events)
    assert "response.function_call_arguments.delta" in types
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments == call.arguments and done.name == "get_weather"
    [streamed] = calls_of(events[-1].response)
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)


def test_function_call_output_round_trip(client):
    first = create(client, input=QUESTION, tools=TOOLS, tool_choice=FORCED, max_output_tokens=256)
    [call] = calls_of(first)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 celsius, sunny"}
    # The whole conversation in the input ...
    explicit = create(client, tools=TOOLS, max_output_tokens=40,
                      input=[{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True), result])
    assert explicit.status in ("completed", "incomplete") and explicit.output
    assert explicit.usage.input_tokens > first.usage.input_tokens
    # ... or continued from the stored response: the same prompt.
    chained = create(client, tools=TOOLS, max_output_tokens=40, previous_response_id=first.id, input=[result])
    assert chained.previous_response_id == first.id
    assert chained.usage.input_tokens == explicit.usage.input_tokens
    assert chained.output_text == explicit.output_text


def test_json_schema_text_format(client):
    r = create(client, input="Name a city and its country as JSON.", max_output_tokens=128,
               text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), CITY)
    assert r.text.format.type == "json_schema" and r.text.format.name == "city"
    # json_object: decoded under the JSON grammar (SmolLM2 may write an object longer than the cap).
    o = create(client, input="Name a city as a JSON object.", max_output_tokens=64,
               text={"format": {"type": "json_object"}})
    assert o.text.format.type == "json_object" and o.output_text.lstrip().startswith("{")


def test_sdk_parse_with_a_pydantic_model(client):
    """client.responses.parse(text_format=Model): the SDK's strict json_schema, parsed back."""
    from pydantic import BaseModel, Field

    class City(BaseModel):
        city: str = Field(max_length=30)
        country: str = Field(max_length=30)

    r = client.responses.parse(model=MODEL_ID, input="Name a city and its country.", text_format=City,
                               temperature=0, max_output_tokens=128, extra_body=LIVE)
    assert r.status == "completed" and isinstance(r.output_parsed, City) and r.output_parsed.city


def test_previous_response_id_chains_the_conversation(client):
    first = create(client, input="My name is Ada.", max_output_tokens=16)
    second = create(client, input="What is my name?", max_output_tokens=16, previous_response_id=first.id)
    explicit = create(client, max_output_tokens=16, input=[
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert second.usage.input_tokens == explicit.usage.input_tokens > first.usage.input_tokens
    assert second.output_text == explicit.output_text
    # Its input items: the whole conversation, newest first by default, paged by the SDK.
    items = list(client.responses.input_items.list(second.id, order="asc"))
    assert [(i.type, i.role, i.content[0].text) for i in items] == [
        ("message", "user", "My name is Ada."), ("message", "assistant", first.output_text),
        ("message", "user", "What is my name?")]
    assert items[1].content[0].type == "output_text" and items[0].content[0].type == "input_text"
    paged = list(client.responses.input_items.list(second.id, limit=1))
    assert [i.id for i in paged] == [i.id for i in reversed(items)]
    # A third turn carries both before it; the instructions of earlier turns are not carried.
    third = create(client, input="Thanks.", max_output_tokens=4, previous_response_id=second.id)
    assert third.usage.input_tokens > second.usage.input_tokens
    # Streamed follow-ups are stored too (the record is written before the stream ends).
    streamed = list(create(client, input="And again?", max_output_tokens=4, previous_response_id=third.id,
                           stream=True))
    sid = streamed[-1].response.id
    assert client.responses.retrieve(sid).output_text == streamed[-1].response.output_text


def test_retrieve_and_delete(client, other):
    r = create(client, input=HELLO, max_output_tokens=8)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage.output_tokens == r.usage.output_tokens
    # Another tenant's key does not see it, nor continue from it.
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        create(other, input="Go on.", previous_response_id=r.id, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(r.id)
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        create(client, input="Go on.", previous_response_id=r.id, max_output_tokens=4)
    assert e.value.body["code"] == "previous_response_not_found" and e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)


def test_store_false_is_not_kept(client):
    r = create(client, input=HELLO, max_output_tokens=4, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


@pytest.mark.parametrize("body, param", [
    ({}, "input"),
    ({"input": 7}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": HELLO, "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": HELLO, "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ({"input": HELLO, "background": True}, "background"),
    ({"input": HELLO, "include": ["reasoning.encrypted_content"]}, "include[0]"),
    ({"input": HELLO, "include": ["message.output_text.logprobs"], "top_logprobs": 50}, "top_logprobs"),
    ({"input": HELLO, "conversation": "conv_1"}, "conversation"),
    ({"input": HELLO, "reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"input": HELLO, "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": HELLO, "temperature": 3}, "temperature"),
    ({"input": HELLO, "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
])
def test_bad_requests_name_the_field(cluster, body, param):
    status, _, raw = cluster.request("POST", "/v1/responses", {"model": MODEL_ID, **body},
                                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    err = json.loads(raw)["error"]
    assert status == 400 and err["param"] == param and err["type"] == "invalid_request_error", (status, err)


def test_unknown_previous_response_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        create(client, input="Hi", previous_response_id="resp_doesnotexist", max_output_tokens=4)
    assert e.value.body["code"] == "previous_response_not_found"


def test_raw_stream_lines(cluster):
    status, headers, raw = cluster.request(
        "POST", "/v1/responses",
        {"model": MODEL_ID, "input": HELLO, "max_output_tokens": 4, "stream": True, "temperature": 0, "cache": False},
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [e for e in raw.decode().split("\n\n") if e.strip()]
    for e in events:
        name, data = e.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[len("data: "):])["type"] == name[len("event: "):]
    assert "[DONE]" not in raw.decode()


def test_router_without_redis_stores_nothing(worker):
    r = Router([worker.endpoint])
    try:
        c = openai.OpenAI(base_url=r.url + "/v1", api_key="none", max_retries=0, timeout=120)
        first = create(c, input=HELLO, max_output_tokens=4)
        assert first.store is False and first.output_text
        with pytest.raises(openai.BadRequestError) as e:
            create(c, input="Go on.", previous_response_id=first.id, max_output_tokens=4)
        assert e.value.body["code"] == "responses_store_disabled"
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(first.id)
    finally:
        r.stop()


def test_redis_down(worker):
    """Redis gone: a previous_response_id is a 503 naming the store; a new response is still answered."""
    redis = Redis()
    r = Router([worker.endpoint], "--redis", redis.url)
    try:
        c = openai.OpenAI(base_url=r.url + "/v1", api_key="none", max_retries=0, timeout=120)
        first = create(c, input=HELLO, max_output_tokens=4)
        assert c.responses.retrieve(first.id).id == first.id
        redis.stop()
        with pytest.raises(openai.InternalServerError) as e:
            create(c, input="Go on.", previous_response_id=first.id, max_output_tokens=4)
        assert e.value.status_code == 503 and e.value.body["code"] == "responses_store_unavailable"
        second = create(c, input=HELLO, max_output_tokens=4)  # its write fails; the answer comes
        assert second.output_text
        assert r.metrics()["switchyard_router_responses_store_failures_total"] >= 1
    finally:
        r.stop()
        redis.stop()


def redis_cli(redis, *args):
    return subprocess.run(["redis-cli", "-p", str(redis.port), "--raw", *args], check=True,
                          capture_output=True).stdout


def test_sealed_records(worker, tmp_path):
    """With --cache-mac-key-file a record is sealed: one written without the key is not found."""
    key_file = tmp_path / "mac.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    redis = Redis()
    r = Router([worker.endpoint], "--redis", redis.url, "--cache-mac-key-file", str(key_file))
    try:
        c = openai.OpenAI(base_url=r.url + "/v1", api_key="none", max_retries=0, timeout=120)
        first = create(c, input="My name is Ada.", max_output_tokens=4)
        [key] = redis_cli(redis, "KEYS", "sy:v1:resp:*" + first.id).split()
        value = redis_cli(redis, "GET", key)[:-1]  # --raw ends the reply with a newline
        stored = json.loads(value[:-32])  # the record, then its 32-byte MAC
        assert stored["response"]["id"] == first.id
        assert create(c, input="And?", previous_response_id=first.id, max_output_tokens=4).status
        # A record written by someone without the key (here: moved under another id) is not found.
        forged = key.decode().replace(first.id, "resp_forged")
        redis_cli(redis, "SET", forged, value[:-32].decode())
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve("resp_forged")
    finally:
        r.stop()
        redis.stop()


def test_deadline_mid_stream_ends_failed(cluster):
    """A deadline (Switchyard's "timeout") passing while a stream runs: an `error` event, then
    response.failed; one not started yet gets the error as a response (504)."""
    body = {"model": MODEL_ID, "input": HELLO, "max_output_tokens": 1900, "stream": True, "timeout": 0.3,
            "cache": False, "temperature": 1.0, "top_k": 0, "ignore_eos": True}
    status, _, raw = cluster.request("POST", "/v1/responses", body,
                                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    if status != 200:
        assert status == 504 and json.loads(raw)["error"]["type"]
        return
    events = [e.split("\n") for e in raw.decode().split("\n\n") if e.strip()]
    names = [e[0][len("event: "):] for e in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-2:] == ["error", "response.failed"]
    failed = json.loads(events[-1][1][len("data: "):])["response"]
    assert failed["status"] == "failed" and failed["error"]["message"]
    seq = [json.loads(e[1][len("data: "):])["sequence_number"] for e in events]
    assert seq == list(range(len(seq)))
