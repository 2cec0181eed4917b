"""Structured outputs end to end: response_format through the router to a worker that decodes under
the schema's grammar, with the official openai SDK; every document must parse and validate
(jsonschema), sampled at temperature 1; what cannot be enforced is a 400 naming it.
"""
import json

import jsonschema
import openai
import pytest

from cluster import MODEL_ID, Router, Redis
from worker_client import Worker

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population": {"type": "integer"},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
    },
    "required": ["city", "country", "population", "landmarks"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def router():
    w = Worker("--max-running", "32")
    r = Router([w.endpoint])
    yield r
    r.stop()
    w.stop()


@pytest.fixture(scope="module")
def client(router):
    return openai.OpenAI(base_url=router.url + "/v1", api_key="anything", max_retries=0, timeout=120)


def schema_format(schema, name="city"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def ask(client, **kw):
    return client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Describe Paris as JSON."}], **kw)


def test_json_schema_documents_parse_and_validate(client):
    """40 samples at temperature 1 (100 of 100 is the same check, run longer)."""
    n_ok = 0
    for seed in range(40):
        r = ask(client, response_format=schema_format(CITY), temperature=1.0, seed=seed, max_tokens=200)
        c = r.choices[0]
        assert c.finish_reason == "stop", (c.finish_reason, c.message.content)
        jsonschema.validate(json.loads(c.message.content), CITY)
        n_ok += 1
    assert n_ok == 40


def test_json_object_and_n_choices(client):
    """Any object may be long (a free-form one at temperature 1 can outrun max_tokens: `length`);
    each choice that ends is an object."""
    r = ask(client, response_format={"type": "json_object"}, temperature=0.7, seed=3, n=3, max_tokens=300)
    assert len(r.choices) == 3
    done = [c for c in r.choices if c.finish_reason == "stop"]
    assert done and all(c.finish_reason in ("stop", "length") for c in r.choices)
    for c in done:
        assert isinstance(json.loads(c.message.content), dict)


def test_streaming_under_a_schema(client):
    stream = ask(client, response_format=schema_format(CITY), temperature=0.7, seed=11, max_tokens=200, stream=True)
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), CITY)


def test_completions_endpoint_too(client):
    r = client.completions.create(model=MODEL_ID, prompt="A JSON list of three colours:", max_tokens=80,
                                  temperature=1.0, seed=4, extra_body={"response_format": {"type": "json_schema",
                                  "json_schema": {"name": "c", "schema": {"type": "array", "items": {"type": "string",
                                  "maxLength": 20}, "minItems": 3, "maxItems": 3}}}})
    v = json.loads(r.choices[0].text)
    assert isinstance(v, list) and len(v) == 3


EVENT = {  # formats, a pattern and integer bounds (the walks of tests/integration/test_json_grammar.py check more)
    "type": "object",
    "properties": {
        "date": {"type": "string", "format": "date"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"},
        "seats": {"type": "integer", "minimum": 1, "maximum": 500},
        "host": {"type": "string", "format": "ipv4"},
    },
    "required": ["date", "code", "seats", "host"],
    "additionalProperties": False,
}


def test_formats_patterns_and_bounds_are_enforced(client):
    for seed in range(5):
        r = ask(client, response_format=schema_format(EVENT, "event"), temperature=1.0, seed=seed, max_tokens=120)
        c = r.choices[0]
        assert c.finish_reason == "stop", (c.finish_reason, c.message.content)
        jsonschema.validate(json.loads(c.message.content), EVENT,
                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def test_max_tokens_cuts_a_document_with_length(client):
    r = ask(client, response_format=schema_format(CITY), temperature=0, max_tokens=5)
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("fmt,param,word", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?=a)a"}}},
     "response_format.json_schema.schema", "(?"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
        "d": {"type": "string", "format": "uri"}}}}}, "response_format.json_schema.schema", "format"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema", "required"),
    ({"type": "xml"}, "response_format.type", "xml"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": ["a"]}}},
     "response_format.json_schema.schema", "`a`"),
])
def test_what_cannot_be_enforced_is_a_400(client, fmt, param, word):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, response_format=fmt, max_tokens=10)
    err = e.value.body
    assert err["param"] == param, err
    assert word in err["message"], err


def test_keywords_that_cannot_restrict_are_accepted(client):
    """`uniqueItems: false` and its kind allow every document: nothing to enforce, no 400; the same
    keywords with a value that restricts are still refused by name."""
    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3,
                 "uniqueItems": False, "additionalItems": True}},
        "required": ["tags"], "additionalProperties": False, "minProperties": 0}
    r = ask(client, response_format=schema_format(schema, "tags"), temperature=1.0, seed=1, max_tokens=100)
    c = r.choices[0]
    assert c.finish_reason == "stop", (c.finish_reason, c.message.content)
    jsonschema.validate(json.loads(c.message.content), schema)
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, response_format=schema_format(unique, "u"), max_tokens=10)
    assert "uniqueItems" in e.value.body["message"], e.value.body


def test_schema_property_order_is_the_output_order(client):
    """The router passes the schema on in document order (its JSON library sorts keys otherwise)."""
    schema = {"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}},
              "required": ["zeta", "alpha"], "additionalProperties": False}
    r = ask(client, response_format=schema_format(schema, "order"), temperature=0, max_tokens=60)
    assert list(json.loads(r.choices[0].message.content)) == ["zeta", "alpha"]


def test_the_response_cache_keys_on_the_schema():
    redis = Redis()
    w = Worker()
    r = Router([w.endpoint], "--redis", redis.url)
    try:
        c = openai.OpenAI(base_url=r.url + "/v1", api_key="x", max_retries=0, timeout=120)
        a = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
        b = {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"], "additionalProperties": False}
        first = ask(c, response_format=schema_format(a, "a"), temperature=0, max_tokens=30).choices[0].message.content
        again = c.chat.completions.with_raw_response.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Describe Paris as JSON."}],
            response_format=schema_format(a, "a"), temperature=0, max_tokens=30)
        assert again.headers.get("x-cache") == "hit" and again.parse().choices[0].message.content == first
        other = c.chat.completions.with_raw_response.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Describe Paris as JSON."}],
            response_format=schema_format(b, "b"), temperature=0, max_tokens=30)
        assert other.headers.get("x-cache") != "hit"
        assert list(json.loads(other.parse().choices[0].message.content)) == ["b"]
    finally:
        r.stop()
        w.stop()
        redis.stop()
