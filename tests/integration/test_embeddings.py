"""POST /v1/embeddings end to end with the openai SDK (client.embeddings.create): a router in front
of the real SmolLM2 worker started with --embeddings (docs/router.md, "Embeddings API"). Shapes and
usage; unit length; float and base64 answers agree (and the SDK's own base64 decoding); a batch
equals its inputs one by one; token-id input equals its text; paraphrases closer (cosine) than
unrelated texts; last-token pooling differs from mean; `dimensions`; the worker's KV cache left as
it was (no block held, none published to the prefix cache); bad inputs answered 400 in OpenAI's
error shape; a worker started without --embeddings answered 501 embeddings_not_supported.
"""
import base64
import json
import struct

import openai
import pytest

from cluster import MODEL_ID, Router
from support import needs_model
from worker_client import Worker

pytestmark = needs_model

KEY = "sk-embeddings-test"
HIDDEN = 576  # SmolLM2-135M's hidden size
CONTEXT = 256  # the workers' --max-context


def tenants(tmp_path_factory):
    path = tmp_path_factory.mktemp("embeddings") / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"name": "embedder", "keys": [KEY]}]}))
    return str(path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    w = Worker("--embeddings", "--max-context", str(CONTEXT))
    r = Router([w.endpoint], "--tenants", tenants(tmp_path_factory))
    yield r, w
    r.stop()
    w.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=cluster[0].url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def vec(client, text, **kw):
    return client.embeddings.create(model=MODEL_ID, input=text, encoding_format="float", **kw).data[0].embedding


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def test_shape_usage_and_unit_length(client):
    r = client.embeddings.create(model=MODEL_ID, input="The quick brown fox.", encoding_format="float")
    assert r.object == "list" and r.model == MODEL_ID
    assert len(r.data) == 1 and r.data[0].object == "embedding" and r.data[0].index == 0
    e = r.data[0].embedding
    assert len(e) == HIDDEN
    assert abs(dot(e, e) - 1.0) < 1e-4
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens


def test_float_and_base64_agree(client, cluster):
    text = "Embeddings in two encodings."
    floats = vec(client, text)
    # The raw base64 answer: little-endian float32 bytes.
    status, _, body = cluster[0].post("/v1/embeddings", {"model": MODEL_ID, "input": text, "encoding_format": "base64"},
                                      headers={"Authorization": "Bearer " + KEY})
    assert status == 200, body
    raw = base64.b64decode(json.loads(body)["data"][0]["embedding"])
    decoded = struct.unpack("<%df" % HIDDEN, raw)
    # The same float32 values: the float text is the shortest that reads back as the same float.
    assert decoded == struct.unpack("<%df" % HIDDEN, struct.pack("<%df" % HIDDEN, *floats))
    # The SDK asks for base64 when no encoding_format is given and decodes it itself.
    sdk = client.embeddings.create(model=MODEL_ID, input=text).data[0].embedding
    assert max(abs(a - b) for a, b in zip(sdk, floats)) < 1e-7


def test_batch_equals_single_inputs(client):
    texts = ["First sentence here.", "A second, somewhat longer sentence about the weather in spring.", "Third!"]
    batch = client.embeddings.create(model=MODEL_ID, input=texts, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2]
    singles = [vec(client, t) for t in texts]
    for d, s in zip(batch.data, singles):
        assert max(abs(a - b) for a, b in zip(d.embedding, s)) < 1e-6
    assert batch.usage.prompt_tokens == sum(
        client.embeddings.create(model=MODEL_ID, input=t).usage.prompt_tokens for t in texts)


def test_token_ids_equal_the_text(client, cluster):
    text = "Token ids or text, the same prompt."
    status, _, body = cluster[0].post("/tokenize", {"model": MODEL_ID, "prompt": text},
                                      headers={"Authorization": "Bearer " + KEY})
    assert status == 200, body
    ids = json.loads(body)["tokens"]
    by_text = vec(client, text)
    assert vec(client, ids) == by_text
    both = client.embeddings.create(model=MODEL_ID, input=[ids, ids[:3]], encoding_format="float")
    assert both.data[0].embedding == by_text and both.usage.prompt_tokens == len(ids) + 3


def test_paraphrases_are_closer_than_unrelated_texts(client):
    pairs = [
        ("The cat sat on the mat.", "A cat was sitting on the mat.", "Quarterly revenue rose by eight percent."),
        ("How do I bake bread at home?", "What is a simple recipe for homemade bread?",
         "The train to Berlin leaves at noon."),
        ("The weather is cold and rainy today.", "Today it is raining and chilly.",
         "Python lists can be sorted in place."),
    ]
    for a, para, other in pairs:
        ea, ep, eo = vec(client, a), vec(client, para), vec(client, other)
        assert dot(ea, ep) > dot(ea, eo), (a, dot(ea, ep), dot(ea, eo))


def test_dimensions(client):
    assert len(vec(client, "sized", dimensions=HIDDEN)) == HIDDEN
    with pytest.raises(openai.BadRequestError) as e:
        vec(client, "sized", dimensions=64)
    assert str(HIDDEN) in e.value.message and "dimensions" in e.value.message


def test_the_kv_cache_is_left_as_it_was(client, cluster):
    w = cluster[1]
    before = w.metrics()
    client.embeddings.create(model=MODEL_ID, input=["a prompt long enough to fill a few KV blocks " * 6] * 4)
    after = w.metrics()
    assert after["switchyard_worker_kv_blocks_free"] == after["switchyard_worker_kv_blocks_total"]
    stored = 'switchyard_worker_kv_events_total{kind="stored"}'
    assert after.get(stored, 0) == before.get(stored, 0)
    answered = "switchyard_worker_embed_requests_answered_total"
    assert after[answered] == before[answered] + 1


def post(cluster, body, key=KEY):
    status, _, text = cluster[0].post("/v1/embeddings", body, headers={"Authorization": "Bearer " + key})
    return status, json.loads(text)


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL_ID, "input": ""}, "input"),
    ({"model": MODEL_ID, "input": []}, "input"),
    ({"model": MODEL_ID, "input": ["fine", ""]}, "input[1]"),
    ({"model": MODEL_ID, "input": [[]]}, "input[0]"),
    ({"model": MODEL_ID, "input": ["text", 5]}, "input[1]"),
    ({"model": MODEL_ID, "input": [1, "a"]}, "input"),
    ({"model": MODEL_ID, "input": 42}, "input"),
    ({"model": MODEL_ID, "input": {"text": "x"}}, "input"),
    ({"model": MODEL_ID, "input": [-1]}, "input"),
    ({"model": MODEL_ID, "input": [10**9]}, "input"),
    ({"model": MODEL_ID}, "input"),
    ({"input": "no model"}, "model"),
    ({"model": MODEL_ID, "input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"model": MODEL_ID, "input": "x", "dimensions": 0}, "dimensions"),
    ({"model": MODEL_ID, "input": "x", "dimensions": "576"}, "dimensions"),
    ({"model": MODEL_ID, "input": "word " * (2 * CONTEXT)}, "input"),
    ({"model": MODEL_ID, "input": ["short", "word " * (2 * CONTEXT)]}, "input[1]"),
])
def test_bad_input_is_a_400_in_openai_shape(cluster, body, param):
    status, doc = post(cluster, body)
    assert status == 400, doc
    err = doc["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["code"]
    assert err["param"] == param, err


def test_bad_inputs_through_the_sdk(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL_ID, input="word " * (2 * CONTEXT))
    assert "context length" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="x")


def test_needs_a_key(cluster):
    status, doc = post(cluster, {"model": MODEL_ID, "input": "x"}, key="wrong")
    assert status == 401 and doc["error"]["code"] == "invalid_api_key"


def test_last_token_pooling_and_a_worker_without_embeddings(tmp_path_factory, client):
    last = Worker("--embeddings", "--pooling", "last", "--max-context", str(CONTEXT))
    plain = Worker("--max-context", str(CONTEXT))
    try:
        r_last = Router([last.endpoint])
        r_plain = Router([plain.endpoint])
        c_last = openai.OpenAI(base_url=r_last.url + "/v1", api_key="none", max_retries=0, timeout=120)
        text = "Pooled by its last token."
        e_last = vec(c_last, text)
        assert len(e_last) == HIDDEN and abs(dot(e_last, e_last) - 1) < 1e-4
        assert e_last != vec(client, text)  # mean pooling (the main cluster) is another vector
        status, _, body = r_plain.post("/v1/embeddings", {"model": MODEL_ID, "input": "x"})
        err = json.loads(body)["error"]
        assert status == 501 and err["code"] == "embeddings_not_supported" and "--embeddings" in err["message"]
        # Generations on that worker are not affected.
        status, _, body = r_plain.post("/v1/completions", {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2})
        assert status == 200, body
        r_last.stop()
        r_plain.stop()
    finally:
        last.stop()
        plain.stop()
