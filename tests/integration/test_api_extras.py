"""What clients and benchmark tools ask of the router besides generating (docs/benchmarking.md):
served model names (the worker's --served-model-name, sent in its welcome, and the router's
NAME=MODEL map) through the official openai SDK; the Hugging Face tokenizer files served by the
router, loaded by transformers and tokenizing as the worker does; /tokenize and /detokenize in
vLLM's (and llama-server's) shapes; stream_options.continuous_usage_stats; /version."""
import json
import os
import subprocess
import tempfile
import urllib.parse

import openai
import pytest

from cluster import MODEL_ID, Router
from support import needs_model, skip_test
from worker_client import MODEL, WORKER, Worker, tokenize

pytestmark = needs_model

HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the worker's --served-model-name (a '/' inside)
SHORT = "smollm2"                               # a second one on the worker
ROUTER_ALIAS = "tiny"                           # the router's --served-model-name tiny=MODEL_ID
NAMES = sorted([MODEL_ID, HF_ID, SHORT, ROUTER_ALIAS])
TEXTS = ["Hello world", "  leading spaces and\ttabs\n", "Café, naïve — 日本語 🎉", "x = f(3) + 42 // comment",
         "<|im_start|>user\nhi<|im_end|>"]
SYSTEM, USER = "You are a helpful assistant.", "What is the capital of France?"


@pytest.fixture(scope="module")
def cluster():
    worker = Worker("--kv-blocks", "128", "--max-running", "4", "--max-context", "1024", "--served-model-name", HF_ID,
                    "--served-model-name", SHORT)
    router = Router([worker.endpoint], "--served-model-name", f"{ROUTER_ALIAS}={MODEL_ID}",
                    "--served-model-name", "ghost=NoSuchModel")
    yield router
    assert router.stop() == 0
    worker.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=cluster.url + "/v1", api_key="anything", max_retries=0, timeout=60)


def test_models_list_every_served_name_with_the_file_as_root(client):
    cards = client.models.list().data
    assert sorted(c.id for c in cards) == NAMES  # "ghost" names a model nobody serves: not listed
    for c in cards:
        d = c.to_dict()
        assert d["root"] == MODEL_ID and d["object"] == "model" and d["max_model_len"] == 1024


def test_models_retrieve_by_any_name_and_404_for_unknown(client, cluster):
    for name in NAMES:
        m = client.models.retrieve(name)  # the SDK sends HF_ID's '/' as %2F
        assert m.id == name and m.to_dict()["root"] == MODEL_ID
    status, _, body = cluster.get("/v1/models/" + HF_ID)  # an unencoded '/' works too
    assert status == 200 and json.loads(body)["id"] == HF_ID
    for unknown in ("nope", "ghost", HF_ID + "x"):
        with pytest.raises(openai.NotFoundError) as e:
            client.models.retrieve(unknown)
        err = e.value.response.json()["error"]
        assert err["code"] == "model_not_found" and err["type"] == "not_found_error" and unknown in err["message"]


def test_a_chat_by_alias_runs_on_the_model_and_answers_as_the_alias(client):
    kw = dict(messages=[{"role": "user", "content": "Name three colours."}], max_tokens=16, temperature=0, seed=1,
              extra_body={"cache": False})
    by_file = client.chat.completions.create(model=MODEL_ID, **kw)
    for name in (HF_ID, ROUTER_ALIAS):
        r = client.chat.completions.create(model=name, **kw)
        assert r.model == name
        assert r.choices[0].message.content == by_file.choices[0].message.content  # greedy: the same model
        assert r.usage.prompt_tokens == by_file.usage.prompt_tokens
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="ghost", **kw)


def fetch_tokenizer(cluster, name, into):
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        status, headers, body = cluster.get(f"/v1/models/{urllib.parse.quote(name, safe='')}/tokenizer/{f}")
        assert status == 200, body
        assert headers["Content-Type"] == "application/json"
        with open(os.path.join(into, f), "wb") as out:
            out.write(body)


def test_tokenizer_files_from_the_router_load_in_transformers_and_give_the_workers_ids(cluster):
    try:
        import transformers
    except ImportError:
        skip_test("transformers is not installed (deploy/setup.sh)")
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as exported:
        fetch_tokenizer(cluster, HF_ID, d)
        tok = transformers.AutoTokenizer.from_pretrained(d)
        for text in TEXTS:
            served = json.loads(cluster.post("/tokenize", {"prompt": text})[2])["tokens"]
            assert tok.encode(text) == served, text
            if "<|" not in text:  # the worker's CLI reads special tokens as plain text
                assert served == tokenize(text, chat=False), text
        theirs = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
                                         tokenize=True, add_generation_prompt=True)
        if not isinstance(theirs, list):  # transformers 5 returns a BatchEncoding
            theirs = theirs["input_ids"]
        ours = json.loads(subprocess.run([WORKER, "tokenize", "--model", MODEL, "--chat", "--system", SYSTEM,
                                          "--prompt", USER], check=True, capture_output=True, text=True).stdout)
        assert theirs == ours
        # One definition: the worker's export-tokenizer writes the same tokenizer (the config's
        # model_max_length is the served context here, the file's there).
        subprocess.run([WORKER, "export-tokenizer", "--model", MODEL, "--out", exported], check=True,
                       capture_output=True)
        for f in ("tokenizer.json", "generation_config.json"):
            assert open(os.path.join(d, f), "rb").read() == open(os.path.join(exported, f), "rb").read(), f
        served = json.load(open(os.path.join(d, "tokenizer_config.json")))
        written = json.load(open(os.path.join(exported, "tokenizer_config.json")))
        assert served["model_max_length"] == 1024
        assert {k: v for k, v in served.items() if k != "model_max_length"} == \
            {k: v for k, v in written.items() if k != "model_max_length"}


def test_tokenizer_file_errors(cluster):
    status, _, body = cluster.get(f"/v1/models/{MODEL_ID}/tokenizer/vocab.txt")
    assert status == 404 and json.loads(body)["error"]["code"] == "unknown_file"
    status, _, body = cluster.get("/v1/models/nope/tokenizer/tokenizer.json")
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"


def test_tokenize_and_detokenize_in_vllm_and_llama_server_shapes(cluster):
    for text in TEXTS[:-1]:
        status, _, body = cluster.post("/tokenize", {"model": HF_ID, "prompt": text})
        assert status == 200, body
        r = json.loads(body)
        assert r["tokens"] == tokenize(text, chat=False) and r["count"] == len(r["tokens"])
        assert r["max_model_len"] == 1024 and "token_strs" not in r
        status, _, body = cluster.post("/detokenize", {"model": HF_ID, "tokens": r["tokens"]})
        assert status == 200 and json.loads(body)["prompt"] == text
    # llama-server's field names; "model" may be left out while one model is served.
    status, _, body = cluster.post("/tokenize", {"content": "Hello world", "add_special": True})
    assert status == 200 and json.loads(body)["tokens"] == tokenize("Hello world", chat=False)
    status, _, body = cluster.post("/detokenize", {"tokens": json.loads(body)["tokens"]})
    assert status == 200 and json.loads(body)["content"] == "Hello world"
    # token_strs as Hugging Face names the tokens (byte-level BPE: a space is 'Ġ').
    r = json.loads(cluster.post("/tokenize", {"prompt": "Hello world", "return_token_strs": True})[2])
    assert "".join(r["token_strs"]).replace("\u0120", " ") == "Hello world"
    # A chat: exactly the ids /v1/chat/completions sends.
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    status, _, body = cluster.post("/tokenize", {"model": SHORT, "messages": msgs})
    assert status == 200
    ids = json.loads(body)["tokens"]
    ours = json.loads(subprocess.run([WORKER, "tokenize", "--model", MODEL, "--chat", "--system", SYSTEM, "--prompt",
                                      USER], check=True, capture_output=True, text=True).stdout)
    assert ids == ours
    chat = cluster.post("/v1/chat/completions", {"model": SHORT, "messages": msgs, "max_tokens": 1})
    assert json.loads(chat[2])["usage"]["prompt_tokens"] == len(ids)
    without = json.loads(cluster.post("/tokenize", {"messages": msgs, "add_generation_prompt": False})[2])["tokens"]
    assert ids[:len(without)] == without and len(without) < len(ids)


@pytest.mark.parametrize("path,body,status,code,param", [
    ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model_not_found", "model"),
    ("/tokenize", {"model": MODEL_ID}, 400, "missing_required_parameter", "prompt"),
    ("/tokenize", {"prompt": 5}, 400, "invalid_type", "prompt"),
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_value", "messages"),
    ("/tokenize", {"messages": []}, 400, "invalid_value", "messages"),
    ("/tokenize", {"prompt": "x", "return_token_strs": "yes"}, 400, "invalid_type", "return_token_strs"),
    ("/detokenize", {"tokens": [1, 10 ** 6]}, 400, "invalid_value", "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "invalid_value", "tokens"),
    ("/detokenize", {"tokens": "1 2"}, 400, "invalid_type", "tokens"),
    ("/detokenize", {}, 400, "missing_required_parameter", "tokens"),
    ("/detokenize", b"{not json", 400, "invalid_json", None),
])
def test_tokenizer_endpoints_refuse_bad_input_specifically(cluster, path, body, status, code, param):
    got, _, raw = cluster.post(path, body)
    err = json.loads(raw)["error"]
    assert (got, err["code"], err["param"]) == (status, code, param), raw
    assert cluster.get("/tokenize")[0] == 405


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(client):
    kw = dict(model=HF_ID, messages=[{"role": "user", "content": "Count from one to twenty."}], max_tokens=24,
              temperature=0, stream=True, extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(
        stream_options={"include_usage": True, "continuous_usage_stats": True}, **kw))
    content = [c for c in chunks if c.choices]
    final = chunks[-1]
    assert not final.choices and final.usage.completion_tokens == 24  # the include_usage chunk
    assert all(c.usage is not None for c in content)
    counts = [c.usage.completion_tokens for c in content]
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 24
    assert {c.usage.prompt_tokens for c in content} == {final.usage.prompt_tokens}
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in content)
    # Without it (the default) chunks carry no usage; continuous alone gives no final usage chunk.
    plain = list(client.chat.completions.create(stream_options={"include_usage": True}, **kw))
    assert all(c.usage is None for c in plain if c.choices)
    alone = list(client.chat.completions.create(stream_options={"continuous_usage_stats": True}, **kw))
    assert all(c.choices for c in alone) and alone[-1].usage.completion_tokens == 24


def test_version_says_the_projects_version(cluster):
    status, _, body = cluster.get("/version")
    assert status == 200
    version = json.loads(body)["version"]
    cmake = open(os.path.join(os.path.dirname(__file__), "..", "..", "CMakeLists.txt")).read()
    assert f"VERSION {version})" in cmake
