"""The JSON Schema compiler of constrained decoding, checked by an outside validator (PyPI jsonschema).

For each schema: random walks of its grammar (`switchyard-worker json-grammar --sample`) are all
valid JSON that the schema accepts; valid documents (hand-written, and the walks re-serialised by
Python) are all accepted by the grammar; documents the schema refuses are refused by the grammar.
"""
import datetime
import json
import os
import re
import subprocess

import jsonschema
import pytest

from worker_client import WORKER

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 20},
            "age": {"type": "integer"},
            "email": {"type": ["string", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    # Extra members under any name but the listed ones (a listed one skipped cannot come back as an extra).
    "open-object": {"type": "object", "properties": {"id": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
                    "required": ["id"], "additionalProperties": True},
    # Properties listed, additionalProperties absent: only those are written (as llama.cpp's and xgrammar's).
    "listed": {"type": "object", "properties": {"id": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
               "required": ["id"]},
    "typed-extras": {"type": "object", "additionalProperties": {"type": "number"}},
    "enum-const": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "version": {"const": 2},
                       "mode": {"enum": [1, "auto", None, True]}},
        "required": ["color", "version", "mode"],
        "additionalProperties": False,
    },
    "arrays": {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
               "minItems": 2, "maxItems": 4},
    "any-of": {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": "number"}},
                                                 "required": ["x"], "additionalProperties": False}, {"type": "null"}]},
    "recursive": {
        "$defs": {"node": {"type": "object",
                           "properties": {"value": {"type": "integer"},
                                          "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                           "required": ["value", "children"], "additionalProperties": False}},
        "$ref": "#/$defs/node",
    },
    "tool-args": {  # the shape of an OpenAI function's parameters
        "type": "object",
        "properties": {"location": {"type": "string", "description": "City and country"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                       "days": {"type": "integer"}},
        "required": ["location", "unit", "days"],
        "additionalProperties": False,
    },
    "anything": {},
    "formats": {
        "type": "object",
        "properties": {f: {"type": "string", "format": f}
                       for f in ["date", "time", "date-time", "uuid", "email", "hostname", "ipv4", "ipv6"]},
        "required": ["date", "time", "date-time", "uuid", "email", "hostname", "ipv4", "ipv6"],
        "additionalProperties": False,
    },
    "patterns": {
        "type": "object",
        "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{2,3}-\\d{4}$"},
                       "slug": {"type": "string", "pattern": "^[a-z0-9]+(?:-[a-z0-9]+){0,3}$", "maxLength": 200},
                       "word": {"type": "string", "pattern": "(cat|dog)s?"},
                       "quoted": {"type": "string", "pattern": "^\"[^\"\\\\]{0,5}\"\\s?\\\\?$"}},
        "required": ["sku", "slug", "word", "quoted"],
        "additionalProperties": False,
    },
    "regex-subset": {  # each construct of the subset, checked by Python's re through jsonschema
        "type": "array",
        "items": {"anyOf": [{"type": "string", "pattern": p} for p in [
            r"^\s\S\d\D\w\W$", r"^[^a-z\d]{1,3}\.$", r"^(a|b(c|)|(?:de)+?)$", "^caf\u00e9{1,2}$",
            r"^[\t\]\-]x{0}y{2,}?$", r"^\{\}\(\)\[\]\|\*\+\?\^\$\\$", r'^.{2}["]?$', r"(?:ab){2,3}c?$"]]},
        "maxItems": 6,
    },
    "bounds": {
        "type": "object",
        "properties": {"byte": {"type": "integer", "minimum": 0, "maximum": 255},
                       "temp": {"type": "integer", "minimum": -40, "maximum": 100},
                       "big": {"type": "integer", "exclusiveMinimum": 1000},
                       "low": {"type": "integer", "exclusiveMaximum": -7},
                       "share": {"type": "number", "minimum": 0},
                       "gain": {"type": "number", "exclusiveMinimum": 0},
                       "loss": {"type": "number", "maximum": 0}},
        "required": ["byte", "temp", "big", "low", "share", "gain", "loss"],
        "additionalProperties": False,
    },
}

VALID = {
    # A pattern's strings are written as whole matches: "zzabab" is valid for "(?:ab){2,3}c?$" but not written.
    "regex-subset": ['[]', '["a", "bc", "b", "dede"]', '[" x1-a!", "caf\u00e9\u00e9", "-yy", "]yyy", "ababc"]'],
    "person": ['{"name":"Ada","age":36}', '{"name": "A", "age": -1, "email": null, "tags": []}',
               '{\n  "name": "Bo",\n  "age": 0,\n  "tags": ["x", "y", "z"]\n}'],
    "open-object": ['{"id":1}', '{"id": 1, "other": {"deep": [1, "two", null]}}',
                    '{"id": 1, "unit": "c", "units": 2}'],
    "listed": ['{"id":1}', '{"id": 1, "unit": "f"}'],
    "typed-extras": ['{}', '{"a": 1.5, "b": -2e10}'],
    "enum-const": ['{"color":"red","version":2,"mode":null}', '{"color": "blue", "version": 2, "mode": true}'],
    "arrays": ['[[true],[false,true]]', '[[true], [true], [false], [false, false]]'],
    "any-of": ['3', '{"x": 0.5}', 'null'],
    "recursive": ['{"value":1,"children":[{"value":2,"children":[]}]}'],
    "tool-args": ['{"location": "Paris, France", "unit": "celsius", "days": 3}'],
    "anything": ['"s"', '[1, {"a": null}]', '{"k": "v"}', '-0.25'],
    "formats": ['{"date": "2024-12-31", "time": "23:59:59.5+01:00", "date-time": "1999-01-01T00:00:00Z", '
                '"uuid": "123e4567-e89b-12d3-a456-426614174000", "email": "ada.l+x@mail.example.org", '
                '"hostname": "a-1.example.com", "ipv4": "255.0.10.1", "ipv6": "2001:db8:0:0:0:ff00:42:8329"}'],
    "patterns": ['{"sku": "AB-1234", "slug": "a-b-c", "word": "cats", "quoted": "\\"x\\" \\\\"}'],
    "bounds": ['{"byte": 255, "temp": -40, "big": 1001, "low": -8, "share": 0, "gain": 0.5, "loss": -1e3}'],
}

# A valid `formats` document with one field replaced.
FORMATS_OK = json.loads(VALID["formats"][0])

INVALID = {
    "regex-subset": ['["abc"]', '["cafe"]', '["y"]', '[1]', '["a", "a", "a", "a", "a", "a", "a"]'],
    "person": ['{"name":"","age":1}', '{"name":"x"}', '{"name":"x","age":1.5}', '{"name":"x","age":1,"zzz":1}',
               '{"name":"x","age":1,"tags":["a","b","c","d"]}', '{"name":"x","age":"1"}'],
    "open-object": ['{}', '{"id": "1"}', '[]', '{"id": 1, "unit": "k"}'],
    "listed": ['{}', '{"id": 1, "unit": "k"}', '{"id": 1.5}'],
    "typed-extras": ['{"a": "1"}', '{"a": null}'],
    "enum-const": ['{"color":"pink","version":2,"mode":null}', '{"color":"red","version":3,"mode":null}',
                   '{"color":"red","version":2,"mode":false}'],
    "arrays": ['[[true]]', '[[], [true]]', '[[true], [true, true, true]]', '[[1], [true]]'],
    "any-of": ['"3"', '{"x": "a"}', '{"x": 1, "y": 2}', '1.5'],
    "recursive": ['{"value":1}', '{"value":1,"children":[{"value":"2","children":[]}]}'],
    "tool-args": ['{"location": "Paris", "unit": "kelvin", "days": 3}', '{"location": "Paris", "days": 3}'],
    "anything": [],
    "formats": [json.dumps({**FORMATS_OK, k: v}) for k, v in
                [("date", "2023-02-30"), ("date", "2024-1-01"), ("ipv4", "256.1.1.1"), ("ipv4", "01.2.3.4"),
                 ("uuid", "123e4567e89b12d3a456426614174000"), ("ipv6", "1:2:3:4:5:6:7:8:9"), ("email", "no-at")]],
    "patterns": ['{"sku": "A-1234", "slug": "a", "word": "cat", "quoted": "\\"\\""}',
                 '{"sku": "AB-1234", "slug": "a--b", "word": "cat", "quoted": "\\"\\""}',
                 '{"sku": "AB-1234", "slug": "a", "word": "cow", "quoted": "\\"\\""}'],
    "bounds": ['{"byte": 256, "temp": 0, "big": 1001, "low": -8, "share": 0, "gain": 1, "loss": 0}',
               '{"byte": 0, "temp": -41, "big": 1001, "low": -8, "share": 0, "gain": 1, "loss": 0}',
               '{"byte": 0, "temp": 0, "big": 1000, "low": -8, "share": 0, "gain": 1, "loss": 0}',
               '{"byte": 0, "temp": 0, "big": 1001, "low": -7, "share": 0, "gain": 1, "loss": 0}',
               '{"byte": 0, "temp": 0, "big": 1001, "low": -8, "share": -0.5, "gain": 1, "loss": 0}',
               '{"byte": 0, "temp": 0, "big": 1001, "low": -8, "share": 0, "gain": 0.0, "loss": 0}',
               '{"byte": 0, "temp": 0, "big": 1001, "low": -8, "share": 0, "gain": 1, "loss": 0.1}'],
}

# jsonschema checks date, email, ipv4, ipv6 and uuid; time, date-time and hostname need packages it
# lacks here (rfc3339-validator, fqdn), so those three are checked below with the standard library.
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
HOSTNAME_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def check_formats(value, schema):
    if schema is not SCHEMAS["formats"]:
        return
    for key, fmt in [("time", "time"), ("date-time", "date-time"), ("hostname", "hostname")]:
        v = value[key]
        if fmt == "hostname":
            assert len(v) <= 253 and all(HOSTNAME_LABEL.fullmatch(p) for p in v.split(".")), v
        elif fmt == "time":
            datetime.time.fromisoformat(v)
            assert v[-1] == "Z" or v[-6] in "+-", v  # RFC 3339: the offset is required
        else:
            assert "T" in v and (v[-1] == "Z" or v[-6] in "+-"), v
            datetime.datetime.fromisoformat(v)


def validate(value, schema):
    jsonschema.validate(value, schema, format_checker=FORMAT_CHECKER)
    check_formats(value, schema)


def run(schema, *args, stdin=None):
    return subprocess.run([WORKER, "json-grammar", "--schema", json.dumps(schema), *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def accepted(schema, docs):
    p = run(schema, "--check", stdin="".join(json.dumps(d) + "\n" for d in docs))
    assert p.returncode == 0, p.stderr
    return [line == "1" for line in p.stdout.split("\n")[:-1]]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_random_walks_are_valid(name):
    schema = SCHEMAS[name]
    p = run(schema, "--sample", "60", "--seed", "11")
    assert p.returncode == 0, p.stderr
    docs = [json.loads(line) for line in p.stdout.split("\n")[:-1]]
    assert len(docs) >= 50, f"only {len(docs)} walks ended"
    for doc in docs:
        value = json.loads(doc)  # valid JSON
        validate(value, schema)  # and valid for the schema


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_valid_documents_are_accepted(name):
    schema = SCHEMAS[name]
    p = run(schema, "--sample", "30", "--seed", "5")
    walks = [json.loads(line) for line in p.stdout.split("\n")[:-1]]
    # The walks again, as Python writes them: compact, spaced, indented, ASCII-escaped or not.
    # (Not: numbers Python reads as infinity; indentation deeper than the grammar's 20 spaces.)
    rewritten = []
    for doc in walks:
        v = json.loads(doc)
        forms = [json.dumps(v, separators=(",", ":")), json.dumps(v, ensure_ascii=False), json.dumps(v, indent=2)]
        rewritten += [f for f in forms if "Infinity" not in f and "\n" + " " * 21 not in f]
    docs = VALID[name] + rewritten
    for d in VALID[name]:
        validate(json.loads(d), schema)  # the fixtures themselves are right
    bad = [d for d, ok in zip(docs, accepted(schema, docs)) if not ok]
    assert not bad, f"valid documents refused: {bad[:3]}"


@pytest.fixture(scope="module")
def few_walks():
    """15 walks of each schema's grammar."""
    out = {}
    for name, schema in SCHEMAS.items():
        p = run(schema, "--sample", "15", "--seed", "3")
        out[name] = [json.loads(line) for line in p.stdout.split("\n")[:-1]]
    return out


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_invalid_documents_are_refused(name, few_walks):
    schema = SCHEMAS[name]
    docs = INVALID[name] + ["", "{", "nul", '{"a":1,}']
    for d in docs:
        try:
            validate(json.loads(d), schema)
            pytest.fail(f"fixture {d!r} is valid")
        except (ValueError, jsonschema.ValidationError):
            pass
    # Walks of the other schemas: whatever this grammar accepts, the schema must accept too.
    others = [doc for other, docs in few_walks.items() if other != name for doc in docs]
    results = accepted(schema, docs + others)
    assert not any(results[:len(docs)]), [d for d, ok in zip(docs, results) if ok]
    for doc, ok in zip(others, results[len(docs):]):
        if ok:
            validate(json.loads(doc), schema)


def test_unsupported_keywords_are_named():
    for schema, word in [({"type": "string", "pattern": "(?<=a)b"}, "(?"), ({"type": "string", "pattern": "\\bx"}, "\\b"),
                         ({"type": "number", "minimum": 1}, "minimum"),
                         ({"type": "object", "properties": {"d": {"type": "string", "format": "uri"}}}, "format"),
                         ({"type": "array", "uniqueItems": True}, "uniqueItems")]:
        p = run(schema, "--sample", "1")
        assert p.returncode == 2 and word in p.stderr, (schema, p.stderr)
