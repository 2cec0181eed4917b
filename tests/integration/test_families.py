"""Several models behind one router, one worker each: SmolLM2 and the generated Llama 3, Qwen2,
Mistral, Qwen3 and Gemma 3 files (tests/tools/make_test_models.py). The router learns each model's tokenizer, chat
template and context length from its worker, routes every request by its `model` field, and
counts prompt tokens exactly as llama.cpp tokenizes the same chat (tests/tools/llamacpp_ref_logits.py).
It also sees each worker's KV pools from its heartbeats (Gemma 3's sliding-window pool too)."""
import json
import os
import time

import openai
import pytest

from cluster import MODEL_ID, Router
from worker_client import BUILD, MODEL, Worker

MODELS_DIR = os.environ.get("SY_TEST_MODELS_DIR", os.path.join(BUILD, "test-models"))
# family -> (file, --max-context): different context lengths, so the router must keep each.
FAMILIES = {
    "llama3": ("llama3/llama3-q4_k_m.gguf", 1024),
    "qwen2": ("qwen2/qwen2-q5_k_m.gguf", 2048),
    "mistral": ("mistral/mistral-q6_k.gguf", 512),
    "qwen3": ("qwen3/qwen3-q4_k_m.gguf", 768),
    "gemma3": ("gemma3/gemma3-q4_k_m.gguf", 1536),
    "phi3": ("phi3/phi3-q4_k_m.gguf", 640),
}

pytestmark = pytest.mark.skipif(
    not os.path.exists(MODEL) or not all(os.path.exists(os.path.join(MODELS_DIR, f)) for f, _ in FAMILIES.values()),
    reason="SmolLM2 or the generated family models are missing (deploy/setup.sh; ctest -R models/generate)")


def model_id(path):
    return os.path.basename(path)[: -len(".gguf")]


@pytest.fixture(scope="module")
def cluster():
    workers = {"smollm2": Worker("--kv-blocks", "128", "--max-running", "4")}
    for fam, (f, ctx) in FAMILIES.items():
        workers[fam] = Worker("--model", os.path.join(MODELS_DIR, f), "--kv-blocks", "128", "--max-running", "4",
                              "--max-context", str(ctx))
    router = Router([w.endpoint for w in workers.values()])
    yield router, workers
    assert router.stop() == 0
    for w in workers.values():
        w.stop()


@pytest.fixture(scope="module")
def client(cluster):
    router, _ = cluster
    return openai.OpenAI(base_url=router.url + "/v1", api_key="anything", max_retries=0, timeout=60)


def reference(fam):
    with open(os.path.join(MODELS_DIR, FAMILIES[fam][0]) + ".logits.json", encoding="utf-8") as f:
        return json.load(f)


def finished(worker):
    return sum(v for k, v in worker.metrics().items() if k.startswith("switchyard_worker_requests_finished_total"))


def test_models_lists_every_model_with_its_context_length(cluster):
    router, _ = cluster
    status, _, body = router.get("/v1/models")
    assert status == 200
    cards = {m["id"]: m for m in json.loads(body)["data"]}
    assert set(cards) == {MODEL_ID} | {model_id(f) for f, _ in FAMILIES.values()}
    for f, ctx in FAMILIES.values():
        assert cards[model_id(f)]["max_model_len"] == ctx


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_chat_prompt_tokens_equal_llama_cpps_and_the_request_reaches_that_models_worker(cluster, client, fam):
    _, workers = cluster
    ref = reference(fam)
    # The system + user conversation of the reference: llama.cpp applied the model's template and
    # tokenized the result; the router must count the same tokens.
    case = next(c for c in ref["cases"] if c["chat"] and "You are a helpful assistant." in c["prompt"])
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    before = {k: finished(w) for k, w in workers.items()}
    r = client.chat.completions.create(model=model_id(FAMILIES[fam][0]), messages=messages, max_tokens=8,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(case["prompt_ids"])
    assert r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"
    after = {k: finished(w) for k, w in workers.items()}
    assert after[fam] == before[fam] + 1
    assert all(after[k] == before[k] for k in workers if k != fam)


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_streamed_completion_equals_non_streamed_for_each_family(client, fam):
    kw = dict(model=model_id(FAMILIES[fam][0]), prompt="The capital of France is", max_tokens=12, temperature=0,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 12
    assert whole.usage.prompt_tokens == len(reference(fam)["cases"][0]["prompt_ids"])


def test_context_length_is_checked_per_model(cluster):
    router, _ = cluster
    # ~700 tokens: over mistral's 512, within qwen2's 2048.
    prompt = "one two three four five six seven " * 100
    for fam, want in (("mistral", 400), ("qwen2", 200)):
        status, _, body = router.post("/v1/completions", {"model": model_id(FAMILIES[fam][0]), "prompt": prompt,
                                                          "max_tokens": 4})
        assert status == want, body
        if want == 400:
            assert b"context" in body


def test_unknown_model_is_404_naming_it(cluster):
    router, _ = cluster
    status, _, body = router.post("/v1/chat/completions", {"model": "llama3-q9_z",
                                                           "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404
    assert b"llama3-q9_z" in body


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_sampling_and_logprobs_work_for_each_family(client, fam):
    model = model_id(FAMILIES[fam][0])
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    # Seeded sampling is reproducible; a different seed is allowed to differ.
    kw = dict(model=model, messages=messages, max_tokens=12, temperature=0.9, top_p=0.95, seed=11,
              extra_body={"ignore_eos": True})
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.completion_tokens == 12


def test_qwen3_thinking_switch_through_chat_template_kwargs(cluster):
    router, _ = cluster
    msgs = [{"role": "user", "content": "What is the capital of France?"}]

    def tokens(**extra):
        status, _, body = router.post("/tokenize", {"model": model_id(FAMILIES["qwen3"][0]), "messages": msgs,
                                                    "return_token_strs": True, **extra})
        assert status == 200, body
        return json.loads(body)["token_strs"]

    on = tokens()
    off = tokens(chat_template_kwargs={"enable_thinking": False})
    assert off[: len(on)] == on
    assert "".join(off[len(on):]).replace("Ċ", "\n") == "<think>\n\n</think>\n\n"


def test_the_router_sees_both_kv_pools_of_a_gemma3_worker(cluster):
    # Gemma 3's sliding-window layers have a KV pool of their own (docs/worker.md); its heartbeats
    # carry that pool too, and the router's per-worker gauges show both pools and the binding one.
    router, workers = cluster
    gemma, smol = workers["gemma3"], workers["smollm2"]
    own = gemma.metrics()
    assert own["switchyard_worker_kv_window_blocks_total"] > 0

    def seen(w, name, pool=None):
        label = f'worker="{w.endpoint}"' + (f',pool="{pool}"' if pool else "")
        return router.metrics().get(f"switchyard_router_worker_kv_{name}{{{label}}}")

    end = time.time() + 10
    while seen(gemma, "pool_total_blocks", "window") != own["switchyard_worker_kv_window_blocks_total"]:
        assert time.time() < end, "the router never saw the window pool"
        time.sleep(0.2)
    # The router's view is the worker's last heartbeat (every 500 ms): blocks a finished request
    # gave back may reach it a heartbeat later. Idle, the two agree within a few heartbeats.

    def views():
        own = gemma.metrics()
        return ((seen(gemma, "pool_total_blocks", "main"), seen(gemma, "pool_free_blocks", "main"),
                 seen(gemma, "pool_free_blocks", "window"), seen(gemma, "free_blocks")),
                (own["switchyard_worker_kv_blocks_total"], own["switchyard_worker_kv_blocks_free"],
                 own["switchyard_worker_kv_window_blocks_free"],
                 min(own["switchyard_worker_kv_blocks_free"], own["switchyard_worker_kv_window_blocks_free"])))

    end = time.time() + 10
    router_view, worker_view = views()
    while router_view != worker_view and time.time() < end:
        time.sleep(0.2)
        router_view, worker_view = views()
    # (main total, main free, window free, binding free) as the router and as the worker has them
    assert router_view == worker_view
    # SmolLM2 has no window layers: no window series, its main pool binds.
    assert seen(smol, "pool_total_blocks", "window") is None
    assert seen(smol, "free_blocks") == smol.metrics()["switchyard_worker_kv_blocks_free"]
