"""Tool calling end to end with the official openai SDK: tools through the router to the real
SmolLM2 worker. `required` and a named tool_choice decode under the call schema's grammar, so at
temperature 1 every call (each one of a parallel list) names a declared function with arguments
valid for its schema (jsonschema); a stream reassembles to the same call; a list cut by max_tokens
keeps its complete calls; role "tool" results are taken back; `auto` answers with content or
calls; bad tool fields are 400s naming the field; the response cache keys on the tools.
"""
import json

import jsonschema
import openai
import pytest

from cluster import MODEL_ID, Router, Redis
from worker_client import Worker
from tool_schemas import WEATHER

TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 40}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]

# Parameters as clients write them: optional properties, no additionalProperties.
FLIGHT = {
    "type": "object",
    "properties": {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                   "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                   "seats": {"type": "integer"}},
    "required": ["origin", "destination", "seats"],
}
FORECAST = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}
TRIP_TOOLS = [
    {"type": "function", "function": {"name": "book_flight", "description": "Book seats on a flight",
                                      "parameters": FLIGHT}},
    {"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                      "parameters": FORECAST}},
]
TRIP_SCHEMAS = {"book_flight": FLIGHT, "weather": FORECAST}
TRIP = [{"role": "user", "content": "Book 2 seats from Paris to Rome and tell me the weather in Rome."}]


@pytest.fixture(scope="module")
def cluster():
    redis = Redis()
    w = Worker("--max-running", "16")
    r = Router([w.endpoint], "--redis", redis.url)
    yield r
    r.stop()
    w.stop()
    redis.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=cluster.url + "/v1", api_key="anything", max_retries=0, timeout=120)


def ask(client, messages=QUESTION, live=True, **kw):
    extra = {"cache": False} if live else {}
    return client.chat.completions.create(model=MODEL_ID, messages=messages, tools=TOOLS, extra_body=extra, **kw)


def stream_calls(chunks):
    """The calls a stream's delta.tool_calls add up to (in index order), its finish_reason, its number of chunks
    and the content it sent."""
    calls, finish, n_chunks, content = {}, None, 0, ""
    for chunk in chunks:
        if not chunk.choices:
            continue
        n_chunks += 1
        d = chunk.choices[0]
        finish = d.finish_reason or finish
        content += d.delta.content or ""
        for tc in d.delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                entry["id"] = tc.id
            if tc.function and tc.function.name:
                entry["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                entry["arguments"] += tc.function.arguments
    return [calls[i] for i in sorted(calls)], finish, n_chunks, content


def check_args(name, arguments, schemas):
    """Valid for the tool's parameters (formats checked too), and only the properties they list: an object
    that lists its properties is closed unless additionalProperties opens it (docs/structured-outputs.md)."""
    schema = schemas[name]
    args = json.loads(arguments)
    jsonschema.validate(args, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    assert set(args) <= set(schema["properties"]), (name, arguments)


def check_calls(message, names=SCHEMAS):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names, call
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_gives_valid_calls_at_temperature_1(client, parallel):
    for seed in range(4):
        # At temperature 1 a small model may call a tool several times over: room for that.
        r = ask(client, tool_choice="required", parallel_tool_calls=parallel, temperature=1.0, seed=seed,
                max_tokens=512)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (seed, c)
        assert c.message.content is None
        check_calls(c.message)
        if not parallel:
            assert len(c.message.tool_calls) == 1


def test_named_function_is_the_one_called(client):
    for seed in range(4):
        r = ask(client, tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=1.0,
                seed=seed, max_tokens=200)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (seed, c)
        assert [t.function.name for t in c.message.tool_calls] == ["get_time"]
        check_calls(c.message, names={"get_time"})


def test_a_stream_reassembles_to_the_same_call(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = ask(client, tool_choice=choice, temperature=0, max_tokens=200).choices[0].message.tool_calls
    calls, finish, n_chunks, _ = stream_calls(ask(client, tool_choice=choice, temperature=0, max_tokens=200,
                                                  stream=True))
    assert finish == "tool_calls"
    assert n_chunks > 2  # the arguments come in pieces, as they are generated
    assert [(c["name"], c["arguments"]) for c in calls] == [(t.function.name, t.function.arguments) for t in whole]
    assert all(c["id"].startswith("call_") for c in calls)


@pytest.mark.parametrize("stream", [False, True])
def test_every_parallel_call_of_required_validates(client, stream):
    """Two tools whose parameters leave properties optional and say nothing of additionalProperties, parallel
    calls, temperature 1: every call of the list, not only the first, names a tool and validates against its
    parameters, with none of the properties they do not list."""
    for seed in range(1, 7):
        kw = dict(model=MODEL_ID, messages=TRIP, tools=TRIP_TOOLS, tool_choice="required", temperature=1.0,
                  seed=seed, max_tokens=512, extra_body={"cache": False})
        if stream:
            calls, finish, _, content = stream_calls(client.chat.completions.create(stream=True, **kw))
            assert content == ""
            calls = [(c["name"], c["arguments"]) for c in calls]
        else:
            c = client.chat.completions.create(**kw).choices[0]
            finish = c.finish_reason
            assert c.message.content is None
            calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
        assert finish == "tool_calls", (seed, finish, calls)
        assert calls, seed
        for name, arguments in calls:
            assert name in TRIP_SCHEMAS, (seed, name)
            check_args(name, arguments, TRIP_SCHEMAS)


def test_required_cut_by_max_tokens_keeps_the_complete_calls(client):
    """A list of calls cut by max_tokens: finish_reason "length", the calls complete before the cut in tool_calls
    (the one cut short is dropped), no raw JSON in content; the stream sends the same complete calls, and at
    most the beginning of the cut one after them."""
    kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": "What is the weather in Paris, Rome, Oslo, "
                                                                    "Berlin, Madrid and Lisbon?"}],
              tools=[TRIP_TOOLS[1]], tool_choice="required", temperature=0, max_tokens=60,
              extra_body={"cache": False})
    c = client.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "length"
    assert c.message.content is None
    assert c.message.tool_calls, c.message
    whole = [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
    for name, arguments in whole:
        check_args(name, arguments, TRIP_SCHEMAS)
    assert len({t.id for t in c.message.tool_calls}) == len(whole)

    calls, finish, _, content = stream_calls(client.chat.completions.create(stream=True, **kw))
    assert finish == "length" and content == ""
    assert [(s["name"], s["arguments"]) for s in calls[:len(whole)]] == whole
    assert len(calls) <= len(whole) + 1
    for cut in calls[len(whole):]:  # begun, never finished: its arguments are not a whole object
        with pytest.raises(ValueError):
            json.loads(cut["arguments"])


def test_tool_results_are_taken_back(client):
    history = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    r = ask(client, messages=history, tool_choice="none", temperature=0, max_tokens=40)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length")
    assert c.message.tool_calls is None and c.message.content


def test_auto_answers_with_content_or_valid_calls(client):
    seen = set()
    for seed in range(3):
        c = ask(client, tool_choice="auto", temperature=0.7, seed=seed, max_tokens=64).choices[0]
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls"
            for call in c.message.tool_calls:
                assert call.function.name in SCHEMAS
                assert isinstance(json.loads(call.function.arguments), dict)
            seen.add("calls")
        else:
            assert c.finish_reason in ("stop", "length") and c.message.content is not None
            seen.add("content")
    assert seen


@pytest.mark.parametrize("kw,param,word", [
    ({"tool_choice": "always"}, "tool_choice", "always"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name", "nope"),
    ({"tools": {"type": "function"}}, "tools", "array"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "d": {"type": "string", "format": "uri"}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters", "format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "not a schema"}}]},
     "tools[0].function.parameters", "object"),
])
def test_bad_tool_fields_are_a_400(client, kw, param, word):
    body = {"tools": TOOLS, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=10,
                                       **{k: v for k, v in body.items() if k != "tools"},
                                       extra_body={"tools": body["tools"]})
    err = e.value.body
    assert err["param"] == param, err
    assert word in err["message"], err


def test_the_response_cache_keys_on_the_tools(client):
    choice = {"type": "function", "function": {"name": "get_time"}}

    def raw(tool_choice):
        return client.chat.completions.with_raw_response.create(
            model=MODEL_ID, messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, temperature=0, max_tokens=200)

    first = raw(choice).parse().choices[0].message.tool_calls
    again = raw(choice)
    assert again.headers.get("x-cache") == "hit"
    hit = again.parse().choices[0]
    assert hit.finish_reason == "tool_calls"
    assert [(t.function.name, t.function.arguments) for t in hit.message.tool_calls] == [
        (t.function.name, t.function.arguments) for t in first]
    other = raw({"type": "function", "function": {"name": "get_weather"}})
    assert other.headers.get("x-cache") != "hit"
    assert other.parse().choices[0].message.tool_calls[0].function.name == "get_weather"
