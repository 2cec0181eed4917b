"""The router in front of real workers, driven over real HTTP: the official openai SDK, bad
input, tenants and limits, priorities, a worker killed mid-stream, client disconnects."""
import json
import resource
import socket
import subprocess
import threading
import time

import openai
import pytest

from cluster import MODEL_ID, Router, raw_http
from support import needs_model
from worker_client import Worker

pytestmark = needs_model

QUESTION = "How do I register an account on a website?"


@pytest.fixture(scope="module")
def cluster():
    workers = [Worker("--kv-blocks", "256", "--max-running", "8") for _ in range(2)]
    router = Router([w.endpoint for w in workers])
    yield router, workers
    assert router.stop() == 0
    for w in workers:
        w.stop()


@pytest.fixture(scope="module")
def client(cluster):
    router, _ = cluster
    return openai.OpenAI(base_url=router.url + "/v1", api_key="anything", max_retries=0, timeout=60)


def test_models_lists_what_workers_serve(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]


def test_chat_completion_with_the_openai_sdk(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}],
                                       max_tokens=32, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert len(r.choices[0].message.content) > 10
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 32
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_text_equals_non_streamed_text(client):
    kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Write a haiku about the sea."}], max_tokens=40,
              temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    usage = chunks[-1].usage  # include_usage: a last chunk with usage and no choices
    assert chunks[-1].choices == [] and usage.completion_tokens == whole.usage.completion_tokens


def test_completions_stream_and_prefix_cache_reported(client):
    prompt = ("You are a support assistant for an online shop. Customers ask about accounts, orders and "
              "deliveries; answer briefly and politely. The three most common ways to register an account are")
    first = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=24, temperature=0)
    assert first.object == "text_completion" and first.choices[0].text
    stream = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=24, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == first.choices[0].text
    again = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=24, temperature=0)
    assert again.choices[0].text == first.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the prompt's full blocks came from the cache


def test_echo_puts_the_prompt_first_streamed_or_not(client):
    prompt = "Once upon a time"
    whole = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0, echo=True)
    assert whole.choices[0].text.startswith(prompt) and len(whole.choices[0].text) > len(prompt)
    chunks = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0, echo=True,
                                       stream=True)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_n_choices_seed_and_logprobs(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Name a colour."}],
                                       max_tokens=8, temperature=1.0, seed=7, n=3, logprobs=True, top_logprobs=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    # One logprob entry per generated token: the choices' entries add up to completion_tokens.
    assert sum(len(c.logprobs.content) for c in r.choices) == r.usage.completion_tokens
    for c in r.choices:
        assert 1 <= len(c.logprobs.content) <= 8
        for t in c.logprobs.content:
            assert t.logprob <= 0 and len(t.top_logprobs) == 2
    again = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Name a colour."}],
                                           max_tokens=8, temperature=1.0, seed=7, n=3)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]  # seeded



def test_choices_of_neighbouring_seeds_are_unrelated(client):
    kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a short story about a robot."}],
              max_tokens=16, temperature=1.0, n=3)
    s7 = [c.message.content for c in client.chat.completions.create(seed=7, **kw).choices]
    s8 = [c.message.content for c in client.chat.completions.create(seed=8, **kw).choices]
    one = client.chat.completions.create(seed=7, **{**kw, "n": 1}).choices[0].message.content
    assert one == s7[0]  # the first of n choices is what n = 1 gives
    assert len(set(s7 + s8)) == 6, (s7, s8)  # seed 7's second choice is not seed 8's first, ...


# The completion-token rule (docs/worker.md): every sampled token is a completion token, the end
# token included, with one logprob entry each; the end token's entry names it and adds no text.
# And vLLM's stop_reason: the stop string that ended the choice, null at the end of the turn or
# max_tokens.
@pytest.mark.parametrize("ending", ["eos", "stop_string", "max_tokens"])
@pytest.mark.parametrize("stream", [False, True])
def test_logprob_entries_equal_completion_tokens_however_a_choice_ends(client, ending, stream):
    kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": "What is the capital of France?"}],
              max_tokens=64, temperature=0, logprobs=True, top_logprobs=1)
    if ending == "stop_string":
        kw["stop"] = ["Paris"]
    if ending == "max_tokens":
        kw["max_tokens"] = 3
    if stream:
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        entries = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = chunks[-1].usage
        # vLLM's stop_reason: on the choice's last chunk only.
        stop_reasons = [(c.choices[0].model_extra or {}).get("stop_reason", "absent") for c in chunks if c.choices]
        assert all(x == "absent" for x in stop_reasons[:-1]), stop_reasons
        stop_reason = stop_reasons[-1]
    else:
        r = client.chat.completions.create(**kw)
        entries, text = r.choices[0].logprobs.content, r.choices[0].message.content
        finish, usage = [r.choices[0].finish_reason], r.usage
        stop_reason = r.choices[0].model_extra.get("stop_reason", "absent")
    assert len(entries) == usage.completion_tokens
    assert finish == ["length" if ending == "max_tokens" else "stop"]
    assert stop_reason == ("Paris" if ending == "stop_string" else None)  # the stop string, else null
    if ending == "eos":
        assert entries[-1].token == "<|im_end|>" and "<|im_end|>" not in text and "Paris" in text
        assert "".join(t.token for t in entries[:-1]) == text
    if ending == "stop_string":
        assert "Paris" not in text and entries[-1].token != "<|im_end|>"
    if ending == "max_tokens":
        assert usage.completion_tokens == 3


BAD = [
    # (path, raw body, status, code or None, param or None)
    ("/v1/chat/completions", b"{not json", 400, "invalid_json", None),
    ("/v1/chat/completions", b"[1, 2]", 400, "invalid_json", None),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), 400,
     "missing_required_parameter", "model"),
    ("/v1/chat/completions", json.dumps({"model": MODEL_ID, "messages": "hi"}).encode(), 400, "invalid_type",
     "messages"),
    ("/v1/chat/completions", json.dumps({"model": MODEL_ID, "messages": []}).encode(), 400, None, "messages"),
    ("/v1/chat/completions", json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": -5}).encode(), 400, "invalid_value", "max_tokens"),
    ("/v1/chat/completions", json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 10 ** 12}).encode(), 400, None, "max_tokens"),
    ("/v1/chat/completions", json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": "ten"}).encode(), 400, "invalid_type", "max_tokens"),
    ("/v1/chat/completions", json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}],
                                         "temperature": 7}).encode(), 400, "invalid_value", "temperature"),
    ("/v1/chat/completions", json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}],
                                         "n": 1000}).encode(), 400, "invalid_value", "n"),
    ("/v1/chat/completions", json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]
                                         }).encode(), 404, "model_not_found", "model"),
    ("/v1/completions", json.dumps({"model": MODEL_ID, "prompt": ""}).encode(), 400, "invalid_value", "prompt"),
    ("/v1/completions", b'{"model": "' + MODEL_ID.encode() + b'", "prompt": "caf\xc3\x28 bad utf8"}', 400,
     "invalid_json", None),
    ("/v1/completions", json.dumps({"model": MODEL_ID, "prompt": [99999999]}).encode(), 400, None, "prompt"),
    ("/v1/completions", json.dumps({"model": MODEL_ID, "prompt": "word " * 3000, "max_tokens": 16}).encode(), 400,
     "context_length_exceeded", "prompt"),
    ("/v1/completions", json.dumps({"model": MODEL_ID, "prompt": "hi", "max_tokens": 5000}).encode(), 400,
     "context_length_exceeded", "prompt"),
]


@pytest.mark.parametrize("path,body,status,code,param", BAD)
def test_bad_input_gets_a_specific_4xx(cluster, path, body, status, code, param):
    router, _ = cluster
    got, headers, raw = router.post(path, body)
    assert got == status, raw
    err = json.loads(raw)["error"]
    assert err["message"]
    if code:
        assert err["code"] == code, err
    if param:
        assert err["param"] == param, err
    assert router.get("/health")[0] == 200


def test_oversized_body_unknown_route_and_wrong_method(cluster):
    router, _ = cluster
    status, _, raw = router.post("/v1/completions", b"x" * (5 << 20))
    assert status == 413 and json.loads(raw)["error"]["message"]
    assert router.get("/v1/nothing")[0] == 404
    assert router.get("/v1/chat/completions")[0] == 405
    status, _ = raw_http(router.port, b"GARBAGE\r\n\r\n")
    assert status == 400
    assert router.get("/health")[0] == 200


def test_request_id_is_echoed_or_generated(cluster):
    router, _ = cluster
    body = {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2}
    _, headers, _ = router.post("/v1/completions", body, headers={"X-Request-Id": "abc-123"})
    assert headers.get("X-Request-Id") == "abc-123"
    _, headers, _ = router.post("/v1/completions", body)
    assert headers.get("X-Request-Id", "").startswith("req-")


def sse_events(resp):
    for line in resp:
        line = line.decode().strip()
        if line.startswith("data: "):
            yield line[6:]


def test_client_disconnect_cancels_on_the_worker(cluster):
    router, workers = cluster
    before = sum(w.metrics()["switchyard_worker_requests_finished_total{reason=\"cancelled\"}"] for w in workers)
    s = socket.create_connection(("127.0.0.1", router.port))
    body = json.dumps({"model": MODEL_ID, "prompt": "Count to one thousand:", "max_tokens": 1500, "stream": True,
                       "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()
    # The router publishes its dispatcher's counters on a 100 ms tick, which can come after the
    # worker has already finished the cancel (a sanitizer build is slow): wait for both.
    deadline = time.time() + 10
    while time.time() < deadline:
        ms = [w.metrics() for w in workers]
        cancelled = sum(m["switchyard_worker_requests_finished_total{reason=\"cancelled\"}"] for m in ms)
        router_cancels = router.metrics()["switchyard_router_client_cancels_total"]
        if cancelled == before + 1 and all(m["switchyard_worker_requests_running"] == 0 for m in ms) \
                and router_cancels >= 1:
            break
        time.sleep(0.1)
    assert cancelled == before + 1
    for m in ms:
        assert m["switchyard_worker_kv_blocks_free"] == m["switchyard_worker_kv_blocks_total"]
    assert router_cancels >= 1


def test_metrics_show_latency_histograms(cluster):
    router, _ = cluster
    m = router.metrics()
    assert m["switchyard_router_ttft_seconds_count"] > 0
    assert m["switchyard_router_dispatch_overhead_seconds_count"] > 0
    assert m["switchyard_router_write_overhead_seconds_count"] > 0
    assert m['switchyard_router_workers{state="ready"}'] == 2
    assert m['switchyard_router_requests_total{status="200"}'] > 0


# ---- Separate clusters for limits, priorities and failures -------------------------------------


def test_tenant_keys_and_rate_limit(tmp_path):
    cfg = {"tenants": [{"name": "slow", "keys": ["sk-slow"], "requests_per_s": 0.2, "burst": 1},
                       {"name": "fast", "keys": ["sk-fast"]}, {"name": "ops", "keys": ["sk-ops"], "admin": True}]}
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(cfg))
    w = Worker("--kv-blocks", "128")
    r = Router([w.endpoint], "--tenants", str(path), admin_key="sk-ops")
    try:
        body = {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2}
        assert r.post("/v1/completions", body)[0] == 401
        assert r.post("/v1/completions", body, headers={"Authorization": "Bearer sk-wrong"})[0] == 401
        assert r.get("/v1/models", headers={"Authorization": "Bearer sk-slow"})[0] == 200
        assert r.post("/v1/completions", body, headers={"Authorization": "Bearer sk-slow"})[0] == 200
        status, headers, raw = r.post("/v1/completions", body, headers={"Authorization": "Bearer sk-slow"})
        assert status == 429 and int(headers["Retry-After"]) >= 1
        assert json.loads(raw)["error"]["code"] == "tenant_rate"
        assert r.post("/v1/completions", body, headers={"Authorization": "Bearer sk-fast"})[0] == 200
        # Metrics are published every 100 ms: wait for the count, then check it is exactly one.
        deadline = time.time() + 10
        while r.metrics().get('switchyard_router_admission_rejections_total{reason="tenant_rate"}', 0) < 1:
            assert time.time() < deadline, "the rejection was never counted"
            time.sleep(0.05)
        assert r.metrics()['switchyard_router_admission_rejections_total{reason="tenant_rate"}'] == 1
    finally:
        r.stop()
        w.stop()


def test_priority_outside_the_tenants_range_is_clamped_or_refused_when_strict(tmp_path):
    cfg = {"tenants": [{"name": "capped", "keys": ["sk-capped"], "priority": {"default": 2, "min": 0, "max": 5}},
                       {"name": "strict", "keys": ["sk-strict"],
                        "priority": {"default": 2, "min": 0, "max": 5, "strict": True}},
                       {"name": "ops", "keys": ["sk-ops"], "admin": True}]}
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(cfg))
    w = Worker("--kv-blocks", "128")
    r = Router([w.endpoint], "--tenants", str(path), admin_key="sk-ops")
    try:
        capped = openai.OpenAI(base_url=r.url + "/v1", api_key="sk-capped", max_retries=0, timeout=60)
        body = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        raw = capped.chat.completions.with_raw_response.create(**body, extra_body={"priority": -1})
        assert raw.http_response.status_code == 200
        assert raw.headers["x-switchyard-priority"] == "0"  # the tenant's most urgent allowed
        assert raw.parse().choices[0].message.content is not None
        raw = capped.chat.completions.with_raw_response.create(**body, extra_body={"priority": 3})
        assert "x-switchyard-priority" not in raw.headers  # inside the range: as asked
        with capped.chat.completions.with_streaming_response.create(**body, stream=True,
                                                                    extra_body={"priority": 50}) as s:
            assert s.headers["x-switchyard-priority"] == "5"
            assert any(line.startswith("data: [DONE]") for line in s.iter_lines())
        status, headers, raw = r.post("/v1/chat/completions", dict(body, priority=-1),
                                      headers={"Authorization": "Bearer sk-strict"})
        assert status == 403 and "Retry-After" not in headers
        assert json.loads(raw)["error"]["code"] == "priority_not_allowed"
        assert r.post("/v1/chat/completions", dict(body, priority=1),
                      headers={"Authorization": "Bearer sk-strict"})[0] == 200
        deadline = time.time() + 10
        while r.metrics().get('switchyard_router_admission_rejections_total{reason="priority_not_allowed"}', 0) < 1:
            assert time.time() < deadline, "the refusal was never counted"
            time.sleep(0.05)
    finally:
        r.stop()
        w.stop()


def stream_in_thread(router, body, results, key):
    def run():
        status, _, raw = router.post("/v1/completions", body, timeout=300)
        results[key] = (status, time.time(), raw)  # when it finished
    t = threading.Thread(target=run)
    t.start()
    return t


def test_priority_interactive_overtakes_queued_batch_work():
    w = Worker("--kv-blocks", "128", "--max-running", "1")
    # No aging: on a slow machine the queued batch requests would otherwise wait long enough to be
    # promoted past the interactive one (aging is tested in the dispatcher and queue unit tests).
    r = Router([w.endpoint], "--local-queue", "0", "--aging-s", "3600")
    try:
        results, threads = {}, []
        batch = {"model": MODEL_ID, "prompt": "Tell me a long story.", "max_tokens": 200, "ignore_eos": True,
                 "temperature": 0, "priority": 5}
        for i in range(4):
            threads.append(stream_in_thread(r, batch, results, f"batch{i}"))
        # One batch request runs on the worker, three wait in the router's queue: only now does
        # the interactive request arrive (however slow this machine is right now).
        deadline = time.time() + 60
        while r.metrics().get(f'switchyard_router_queue_depth{{model="{MODEL_ID}",class="batch"}}') != 3:
            assert time.time() < deadline, "the batch requests never queued up"
            time.sleep(0.05)
        inter = dict(batch, priority=-1, max_tokens=8)
        threads.append(stream_in_thread(r, inter, results, "interactive"))
        for t in threads:
            t.join(600)
        assert all(s == 200 for s, _, _ in results.values()), results
        end = {k: v[1] for k, v in results.items()}
        # Submitted last, it overtakes the three queued batch requests: only the one that was
        # already running finishes before it.
        before = [k for k in end if k.startswith("batch") and end[k] < end["interactive"]]
        assert len(before) == 1, end
    finally:
        r.stop()
        w.stop()


def test_queue_cap_gives_429_with_retry_after():
    w = Worker("--kv-blocks", "128", "--max-running", "1")
    r = Router([w.endpoint], "--local-queue", "0", "--max-queued-requests", "1")
    try:
        results, threads = {}, []
        body = {"model": MODEL_ID, "prompt": "Tell me a story.", "max_tokens": 300, "ignore_eos": True}
        for i in range(2):  # one runs, one waits in the queue
            threads.append(stream_in_thread(r, body, results, f"r{i}"))
        deadline = time.time() + 60
        while r.metrics().get(f'switchyard_router_queue_depth{{model="{MODEL_ID}",class="standard"}}') != 1:
            assert time.time() < deadline, "the second request never queued"
            time.sleep(0.05)
        status, headers, raw = r.post("/v1/completions", body)
        assert status == 429 and int(headers["Retry-After"]) >= 1  # a full queue, as SGLang's gateway says
        assert json.loads(raw)["error"]["code"] == "queue_full"
        for t in threads:
            t.join(300)
        assert all(s == 200 for s, _, _ in results.values())
    finally:
        r.stop()
        w.stop()


def test_queue_timeout_ends_only_requests_still_queued(tmp_path):
    """One slow request holds the only worker slot for longer than the queue timeout: requests
    queued behind it end with 408 queue_timeout and Retry-After (a stream with its error event),
    a tenant without a queue timeout waits its turn, and the slow one is never cut. A request's own
    `queue_timeout` shortens the wait (even where its tenant has none) and cannot lengthen it."""
    cfg = {"tenants": [{"name": "std", "keys": ["sk-std"]},
                       {"name": "patient", "keys": ["sk-patient"], "queue_timeout_s": 0},
                       {"name": "ops", "keys": ["sk-ops"], "admin": True}]}
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(cfg))
    # Every step 25 ms slower: the slow request runs for 3 s or more however fast the machine is.
    w = Worker("--kv-blocks", "128", "--max-running", "1", "--fault-inject", "slow-step:25")
    r = Router([w.endpoint], "--local-queue", "0", "--queue-timeout-s", "1", "--tenants", str(path),
               admin_key="sk-ops")
    try:
        std = {"Authorization": "Bearer sk-std"}
        slow = {"model": MODEL_ID, "prompt": "Tell me a long story.", "max_tokens": 120, "ignore_eos": True,
                "temperature": 0}
        results = {}

        def post(key, body, headers):
            t0 = time.time()
            results[key] = (*r.post("/v1/completions", body, headers=headers, timeout=300), time.time() - t0)
        slow_t = threading.Thread(target=post, args=("slow", slow, std))
        slow_t.start()
        deadline = time.time() + 60
        while r.metrics().get(f'switchyard_router_active_requests{{model="{MODEL_ID}"}}', 0) < 1:
            assert time.time() < deadline, "the slow request never arrived"
            time.sleep(0.05)
        patient_t = threading.Thread(target=post, args=("patient", dict(slow, max_tokens=4),
                                                        {"Authorization": "Bearer sk-patient"}))
        patient_t.start()
        client = openai.OpenAI(base_url=r.url + "/v1", api_key="sk-std", max_retries=0, timeout=60)
        t0 = time.time()
        with pytest.raises(openai.APIStatusError) as err:  # asks for 30 s: the router's 1 s holds
            client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=4, extra_body={"queue_timeout": 30})
        waited = time.time() - t0
        assert err.value.status_code == 408
        assert err.value.body["code"] == "queue_timeout" and err.value.body["type"] == "timeout_error"
        assert int(err.value.response.headers["retry-after"]) >= 1
        assert 0.9 <= waited < 10, waited
        # A patient tenant's client that asks for its own queue timeout gets it.
        hasty = openai.OpenAI(base_url=r.url + "/v1", api_key="sk-patient", max_retries=0, timeout=60)
        t0 = time.time()
        with pytest.raises(openai.APIStatusError) as err:
            hasty.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          extra_body={"queue_timeout": 0.3})
        assert err.value.status_code == 408 and err.value.body["code"] == "queue_timeout"
        assert time.time() - t0 < 10
        # A stream's head went out when it was admitted: it ends with the error event and [DONE].
        status, _, raw = r.post("/v1/completions", {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 4,
                                                    "stream": True}, headers=std)
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "queue_timeout"
        slow_t.join(300)
        patient_t.join(300)
        status, _, raw, took = results["slow"]
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 120
        assert took > 1.5, "the slow request must outlast the queue timeout for this test to mean anything"
        assert results["patient"][0] == 200  # waited longer than 1 s behind the slow one
        assert results["patient"][3] > 1.0
        assert r.metrics()["switchyard_router_queue_timeouts_total"] == 3
        assert r.metrics()['switchyard_router_requests_total{status="408"}'] == 3
    finally:
        r.stop()
        w.stop()


def test_worker_killed_mid_stream_every_request_ends():
    workers = [Worker("--kv-blocks", "256", "--max-running", "8") for _ in range(2)]
    # 3 s: the survivor, recomputing the resumed streams on a loaded machine, must not look dead.
    r = Router([w.endpoint for w in workers], "--heartbeat-timeout-ms", "3000")
    try:
        outcomes, first_events = {}, {}

        def stream(i):
            body = json.dumps({"model": MODEL_ID, "prompt": f"Story number {i}:", "max_tokens": 400,
                               "ignore_eos": True, "stream": True}).encode()
            s = socket.create_connection(("127.0.0.1", r.port), timeout=60)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            data = b""
            t_end = None
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"data: " in data:
                    first_events[i] = data
                if b"data: [DONE]" in data:
                    t_end = time.time()
                    break
            s.close()
            outcomes[i] = (t_end, data)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        # Until all six stream on the two workers (each has sent some tokens), however slow the
        # machine is right now.
        deadline = time.time() + 60
        while not all(len(first_events.get(i, b"")) > 0 for i in range(6)) or \
                sum(w.metrics()["switchyard_worker_requests_running"] for w in workers) < 6 or \
                any(w.metrics()["switchyard_worker_requests_running"] == 0 for w in workers):
            assert time.time() < deadline, "the streams never all started"
            time.sleep(0.05)
        workers[0].stop(sig=9)
        for t in threads:
            t.join(120)
        assert len(outcomes) == 6
        for i, (t_end, data) in outcomes.items():
            assert t_end is not None, f"request {i} never ended"
            # Started streams resume on the other worker (docs/reliability.md): no error event.
            assert b'data: {"error"' not in data, (i, data[-300:])
        ok = openai.OpenAI(base_url=r.url + "/v1", api_key="x", max_retries=0).completions.create(
            model=MODEL_ID, prompt="Still there?", max_tokens=4)
        assert ok.choices[0].text is not None
        m = r.metrics()
        # Declared dead; past twice the heartbeat timeout it is greeted afresh (still listed).
        assert m['switchyard_router_workers{state="dead"}'] + m['switchyard_router_workers{state="connecting"}'] == 1
        assert m['switchyard_router_workers{state="ready"}'] == 1
        assert f"worker {workers[0].endpoint} ready -> dead" in open(r.log.name).read()
        assert m["switchyard_router_worker_lost_total"] == 0
        assert m["switchyard_router_streams_resumed_total"] >= 1
    finally:
        r.stop()
        for w in workers:
            w.stop()


@pytest.mark.may_skip("a descriptor ceiling below 4,200 is the machine's, not a missing package")
def test_two_thousand_streaming_clients_then_all_disconnect():
    """2,000 concurrent SSE connections on this 2-core machine: every one is admitted and gets
    its stream headers (most wait in the router's queue); when they all go away, every request
    is cancelled and the worker ends with no running request and all KV blocks free."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4200:
        pytest.skip(f"the descriptor limit here ({hard}) cannot hold 2,000 connections on both ends")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4200), hard))
    w = Worker("--kv-blocks", "256", "--max-running", "8")
    r = Router([w.endpoint], "--max-queued-requests", "4096")
    socks = []
    try:
        body = json.dumps({"model": MODEL_ID, "prompt": "Tell me a story.", "max_tokens": 64, "stream": True,
                           "priority": -1}).encode()
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
               str(len(body)).encode() + b"\r\n\r\n" + body)
        for _ in range(2000):
            s = socket.create_connection(("127.0.0.1", r.port), timeout=30)
            s.sendall(req)
            socks.append(s)
        ok = 0
        for s in socks:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
            ok += head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
        assert ok == 2000
        m = r.metrics()
        assert m["switchyard_router_http_connections_open"] >= 2000
        for s in socks:
            s.close()
        socks = []
        deadline = time.time() + 30
        while time.time() < deadline:
            m, wm = r.metrics(), w.metrics()
            active = m[f'switchyard_router_active_requests{{model="{MODEL_ID}"}}']
            if (active == 0 and wm["switchyard_worker_requests_running"] == 0
                    and wm["switchyard_worker_requests_waiting"] == 0):
                break
            time.sleep(0.2)
        assert m[f'switchyard_router_active_requests{{model="{MODEL_ID}"}}'] == 0
        assert m["switchyard_router_client_cancels_total"] + m.get('switchyard_router_requests_total{status="200"}', 0) \
            == 2000
        assert wm["switchyard_worker_kv_blocks_free"] == wm["switchyard_worker_kv_blocks_total"]
        assert r.get("/health")[0] == 200
    finally:
        for s in socks:
            s.close()
        r.stop()
        w.stop()


def test_workers_found_through_dns():
    w = Worker("--kv-blocks", "64")
    port = w.endpoint.rsplit(":", 1)[1]
    r = Router([], "--workers-dns", f"localhost:{port}", "--dns-interval-s", "1")  # ready = a worker joined
    try:
        status, _, raw = r.post("/v1/completions", {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2})
        assert status == 200, raw
        m = r.metrics()  # one address family: the worker counts once
        assert sum(v for k, v in m.items() if k.startswith("switchyard_router_workers{")) == 1
    finally:
        r.stop()
        w.stop()


def test_a_port_in_use_is_a_clear_startup_error():
    from cluster import ROUTER
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run([ROUTER, "--workers", "tcp://127.0.0.1:1", "--workers-dns", "localhost:1", "--port",
                            str(port)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert f"cannot bind 127.0.0.1:{port}" in p.stderr
