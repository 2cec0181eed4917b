"""The response cache end to end: a real redis-server, a real worker and routers with --redis,
driven over HTTP. Hits and misses, what changes the key, the opt-outs, tenant namespaces, TTL,
stream replay (the stop string that ended a choice named as live), request coalescing, Redis
killed or paused under load, and /v1/cache/stats."""
import concurrent.futures
import json
import shutil
import signal
import socket
import subprocess
import threading
import time

import openai
import pytest

from cluster import MODEL_ID, Redis, Router
from support import needs_model, poll
from worker_client import BUILD, Worker, free_port, tokenize

pytestmark = [
    needs_model,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed"),
]

FINISHED = "switchyard_worker_requests_finished_total"
# Liveness is not under test here: on a loaded 2-core machine (ctest -j) a worker may miss the
# default 2 s of heartbeats, and a re-dispatched request would count two generations.
ROUTER_OPTS = ("--heartbeat-timeout-ms", "15000")
LOOKUPS = "switchyard_router_cache_lookups_total"
STORES = "switchyard_router_cache_stores_total"


@pytest.fixture(scope="module")
def worker():
    w = Worker("--kv-blocks", "256", "--max-running", "16")
    yield w
    w.stop()


@pytest.fixture(scope="module")
def redis():
    r = Redis()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def router(worker, redis):
    r = Router([worker.endpoint], *ROUTER_OPTS, "--redis", redis.url)
    yield r
    assert r.stop() == 0


@pytest.fixture
def own_redis_router(worker):
    """A router on a Redis of its own, for tests that break Redis or count analytics exactly."""
    made = []

    def make(*extra):
        red = Redis()
        rt = Router([worker.endpoint], *ROUTER_OPTS, "--redis", red.url, *extra)
        made.append((rt, red))
        return rt, red

    yield make
    for rt, red in made:
        rt.stop()
        red.stop()


def generations(worker, expect=None):
    """Generations the worker has finished (stop or length). The worker publishes its counters
    before the frames that end a generation go out (worker/service/engine_actor.cpp), so a client that has
    its answer finds it counted: with `expect`, waits (2 s at most) for the count to reach it;
    without, lets the worker settle (nothing running) first."""
    def count():
        m = worker.metrics()
        return m[FINISHED + '{reason="stop"}'] + m[FINISHED + '{reason="length"}']
    if expect is not None:
        return poll(lambda: count() == expect and count(), timeout=2) or count()
    poll(lambda: (lambda m: m["switchyard_worker_requests_running"] + m["switchyard_worker_requests_waiting"] == 0)(
        worker.metrics()), timeout=2)
    return count()


def completion(router, body, headers=None, path="/v1/completions", timeout=60):
    """(X-Cache header or None, parsed body); asserts a 200."""
    status, h, raw = router.post(path, body, headers=headers, timeout=timeout)
    assert status == 200, raw
    return h.get("X-Cache"), json.loads(raw)


def stored(router, body, headers=None, path="/v1/completions"):
    """completion(), then waits until the router has stored the answer in Redis (the store is
    fire-and-forget: an immediate identical request could look up before it lands)."""
    before = router.metrics()[STORES]
    out = completion(router, body, headers=headers, path=path)
    assert poll(lambda: router.metrics()[STORES] > before, 2), "the answer was not stored"
    return out


def text_of(resp):
    c = resp["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


def sse_events(raw):
    """The data payloads of an SSE body, in order ("[DONE]" kept as a string)."""
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            d = line[6:]
            out.append(d if d == "[DONE]" else json.loads(d))
    return out


def body_for(prompt, **kw):
    return {"model": MODEL_ID, "prompt": prompt, "max_tokens": 4, "temperature": 0, **kw}


# ---- hit / miss ---------------------------------------------------------------------------------


def test_miss_then_hit_without_touching_the_worker(router, worker):
    body = body_for("How do I register an account on your website?", max_tokens=12)
    g0 = generations(worker)
    x1, first = stored(router, body)
    assert x1 != "hit"
    assert generations(worker, g0 + 1) == g0 + 1
    g1, p1 = generations(worker), worker.metrics()["switchyard_worker_prompt_tokens_processed_total"]
    x2, second = completion(router, body)
    assert x2 == "hit"
    assert text_of(second) == text_of(first)
    assert second["choices"][0]["finish_reason"] == first["choices"][0]["finish_reason"]
    assert second["usage"]["completion_tokens"] == first["usage"]["completion_tokens"] > 0
    assert second["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"] > 0
    assert second["usage"]["total_tokens"] == first["usage"]["total_tokens"]
    assert second["id"] != first["id"]  # a response of its own, only the content is shared
    m = worker.metrics()
    assert generations(worker) == g1
    assert m["switchyard_worker_prompt_tokens_processed_total"] == p1
    rm = router.metrics()
    assert rm[LOOKUPS + '{status="hit"}'] >= 1 and rm[LOOKUPS + '{status="miss"}'] >= 1
    assert rm["switchyard_router_cache_stores_total"] >= 1


def test_every_output_affecting_parameter_changes_the_key(router, worker):
    prompt = "List three colours of the rainbow."
    base = body_for(prompt)
    stored(router, base)
    assert completion(router, base)[0] == "hit"
    chat_ids = tokenize(prompt, chat=True)
    variants = {
        "seeded temperature": dict(base, temperature=0.7, seed=1),
        "other seed": dict(base, temperature=0.7, seed=2),
        "seed at temperature 0": dict(base, seed=5),
        "top_p": dict(base, top_p=0.5),
        "top_k": dict(base, top_k=5),
        "min_p": dict(base, min_p=0.1),
        "repetition_penalty": dict(base, repetition_penalty=1.3),
        "max_tokens": dict(base, max_tokens=5),
        "stop": dict(base, stop=["\n"]),
        "n": dict(base, n=2),
        "echo": dict(base, echo=True),
        "ignore_eos": dict(base, ignore_eos=True),
        "prompt": dict(base, prompt=prompt + " "),
        "completions of the chat tokens": dict(base, prompt=chat_ids),
    }
    chat = {"model": MODEL_ID, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "temperature": 0}
    g0, s0 = generations(worker), router.metrics()[STORES]
    for name, body in variants.items():
        x, _ = completion(router, body)
        assert x != "hit", name
    x, chat_first = completion(router, chat, path="/v1/chat/completions")
    assert x != "hit", "chat vs completions"
    # Each variant really went to the worker (n=2 is two generations) and is now stored apart.
    assert generations(worker, g0 + len(variants) + 1 + 1) == g0 + len(variants) + 1 + 1
    assert poll(lambda: router.metrics()[STORES] == s0 + len(variants) + 1, 2)
    for name, body in variants.items():
        assert completion(router, body)[0] == "hit", name
    x, chat_again = completion(router, chat, path="/v1/chat/completions")
    assert x == "hit" and text_of(chat_again) == text_of(chat_first)
    # The completions request of the chat's own tokens had the very same prompt: only the
    # endpoint told the two apart.
    _, as_completion = completion(router, variants["completions of the chat tokens"])
    assert as_completion["usage"]["prompt_tokens"] == chat_first["usage"]["prompt_tokens"]
    assert completion(router, base)[0] == "hit"  # the base entry is untouched


def test_non_deterministic_requests_are_never_cached(router, worker):
    body = body_for("Tell me a random animal.", temperature=0.9)
    before = router.metrics()
    g0 = generations(worker)
    for _ in range(3):
        assert completion(router, body)[0] is None
    assert generations(worker, g0 + 3) == g0 + 3
    after = router.metrics()
    for status in ("hit", "miss", "error"):  # not even looked up
        assert after[LOOKUPS + f'{{status="{status}"}}'] == before[LOOKUPS + f'{{status="{status}"}}']
    assert after["switchyard_router_cache_stores_total"] == before["switchyard_router_cache_stores_total"]


def test_no_store_and_body_opt_out_bypass_the_cache(router, worker):
    cached = body_for("What is the capital of France?")
    stored(router, cached)
    assert completion(router, cached)[0] == "hit"
    g0 = generations(worker)
    # Opted out: no lookup (the entry exists, yet the worker answers) ...
    assert completion(router, cached, headers={"Cache-Control": "no-store"})[0] is None
    assert completion(router, dict(cached, cache=False))[0] is None
    assert generations(worker, g0 + 2) == g0 + 2
    # ... and no store.
    for i, (body, headers) in enumerate([(body_for("What is the capital of Spain?"), {"Cache-Control": "no-store"}),
                                         (body_for("What is the capital of Italy?", cache=False), None)]):
        stores = router.metrics()[STORES]
        assert completion(router, body, headers=headers)[0] is None
        # A barrier instead of a sleep: a store of the opted-out answer would have been queued
        # before this one's; once this one has landed, that one would have too.
        stored(router, body_for(f"What is the capital of Greece? ({i})"))
        assert router.metrics()[STORES] == stores + 1
        plain = {k: v for k, v in body.items() if k != "cache"}
        # Not found, so generated and stored: waited for, or that store would land in the next
        # round's count.
        assert stored(router, plain)[0] != "hit", i


def test_no_cache_skips_the_lookup_but_stores(router, worker):
    cached = body_for("What is the capital of Germany?")
    completion(router, cached)
    g0 = generations(worker)
    assert completion(router, cached, headers={"Cache-Control": "no-cache"})[0] is None
    assert generations(worker, g0 + 1) == g0 + 1
    fresh = body_for("What is the capital of Portugal?")
    completion(router, fresh, headers={"Cache-Control": "no-cache"})
    assert poll(lambda: completion(router, fresh)[0] == "hit", timeout=2)


def test_ttl_expiry(worker, redis):
    r = Router([worker.endpoint], *ROUTER_OPTS, "--redis", redis.url, "--cache-ttl-s", "1")
    try:
        body = body_for("What does TTL stand for?")
        assert stored(r, body)[0] is None
        assert completion(r, body)[0] == "hit"
        g0 = generations(worker)
        # Asked again until the entry has expired: hits until then, then one miss that generates.
        assert poll(lambda: completion(r, body)[0] is None, timeout=10, every=0.1)
        assert generations(worker, g0 + 1) == g0 + 1
    finally:
        r.stop()


# ---- tenants ------------------------------------------------------------------------------------


def test_tenant_isolation_groups_and_admin_stats(worker, redis, tmp_path):
    cfg = {"tenants": [
        {"name": "alpha", "keys": ["sk-alpha"]},
        {"name": "beta", "keys": ["sk-beta"]},
        {"name": "gamma", "keys": ["sk-gamma"], "cache_group": "shared"},
        {"name": "delta", "keys": ["sk-delta"], "cache_group": "shared"},
        {"name": "ops", "keys": ["sk-ops"], "admin": True},
    ]}
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(cfg))
    r = Router([worker.endpoint], *ROUTER_OPTS, "--redis", redis.url, "--tenants", str(path), admin_key="sk-ops")
    try:
        def ask(key, store=False):
            return (stored if store else completion)(r, body_for("Which tenant am I?"),
                                                     headers={"Authorization": f"Bearer {key}"})[0]

        assert ask("sk-alpha", store=True) is None
        assert ask("sk-alpha") == "hit"
        assert ask("sk-beta", store=True) is None  # alpha's entry is not beta's
        assert ask("sk-beta") == "hit"
        assert ask("sk-gamma", store=True) is None  # nor the group's
        assert ask("sk-delta") == "hit"  # same cache_group: shared
        assert ask("sk-ops") is None
        for key in ("sk-alpha", "sk-gamma"):
            status, _, raw = r.get("/v1/cache/stats", headers={"Authorization": f"Bearer {key}"})
            assert status == 403 and json.loads(raw)["error"]["code"] == "admin_only"
        assert r.get("/v1/cache/stats")[0] == 401
        status, _, raw = r.get("/v1/cache/stats", headers={"Authorization": "Bearer sk-ops"})
        assert status == 200 and json.loads(raw)["complete"] is True
    finally:
        r.stop()


# ---- stream replay ------------------------------------------------------------------------------


def test_stream_replay_matches_the_live_stream(router):
    chat = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Write a haiku about caches."}],
            "max_tokens": 24, "temperature": 0}
    _, live_json = stored(router, chat, path="/v1/chat/completions")
    stream_req = dict(chat, stream=True, stream_options={"include_usage": True})
    status, h, raw = router.post("/v1/chat/completions", stream_req)
    assert status == 200 and h.get("X-Cache") == "hit"
    assert h["Content-Type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0].get("finish_reason")]
    assert finals == [live_json["choices"][0]["finish_reason"]]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == live_json["usage"]["completion_tokens"]
    # A live stream of the same request (cache off) says the same thing.
    status, h, live_raw = router.post("/v1/chat/completions", dict(stream_req, cache=False))
    assert status == 200 and h.get("X-Cache") is None
    live_events = sse_events(live_raw)
    live_text = "".join(c["choices"][0]["delta"].get("content") or "" for c in live_events[:-2])
    assert text == live_text == text_of(live_json)
    assert live_events[-2]["usage"]["completion_tokens"] == usage["usage"]["completion_tokens"]

    # Completions too, with the official SDK: the replay parses like any stream.
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0, timeout=60)
    kw = dict(model=MODEL_ID, prompt="The three primary colours are", max_tokens=16, temperature=0)
    s0 = router.metrics()[STORES]
    whole = client.completions.create(**kw)
    assert poll(lambda: router.metrics()[STORES] > s0, 2)
    raw_resp = client.completions.with_raw_response.create(stream=True, stream_options={"include_usage": True}, **kw)
    assert raw_resp.headers.get("x-cache") == "hit"
    chunks = list(raw_resp.parse())
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    chat_stream = list(client.chat.completions.create(
        model=MODEL_ID, messages=chat["messages"], max_tokens=24, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chat_stream if c.choices) == live_text


def test_a_replay_names_the_stop_string_as_the_live_answer_did(router):
    # vLLM's stop_reason: the stop string that ended the choice, kept with the cache entry.
    body = body_for("The three primary colours are", max_tokens=24, stop=[",", "."])
    x, live = stored(router, body)
    assert x != "hit" and live["choices"][0]["finish_reason"] == "stop"
    matched = live["choices"][0]["stop_reason"]
    assert matched in (",", ".") and matched not in live["choices"][0]["text"]
    x, hit = completion(router, body)
    assert x == "hit" and hit["choices"][0]["stop_reason"] == matched
    for cache in (True, False):  # replayed, then live
        status, h, raw = router.post("/v1/completions", dict(body, stream=True, cache=cache))
        assert status == 200 and (h.get("X-Cache") == "hit") == cache
        chunks = sse_events(raw)[:-1]
        assert [c["choices"][0].get("stop_reason", "absent") for c in chunks][-1] == matched
        assert all("stop_reason" not in c["choices"][0] for c in chunks[:-1])


# ---- coalescing ---------------------------------------------------------------------------------


def test_ten_identical_concurrent_requests_run_one_generation(router, worker):
    body = body_for("Explain request coalescing in one paragraph.", max_tokens=64, ignore_eos=True)
    results, barrier = {}, threading.Barrier(10)

    def one(i):
        b = dict(body, stream=True, stream_options={"include_usage": True}) if i % 3 == 2 else body
        barrier.wait()
        status, h, raw = router.post("/v1/completions", b, timeout=120)
        results[i] = (status, h.get("X-Cache"), raw, b.get("stream", False))

    g0, m0 = generations(worker), router.metrics()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 10
    texts, kinds = set(), []
    for status, x, raw, stream in results.values():
        assert status == 200, raw
        kinds.append(x)
        if stream:
            ev = sse_events(raw)
            assert ev[-1] == "[DONE]" and ev[-2]["usage"]["completion_tokens"] == 64
            texts.add("".join(c["choices"][0]["text"] for c in ev[:-2]))
        else:
            j = json.loads(raw)
            assert j["usage"]["completion_tokens"] == 64
            texts.add(j["choices"][0]["text"])
    assert len(texts) == 1 and len(next(iter(texts))) > 0
    hits, coalesced = kinds.count("hit"), kinds.count("coalesced")
    assert kinds.count(None) == 1 and hits + coalesced == 9, kinds
    assert generations(worker) == g0 + 1
    m = poll(lambda: (lambda m: m if m["switchyard_router_coalesced_total"] ==
                          m0["switchyard_router_coalesced_total"] + coalesced else None)(router.metrics()), 2)
    assert m, "switchyard_router_coalesced_total did not count the coalesced requests"
    assert coalesced >= 8  # all sent at once: at most a straggler comes after the generation ends


def open_stream(router, body):
    """A raw-socket streaming POST: (socket, bytes read so far once the first data event came)."""
    raw = json.dumps(dict(body, stream=True)).encode()
    s = socket.create_connection(("127.0.0.1", router.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(raw)).encode() + b"\r\n\r\n" + raw)
    got = b""
    while b"data: {" not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    return s, got


def dechunk(body):
    """The payload of a chunked transfer-encoded body."""
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        out += rest[:n]
        body = rest[n + 2:]
    return out


def post_in_thread(router, body, results, key):
    t = threading.Thread(target=lambda: results.__setitem__(key, router.post("/v1/completions", body, timeout=60)))
    t.start()
    return t


def join_midway(router, body, after):
    """A leader streams `body`; once it has `after` chunks, an identical streamed request joins
    it. (the leader's raw bytes to its end, the follower's (status, headers, body))."""
    leader, got = open_stream(router, body)  # generating: its first token is out
    try:
        while got.count(b"data: {") < after:
            chunk = leader.recv(65536)
            assert chunk, got
            got += chunk
        results = {}
        t = post_in_thread(router, dict(body, stream=True, stream_options={"include_usage": True}), results, "f")
        t.join(60)
        while b"data: [DONE]" not in got:
            got += leader.recv(65536)
    finally:
        leader.close()
    return got, results["f"]


def test_a_stream_joining_mid_generation_gets_the_whole_text(router, worker):
    body = body_for("Describe a lighthouse at night.", max_tokens=64, ignore_eos=True)
    g0, c0 = generations(worker), router.metrics()["switchyard_router_coalesced_total"]
    got, (status, h, raw) = join_midway(router, body, 1)
    assert status == 200 and h.get("X-Cache") == "coalesced"
    follower = sse_events(raw)
    assert follower[-1] == "[DONE]" and follower[-2]["usage"]["completion_tokens"] == 64
    leader_text = "".join(e["choices"][0]["text"] for e in sse_events(dechunk(got.partition(b"\r\n\r\n")[2]))
                          if e != "[DONE]" and e["choices"])
    assert "".join(e["choices"][0]["text"] for e in follower[:-2]) == leader_text
    assert generations(worker) == g0 + 1
    assert poll(lambda: router.metrics()["switchyard_router_coalesced_total"] == c0 + 1, 2)


def test_catch_ups_longer_than_the_stream_buffer_are_paced_not_cut(own_redis_router, worker):
    """A replayed answer, and what a joining stream missed, are all known at once; queued at once
    they overflowed --max-stream-buffer-bytes and the stream was closed as a slow client's. They
    are written as the client reads them: with a 4 KiB buffer, a 96-token replay (~20 KB of
    events) and a join 48 tokens into a generation arrive whole."""
    rt, _ = own_redis_router("--max-stream-buffer-bytes", "4096")
    overflows = "switchyard_router_http_stream_overflows_total"
    body = body_for("Tell a long story about a harbour.", max_tokens=96, ignore_eos=True)
    _, whole = stored(rt, body)
    status, h, raw = rt.post("/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}))
    assert status == 200 and h.get("X-Cache") == "hit"
    events = sse_events(raw)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 96
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == text_of(whole)
    assert len(raw) > 4 * 4096

    body = body_for("Describe a market at dawn.", max_tokens=192, ignore_eos=True)
    got, (status, h, raw) = join_midway(rt, body, 48)
    assert status == 200 and h.get("X-Cache") == "coalesced", raw[-300:]
    follower = sse_events(raw)
    assert follower[-1] == "[DONE]" and follower[-2]["usage"]["completion_tokens"] == 192
    leader_text = "".join(e["choices"][0]["text"] for e in sse_events(dechunk(got.partition(b"\r\n\r\n")[2]))
                          if e != "[DONE]" and e["choices"])
    assert "".join(e["choices"][0]["text"] for e in follower[:-2]) == leader_text
    assert rt.metrics()[overflows] == 0


def test_followers_finish_and_store_when_the_first_client_leaves(router, worker):
    body = body_for("Write a short note about patience.", max_tokens=64, ignore_eos=True)
    g0, c0 = generations(worker), router.metrics()["switchyard_router_coalesced_total"]
    cancelled0 = worker.metrics()[FINISHED + '{reason="cancelled"}']
    s0 = router.metrics()[STORES]
    leader, _ = open_stream(router, body)
    results = {}
    t = post_in_thread(router, body, results, "f")
    assert poll(lambda: router.metrics()["switchyard_router_coalesced_total"] == c0 + 1, 5)
    leader.close()  # the request that started the generation goes away; its follower still listens
    t.join(60)
    status, h, raw = results["f"]
    assert status == 200 and h.get("X-Cache") == "coalesced", raw
    j = json.loads(raw)
    assert j["usage"]["completion_tokens"] == 64
    assert generations(worker) == g0 + 1
    assert worker.metrics()[FINISHED + '{reason="cancelled"}'] == cancelled0
    assert poll(lambda: router.metrics()[STORES] == s0 + 1, 2)
    x, again = completion(router, body)
    assert x == "hit" and text_of(again) == j["choices"][0]["text"]


# ---- Redis sick ---------------------------------------------------------------------------------


def lookup_failures(m):
    return m[LOOKUPS + '{status="error"}'] + m[LOOKUPS + '{status="short_circuited"}']


def test_redis_killed_then_restarted(own_redis_router, worker):
    r, red = own_redis_router("--cache-lookup-timeout-ms", "5")
    body = body_for("Is the cache still there?")
    stored(r, body)
    assert completion(r, body)[0] == "hit"
    red.proc.kill()
    red.proc.wait()
    g0, f0 = generations(worker), lookup_failures(r.metrics())
    for i in range(8):  # the cached one and new ones: all served by the worker
        t0 = time.time()
        x, resp = completion(r, body if i % 2 == 0 else body_for(f"Redis is down, request {i}."), timeout=10)
        assert x is None and text_of(resp)
        assert time.time() - t0 < 2
    assert generations(worker, g0 + 8) == g0 + 8
    m = r.metrics()
    assert lookup_failures(m) >= f0 + 8
    assert m["switchyard_router_cache_store_failures_total"] >= 1
    # Redis comes back (empty): within a few seconds the breaker's probe finds it, and entries are
    # stored and served again.
    red.log.close()
    restarted = Redis(red.port)
    red.proc, red.log = restarted.proc, restarted.log
    assert poll(lambda: completion(r, body)[0] == "hit", timeout=15, every=0.25)


def test_redis_paused_lookups_time_out_fast(own_redis_router, worker):
    r, red = own_redis_router("--cache-lookup-timeout-ms", "5")
    body = body_for("Is Redis asleep?")
    stored(r, body)
    assert completion(r, body)[0] == "hit"
    f0 = lookup_failures(r.metrics())
    red.signal(signal.SIGSTOP)
    try:
        for i in range(4):
            t0 = time.time()
            x, resp = completion(r, body if i % 2 == 0 else body_for(f"Paused Redis, request {i}."), timeout=10)
            assert time.time() - t0 < 2, "a stopped Redis held the request up"
            assert x is None and text_of(resp)
        assert lookup_failures(r.metrics()) >= f0 + 4
        lat = r.metrics()
        assert lat["switchyard_router_cache_lookup_seconds_count"] >= 6
    finally:
        red.signal(signal.SIGCONT)
    assert poll(lambda: completion(r, body)[0] == "hit", timeout=15, every=0.25)


class DelayProxy:
    """A TCP proxy in front of Redis that holds each of Redis's replies `delay_s` before passing it
    on (settable while it runs): a Redis that answers, slowly, as an overloaded or swapping one does."""

    def __init__(self, target_port, delay_s):
        self.target_port, self.delay_s = target_port, delay_s
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}"
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.srv.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                client, _ = self.srv.accept()
            except OSError:
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src, dst, delayed):
        try:
            while not self.stopped.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if delayed and self.delay_s > 0:
                    time.sleep(self.delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self):
        self.stopped.set()
        self.srv.close()


def test_a_slow_redis_is_taken_off_the_request_path(worker, redis):
    """Redis answers, but each reply takes 100 ms (a proxy holds it: 20x the 5 ms lookup budget).
    Lookups have their own lane and a budget: they end as `error` (timed out), `expired` (waited
    past 4x the budget in the router) or `short_circuited` (the breaker), never as a wait, and the
    requests go to the worker: 24 cacheable requests at concurrency 8, all answered by a
    generation. Once Redis is fast again, hits come back."""
    proxy = DelayProxy(redis.port, 0.1)
    r = Router([worker.endpoint], *ROUTER_OPTS, "--redis", proxy.url, "--cache-lookup-timeout-ms", "5")
    try:
        body = body_for("Slow Redis, fast answers.")
        before = r.metrics()
        g0 = generations(worker)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda i: completion(r, body if i % 2 else body_for(f"Slow Redis {i}."), timeout=60),
                                 range(24)))
        # None answered from the cache (a repeat may join a running generation of its prompt).
        assert all(x in (None, "coalesced") and text_of(resp) for x, resp in outs), [x for x, _ in outs]
        m = r.metrics()
        slow = sum(m[LOOKUPS + '{status="%s"}' % k] - before[LOOKUPS + '{status="%s"}' % k]
                   for k in ("error", "expired", "short_circuited"))
        assert slow == 24, {k: v for k, v in m.items() if k.startswith(LOOKUPS)}
        # The 12 repeats of one prompt coalesce or run; the 12 distinct ones each run.
        assert generations(worker) - g0 >= 13
        proxy.delay_s = 0
        assert poll(lambda: completion(r, body)[0] == "hit", timeout=20, every=0.25)
    finally:
        r.stop()
        proxy.stop()


# ---- analytics ----------------------------------------------------------------------------------


def test_cache_stats_match_the_workload(own_redis_router, worker):
    r, _ = own_redis_router()
    a = body_for("How do I reset my password?")
    b = body_for("How do I delete my account?", max_tokens=48, ignore_eos=True)
    seen = {"hit": 0, "miss": 0, "coalesced": 0, "bypass": 0}
    assert stored(r, a)[0] is None
    seen["miss"] += 1
    for _ in range(2):
        assert completion(r, a)[0] == "hit"
        seen["hit"] += 1
    completion(r, dict(a, temperature=0.8))
    completion(r, a, headers={"Cache-Control": "no-store"})
    completion(r, a, headers={"Cache-Control": "no-cache"})  # generated and stored, but not looked up
    seen["bypass"] += 3
    kinds, barrier = [], threading.Barrier(4)

    def one():
        barrier.wait()
        kinds.append(completion(r, b)[0])

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    seen["miss"] += kinds.count(None)
    seen["hit"] += kinds.count("hit")
    seen["coalesced"] += kinds.count("coalesced")
    assert len(kinds) == 4 and kinds.count(None) == 1

    def totals():
        status, _, raw = r.get("/v1/cache/stats")  # open router: everyone is admin
        assert status == 200, raw
        s = json.loads(raw)
        assert s["complete"] is True
        return s

    s = poll(lambda: (lambda s: s if all(s["totals"][k] == v for k, v in seen.items()) else None)(totals()), 3)
    assert s, (totals()["totals"], seen)
    t = s["totals"]
    assert t["requests"] == sum(seen.values())
    assert t["hit_rate"] == pytest.approx(seen["hit"] / t["requests"])
    assert t["served_from_cache_rate"] == pytest.approx((seen["hit"] + seen["coalesced"]) / t["requests"])
    assert t["tokens_saved"] > 0
    assert s["by_tenant"]["default"]["hit"] == seen["hit"]
    assert s["by_model"][MODEL_ID]["miss"] == seen["miss"]
    assert sum(s["hit_age"].values()) == seen["hit"] and s["hit_age"]["<1m"] == seen["hit"]
    assert sum(p["requests"] for p in s["series"]) == t["requests"]
    top = s["top_prompts"]
    assert top and top[0]["count"] == 4 and all("preview" not in p for p in top)  # previews off by default
    m = r.metrics()
    assert m[LOOKUPS + '{status="hit"}'] == seen["hit"]
    assert r.get("/v1/cache/stats?from=10&to=5")[0] == 400
