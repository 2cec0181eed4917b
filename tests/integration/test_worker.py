"""A real switchyard-worker process driven over ZeroMQ like a router drives it: concurrent
streaming, cancel, drain, deadlines, malformed frames, metrics. Needs the model (deploy/setup.sh)."""
import re
import time

import msgpack
import pytest

from support import needs_model
from worker_client import MODEL, Client, Worker, tokenize

pytestmark = needs_model

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "How do I register an account?",
             "List three prime numbers.", "Explain what a CPU cache is.", "Why is the sky blue?"]


@pytest.fixture(scope="module")
def worker():
    w = Worker("--kv-blocks", "192", "--max-running", "16")
    yield w
    assert w.stop() == 0  # SIGTERM drains and exits cleanly


@pytest.fixture(scope="module")
def prompts():
    return {q: tokenize(q) for q in QUESTIONS}


@pytest.fixture
def client(worker):
    c = Client(worker.endpoint)
    typ, body = c.hello()
    assert typ == "welcome"
    yield c
    c.close()


def wait_idle(worker, timeout=10):
    """Until the worker reports no running or waiting request and every KV block available."""
    end = time.time() + timeout
    while time.time() < end:
        m = worker.metrics()
        if (m["switchyard_worker_requests_running"] == 0 and m["switchyard_worker_requests_waiting"] == 0
                and m["switchyard_worker_kv_blocks_free"] == m["switchyard_worker_kv_blocks_total"]):
            return m
        time.sleep(0.2)
    raise AssertionError(f"worker not idle: {m}")


def test_welcome_carries_model_and_tokenizer(worker):
    c = Client(worker.endpoint)
    typ, body = c.hello()
    assert typ == "welcome"
    assert body["version"] == 1
    assert body["model_id"] == "SmolLM2-135M-Instruct.Q4_1"
    assert body["kv_capacity_tokens"] == 192 * 16
    tok = body["tokenizer"]
    assert tok["model"] == "gpt2" and tok["pre"] == "smollm"
    assert len(tok["tokens"]) == 49152 and len(tok["merges"]) == 48900
    assert "<|im_start|>" in tok["chat_template"]
    typ, hb = c.recv()  # a heartbeat follows at once
    assert typ == "heartbeat" and hb["total_kv_blocks"] == 192
    c.close()


def test_version_mismatch_is_refused(worker):
    c = Client(worker.endpoint)
    typ, body = c.hello(version=99)
    assert typ == "error" and body["code"] == "unknown_version"
    c.close()


def test_concurrent_streams_match_non_streamed_results(client, prompts, worker):
    for i, q in enumerate(QUESTIONS):
        client.submit(f"s{i}", prompts[q], max_tokens=24)
    streamed = client.collect([f"s{i}" for i in range(len(QUESTIONS))])
    for i, q in enumerate(QUESTIONS):
        client.submit(f"n{i}", prompts[q], max_tokens=24, stream=False)
    whole = client.collect([f"n{i}" for i in range(len(QUESTIONS))])
    for i, q in enumerate(QUESTIONS):
        s, n = streamed[f"s{i}"], whole[f"n{i}"]
        assert s["finish"] in ("stop", "length") and s["error"] is None
        assert s["messages"] > 1 or s["usage"]["completion_tokens"] <= 1  # really streamed
        assert n["messages"] == 1                                         # one final message
        assert s["text"] == n["text"] and s["tokens"] == n["tokens"]
        assert s["usage"]["prompt_tokens"] == len(prompts[q])
        # Every sampled token is a completion token and is sent, the end token too (docs/worker.md).
        assert s["usage"]["completion_tokens"] == len(s["tokens"])
    assert "Paris" in streamed["s0"]["text"]
    # The second round found the prompts in the prefix cache.
    assert all(whole[f"n{i}"]["usage"]["cached_prompt_tokens"] >= 16 for i in range(len(QUESTIONS)))
    wait_idle(worker)


def test_the_last_frame_names_the_stop_string_that_ended_it(client, prompts, worker):
    q = QUESTIONS[0]
    client.submit("plain", prompts[q], max_tokens=24)
    full = client.collect(["plain"])["plain"]["text"]
    words = full.split()
    assert len(words) >= 4, full
    stops = ["zzqqxx", words[3]]
    client.submit("stopped", prompts[q], max_tokens=24, stop=stops)
    client.submit("unmatched", prompts[q], max_tokens=24, stop=["zzqqxx"])
    got = client.collect(["stopped", "unmatched"])
    assert got["stopped"]["finish"] == "stop" and got["stopped"]["stop"] == words[3]
    assert got["stopped"]["text"] == full[:full.index(words[3])]
    assert got["unmatched"]["stop"] == "" and got["unmatched"]["text"] == full
    wait_idle(worker)


def test_cancel_mid_stream_frees_blocks(client, prompts, worker):
    client.submit("long", prompts[QUESTIONS[4]], max_tokens=1500, ignore_eos=True)
    typ, body = client.recv()
    while typ != "tokens":
        typ, body = client.recv()
    assert body["request_id"] == "long" and not body["finish_reason"]
    end = time.time() + 5  # the metrics snapshot follows the step that sent the tokens
    while worker.metrics()["switchyard_worker_kv_blocks_free"] == 192 and time.time() < end:
        time.sleep(0.05)
    assert worker.metrics()["switchyard_worker_kv_blocks_free"] < 192  # the stream holds blocks
    client.send("cancel", {"request_id": "long"})
    r = client.collect(["long"])["long"]
    assert r["finish"] == "cancelled"
    m = wait_idle(worker)
    assert m['switchyard_worker_requests_finished_total{reason="cancelled"}'] >= 1


def test_duplicate_live_request_id_is_rejected(client, prompts, worker):
    client.submit("dup", prompts[QUESTIONS[0]], max_tokens=200, ignore_eos=True)
    client.submit("dup", prompts[QUESTIONS[1]], max_tokens=5)
    typ, body = client.recv()
    while not (typ == "error" or (typ == "tokens" and body.get("finish_reason"))):
        typ, body = client.recv()
    assert typ == "error" and body["code"] == "duplicate_request" and body["request_id"] == "dup"
    client.send("cancel", {"request_id": "dup"})
    assert client.collect(["dup"])["dup"]["finish"] == "cancelled"
    wait_idle(worker)


def test_bad_requests_get_specific_errors_and_the_worker_keeps_serving(client, prompts, worker):
    cases = {
        "oov": ([1, 2, 10**6], {}, "invalid_request", "vocabulary"),
        "empty": ([], {}, "invalid_request", "prompt"),
        "toolong": (prompts[QUESTIONS[0]] * 60, {}, "invalid_request", "context"),
        "hugebudget": (prompts[QUESTIONS[0]], {"budget_ms": 2**40}, "invalid_request", "budget_ms"),
        "negmax": (prompts[QUESTIONS[0]], {"max_tokens": -5}, "invalid_request", "max_tokens"),
    }
    for rid, (prompt, extra, code, word) in cases.items():
        max_tokens = extra.pop("max_tokens", 8)
        client.submit(rid, prompt, max_tokens=max_tokens, **extra)
    got = client.collect(list(cases))
    for rid, (_, _, code, word) in cases.items():
        err = got[rid]["error"]
        assert err is not None, rid
        assert err["code"] == code, (rid, err)
        assert word in err["message"], (rid, err)
    # Malformed frames: garbage body, unknown type, wrong frame count, wrong field type.
    client.send_raw([b"submit", b"\xc1\xff garbage"])
    client.send_raw([b"launch", msgpack.packb({})])
    client.send_raw([b"submit"])
    client.send("submit", {"request_id": "typed", "prompt": "not a list"})
    codes = []
    for _ in range(4):
        typ, body = client.recv()
        while typ == "heartbeat":
            typ, body = client.recv()
        assert typ == "error"
        codes.append(body["code"])
    assert codes.count("bad_message") + codes.count("invalid_request") == 4
    client.submit("after", prompts[QUESTIONS[0]], max_tokens=8)
    assert client.collect(["after"])["after"]["finish"] in ("stop", "length")
    m = worker.metrics()
    assert m["switchyard_worker_messages_bad_total"] >= 3
    assert m["switchyard_worker_link_malformed_envelopes_total"] >= 1  # the one-frame message


def test_deadline_ends_a_long_generation(client, prompts, worker):
    client.submit("dl", prompts[QUESTIONS[2]], max_tokens=1500, ignore_eos=True,
                  budget_ms=400)
    r = client.collect(["dl"], timeout=60)["dl"]
    assert r["finish"] == "deadline"
    wait_idle(worker)


def test_router_identities_are_separate_namespaces(worker, prompts):
    a, b = Client(worker.endpoint, b"router-a"), Client(worker.endpoint, b"router-b")
    a.hello(), b.hello()
    a.submit("same", prompts[QUESTIONS[0]], max_tokens=6)
    b.submit("same", prompts[QUESTIONS[3]], max_tokens=6)
    ra, rb = a.collect(["same"])["same"], b.collect(["same"])["same"]
    assert ra["error"] is None and rb["error"] is None
    assert ra["tokens"] != rb["tokens"]
    a.close(), b.close()


def test_drain_finishes_running_work_and_refuses_new(prompts):
    w = Worker("--kv-blocks", "64")
    c = Client(w.endpoint)
    c.hello()
    c.submit("running", prompts[QUESTIONS[0]], max_tokens=40, ignore_eos=True)
    c.send("drain", {"reason": "test"})
    c.submit("late", prompts[QUESTIONS[1]], max_tokens=4)
    r = c.collect(["running", "late"])
    assert r["running"]["finish"] == "length" and len(r["running"]["tokens"]) == 40
    assert r["late"]["error"]["code"] == "overloaded"
    c.close()
    assert w.stop() == 0


def test_a_vanished_router_has_its_requests_cancelled(worker, prompts):
    """A router that disappears mid-stream: the worker's next send to it fails (ROUTER_MANDATORY),
    its requests are cancelled and their KV blocks return to the pool."""
    c = Client(worker.endpoint, b"router-gone")
    c.hello()
    c.submit("orphan", prompts[QUESTIONS[4]], max_tokens=1500, ignore_eos=True)
    typ, body = c.recv()
    while typ != "tokens":
        typ, body = c.recv()
    before = worker.metrics()['switchyard_worker_requests_finished_total{reason="cancelled"}']
    c.close()
    end = time.time() + 20
    while time.time() < end:
        m = worker.metrics()
        if m['switchyard_worker_requests_finished_total{reason="cancelled"}'] > before:
            break
        time.sleep(0.2)
    assert m['switchyard_worker_requests_finished_total{reason="cancelled"}'] == before + 1
    assert m["switchyard_worker_link_unreachable_total"] >= 1
    wait_idle(worker)


def test_kv_cache_sized_by_a_fraction_of_free_memory_and_bad_flags_refused():
    w = Worker("--kv-memory-fraction", "0.01")
    c = Client(w.endpoint)
    typ, body = c.hello()
    c.close()
    assert w.stop() == 0
    # 1 % of this machine's free memory at 46 KiB per 16-token f16 block: thousands of tokens.
    assert typ == "welcome" and body["kv_capacity_tokens"] >= 16 * 100
    import subprocess
    from worker_client import WORKER
    for bad in (["--kv-memory-fraction", "2"], ["--kv-type", "q3"], ["--bogus", "1"]):
        p = subprocess.run([WORKER, "serve", "--model", MODEL, "--metrics-port", "-1", *bad],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0
        assert "error" in p.stderr and bad[0].lstrip("-") in p.stderr


def test_resident_prompt_panels_give_the_same_tokens_and_a_bad_value_is_refused(client, prompts):
    """--prompt-panels resident keeps the prompt GEMM's bf16 panels built once: the same panels,
    so greedy output is the same token for token as a worker that builds them every step."""
    w = Worker("--kv-blocks", "64", "--prompt-panels", "resident")
    c = Client(w.endpoint)
    try:
        assert c.hello()[0] == "welcome"
        for i, q in enumerate(QUESTIONS[:2]):
            c.submit(f"r{i}", prompts[q], max_tokens=16, stream=False)
            client.submit(f"p{i}", prompts[q], max_tokens=16, stream=False)
        resident = c.collect([f"r{i}" for i in range(2)])
        per_step = client.collect([f"p{i}" for i in range(2)])
        for i in range(2):
            assert resident[f"r{i}"]["error"] is None and resident[f"r{i}"]["tokens"]
            assert resident[f"r{i}"]["tokens"] == per_step[f"p{i}"]["tokens"]
    finally:
        c.close()
        assert w.stop() == 0
    import subprocess
    from worker_client import WORKER
    p = subprocess.run([WORKER, "serve", "--model", MODEL, "--metrics-port", "-1", "--prompt-panels", "always"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--prompt-panels must be per-step, resident or integer" in p.stderr


def test_integer_prompt_panels_answer_and_say_where_they_apply(client, prompts):
    """--prompt-panels integer puts the prompt tokens of Q4_0..Q8_0 layers on the integer kernel
    where the CPU runs it (AVX-512 VNNI without AMX): the worker says in how many layers, and
    answers every request (its tokens may differ from the bf16 prompt path's: 8-bit activations)."""
    w = Worker("--kv-blocks", "64", "--prompt-panels", "integer")
    c = Client(w.endpoint)
    try:
        assert c.hello()[0] == "welcome"
        for i, q in enumerate(QUESTIONS[:2]):
            c.submit(f"r{i}", prompts[q], max_tokens=16, stream=False)
        got = c.collect([f"r{i}" for i in range(2)])
        for i in range(2):
            assert got[f"r{i}"]["error"] is None and len(got[f"r{i}"]["tokens"]) > 0
    finally:
        c.close()
        assert w.stop() == 0
    assert re.search(r"prompt tokens on the integer kernel in \d+ layers", w.log())
