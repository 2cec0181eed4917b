"""Request tracing end to end (docs/router.md, "Tracing"): a tiny OTLP/HTTP receiver in the test
(http.server collecting POST /v1/traces JSON), a router with --otlp-endpoint pointing at it, and the
real SmolLM2 worker. A chat request with a traceparent: its spans arrive in the client's trace, the
server span's parent is the client's span, queue/prefill/decode are its children in time order
within it, attributes present. Without a traceparent, or with a malformed one: a new trace. The
receiver down: requests still succeed and switchyard_router_trace_spans_dropped_total rises.
With a real redis-server (--redis) and a tenants file: a cache hit's server span and its lookup
child, a coalesced pair linked to the leader's trace, and refusals (a 429 from a tenant's rate, a
validation 400) as server spans with their status and error code. Failures after admission (a
queue timeout, a worker's error) end the server span and the phase they ended in with ERROR.
"""
import http.server
import json
import re
import shutil
import threading
import time

import pytest

from cluster import MODEL_ID, Redis, Router
from support import needs_model
from worker_client import Worker, free_port

pytestmark = needs_model

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        "temperature": 0}


class Receiver:
    """An OTLP/HTTP JSON collector: every span it was sent, by trace id."""

    def __init__(self, port):
        self.spans = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/json"
                if ok:
                    doc = json.loads(body)
                    with outer.lock:
                        for rs in doc["resourceSpans"]:
                            service = rs["resource"]["attributes"][0]["value"]["stringValue"]
                            for ss in rs["scopeSpans"]:
                                for s in ss["spans"]:
                                    outer.spans.append(dict(s, service=service))
                self.send_response(200 if ok else 400)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.port = port
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def trace(self, trace_id, n, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                got = [s for s in self.spans if s["traceId"] == trace_id]
            if len(got) >= n:
                return got
            time.sleep(0.1)
        raise AssertionError(f"{len(got)} spans of trace {trace_id} arrived, wanted {n}: {self.spans}")

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def worker():
    w = Worker("--max-context", "256")
    yield w
    w.stop()


@pytest.fixture(scope="module")
def receiver():
    rx = Receiver(free_port())
    yield rx
    rx.stop()


def otlp_opts(rx):
    return ("--otlp-endpoint", f"http://127.0.0.1:{rx.port}/v1/traces", "--otlp-service-name", "sy-test")


@pytest.fixture(scope="module")
def cluster(worker, receiver):
    r = Router([worker.endpoint], *otlp_opts(receiver))
    yield r, receiver
    r.stop()


@pytest.fixture(scope="module")
def cached(worker, receiver, tmp_path_factory):
    """A router with the response cache on a real Redis, and tenants: `sk-ops` unlimited, `sk-slow`
    one request then 0.2 a second."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    path = tmp_path_factory.mktemp("tenants") / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"name": "ops", "keys": ["sk-ops"], "admin": True},
                                            {"name": "slow", "keys": ["sk-slow"], "requests_per_s": 0.2,
                                             "burst": 1}]}))
    red = Redis()
    r = Router([worker.endpoint], *otlp_opts(receiver), "--redis", red.url, "--tenants", str(path),
               "--heartbeat-timeout-ms", "15000", admin_key="sk-ops")
    yield r, receiver
    r.stop()
    red.stop()


def attrs(span):
    return {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}


def test_client_trace_is_continued_with_phase_children(cluster):
    r, rx = cluster
    status, _, body = r.post("/v1/chat/completions", CHAT, headers={"traceparent": f"00-{TRACE}-{PARENT}-01",
                                                                     "tracestate": "vendor=x"})
    assert status == 200, body
    spans = rx.trace(TRACE, 4)
    by_name = {s["name"]: s for s in spans}
    server = by_name["POST /v1/chat/completions"]
    assert server["kind"] == 2 and server["parentSpanId"] == PARENT and server["service"] == "sy-test"
    assert re.fullmatch("[0-9a-f]{16}", server["spanId"])
    a = attrs(server)
    assert a["gen_ai.request.model"] == MODEL_ID
    assert a["http.response.status_code"] == "200"  # int64 as a string (OTLP JSON)
    assert int(a["gen_ai.usage.input_tokens"]) > 0 and int(a["gen_ai.usage.output_tokens"]) > 0
    assert a["switchyard.cache_hit"] is False and "switchyard.tenant" in a
    assert a["w3c.tracestate"] == "vendor=x"
    assert server["status"] == {}
    start, end = int(server["startTimeUnixNano"]), int(server["endTimeUnixNano"])
    assert isinstance(server["startTimeUnixNano"], str) and start <= end
    assert abs(start / 1e9 - time.time()) < 60
    t = start
    for name in ("queue", "prefill", "decode"):
        c = by_name[name]
        assert c["kind"] == 1 and c["parentSpanId"] == server["spanId"], c
        cs, ce = int(c["startTimeUnixNano"]), int(c["endTimeUnixNano"])
        assert t <= cs <= ce <= end, (name, t, cs, ce, end)
        t = ce


def test_without_or_with_malformed_traceparent_a_new_trace_starts(cluster):
    r, rx = cluster
    for headers in ({}, {"traceparent": f"ff-{TRACE}-{PARENT}-01"}, {"traceparent": f"00-{'0' * 32}-{PARENT}-01"},
                    {"traceparent": "garbage"}):
        with rx.lock:
            before = {s["traceId"] for s in rx.spans}
        status, _, body = r.post("/v1/chat/completions", CHAT, headers=headers)
        assert status == 200, (headers, body)  # never an error
        deadline = time.time() + 15
        new = set()
        while time.time() < deadline and not new:
            with rx.lock:
                new = {s["traceId"] for s in rx.spans} - before
            time.sleep(0.1)
        assert len(new) == 1, (headers, new)
        (trace_id,) = new
        assert re.fullmatch("[0-9a-f]{32}", trace_id) and trace_id not in (TRACE, "0" * 32)
        server = [s for s in rx.trace(trace_id, 4) if s["kind"] == 2][0]
        assert "parentSpanId" not in server  # a root span


def test_unsampled_client_trace_is_not_exported(cluster):
    r, rx = cluster
    trace = "a" * 31 + "1"
    status, _, _ = r.post("/v1/chat/completions", CHAT, headers={"traceparent": f"00-{trace}-{PARENT}-00"})
    assert status == 200
    time.sleep(2.5)  # two export intervals
    with rx.lock:
        assert not [s for s in rx.spans if s["traceId"] == trace]


def test_collector_down_fails_no_request_and_counts_drops():
    w = Worker("--max-context", "256")
    r = Router([w.endpoint], "--otlp-endpoint", f"http://127.0.0.1:{free_port()}/v1/traces")  # nobody listens
    try:
        for _ in range(3):
            status, _, body = r.post("/v1/chat/completions", CHAT)
            assert status == 200, body
        deadline = time.time() + 15
        dropped = 0
        while time.time() < deadline and dropped < 12:
            dropped = r.metrics().get("switchyard_router_trace_spans_dropped_total", 0)
            time.sleep(0.2)
        assert dropped >= 12  # 3 requests x 4 spans
    finally:
        r.stop()
        w.stop()


OPS = {"Authorization": "Bearer sk-ops"}


def traceparent(trace):
    return {"traceparent": f"00-{trace}-{PARENT}-01"}


def server_span(rx, trace, n=1):
    spans = rx.trace(trace, n)
    (server,) = [s for s in spans if s["kind"] == 2]
    return server, [s for s in spans if s["kind"] == 1]


def test_cache_hit_has_its_server_span_and_lookup_child(cached):
    r, rx = cached
    body = dict(CHAT, messages=[{"role": "user", "content": "Trace the cache, please."}])
    miss = "c" * 31 + "1"
    status, h, raw = r.post("/v1/chat/completions", body, headers=dict(OPS, **traceparent(miss)))
    assert status == 200 and h.get("X-Cache") is None, raw
    server, children = server_span(rx, miss, 5)
    assert attrs(server)["switchyard.cache"] == "miss" and attrs(server)["switchyard.cache_hit"] is False
    names = [c["name"] for c in sorted(children, key=lambda c: int(c["startTimeUnixNano"]))]
    assert names == ["cache.lookup", "queue", "prefill", "decode"], names
    for i in range(50):  # the store is asynchronous: a fresh trace per try
        hit = f"{'c' * 28}{i + 2:04d}"
        status, h, raw = r.post("/v1/chat/completions", body, headers=dict(OPS, **traceparent(hit)))
        assert status == 200, raw
        if h.get("X-Cache") == "hit":
            break
        time.sleep(0.2)
    assert h.get("X-Cache") == "hit"
    server, children = server_span(rx, hit, 2)
    a = attrs(server)
    assert a["switchyard.cache"] == "hit" and a["switchyard.cache_hit"] is True, a
    assert a["http.response.status_code"] == "200" and int(a["gen_ai.usage.output_tokens"]) > 0
    assert server["parentSpanId"] == PARENT and server["status"] == {}
    lookups = [c for c in children if c["name"] == "cache.lookup" and attrs(c)["switchyard.cache"] == "hit"]
    assert len(lookups) == 1 and lookups[0]["parentSpanId"] == server["spanId"]
    ls, le = int(lookups[0]["startTimeUnixNano"]), int(lookups[0]["endTimeUnixNano"])
    assert int(server["startTimeUnixNano"]) <= ls <= le <= int(server["endTimeUnixNano"])
    assert not [c for c in children if c["name"] in ("queue", "prefill", "decode")]


def test_coalesced_clients_have_server_spans_linked_to_the_leader(cached):
    r, rx = cached
    # Long enough that the others arrive while the first generates; no-cache: no earlier answer.
    body = {"model": MODEL_ID, "prompt": "Coalesce these traces, one paragraph.", "max_tokens": 64,
            "ignore_eos": True, "temperature": 0}
    traces = [f"{'d' * 31}{i}" for i in range(4)]
    results, barrier = {}, threading.Barrier(len(traces))

    def one(trace):
        barrier.wait()
        status, h, raw = r.post("/v1/completions", body, timeout=120,
                                headers=dict(OPS, **traceparent(trace), **{"Cache-Control": "no-cache"}))
        results[trace] = (status, h.get("X-Cache"), raw)

    threads = [threading.Thread(target=one, args=(t,)) for t in traces]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(s == 200 for s, _, _ in results.values()), results
    coalesced = [t for t, (_, x, _) in results.items() if x == "coalesced"]
    assert coalesced, [x for _, x, _ in results.values()]
    for trace in coalesced:
        server, children = server_span(rx, trace)
        a = attrs(server)
        assert a["switchyard.coalesced"] is True and a["http.response.status_code"] == "200", a
        leader = a["switchyard.coalesced.trace_id"]
        assert leader in traces and leader not in coalesced and results[leader][1] is None
        (link,) = server["links"]
        lead_server, lead_children = server_span(rx, leader, 4)
        assert link == {"traceId": leader, "spanId": lead_server["spanId"]}
        assert "switchyard.coalesced" not in attrs(lead_server)
        assert not [c for c in children if c["name"] in ("queue", "prefill", "decode")]
        assert {"queue", "prefill", "decode"} <= {c["name"] for c in lead_children}


def test_refusals_before_admission_have_server_spans(cached):
    r, rx = cached
    slow = {"Authorization": "Bearer sk-slow"}
    # A validation 400 (charged to the tenant's one-request burst at its header), then a 429 from
    # the tenant's requests/s, answered from the header alone.
    bad, limited = "e" * 31 + "1", "e" * 31 + "2"
    for trace, body, status, tenant in ((bad, dict(CHAT, max_tokens=-5), 400, "slow"),
                                        (limited, CHAT, 429, "slow")):
        got, _, raw = r.post("/v1/chat/completions", body, headers=dict(slow, **traceparent(trace)))
        assert got == status, raw
        err = json.loads(raw)["error"]
        server, children = server_span(rx, trace)
        a = attrs(server)
        assert server["name"] == "POST /v1/chat/completions" and server["parentSpanId"] == PARENT
        assert a["http.response.status_code"] == str(status), a
        assert a["error.type"] == (err.get("code") or err["message"]) and a["switchyard.tenant"] == tenant, (a, err)
        assert server["status"] == {"code": 2, "message": a["error.type"]}
        assert int(server["startTimeUnixNano"]) <= int(server["endTimeUnixNano"])
        assert children == []
    assert attrs(server_span(rx, limited)[0])["error.type"] == "tenant_rate"
    # Unsampled: refused, and never exported.
    quiet = "e" * 31 + "3"
    got, _, _ = r.post("/v1/chat/completions", CHAT, headers=dict(slow, traceparent=f"00-{quiet}-{PARENT}-00"))
    assert got == 429
    time.sleep(2.5)  # two export intervals
    with rx.lock:
        assert not [s for s in rx.spans if s["traceId"] == quiet]


def error_spans(rx, trace, n, status, code, phase):
    """The server span and the phase span `phase` of a request that ended with `status`: both
    ERROR with the error code; the server span says the status."""
    server, children = server_span(rx, trace, n)
    a = attrs(server)
    assert a["http.response.status_code"] == str(status) and a["error.type"] == code, a
    assert server["status"] == {"code": 2, "message": code}
    (ended,) = [c for c in children if c["name"] == phase]
    assert ended["status"].get("code") == 2, ended
    assert all(c["parentSpanId"] == server["spanId"] for c in children)
    return server, children


def test_errors_after_admission_have_error_spans(receiver):
    """Failures after admission are traced like refusals: a queue timeout (408, still queued) ends
    its server span and its queue span with ERROR; a worker's failure (502, after dispatch) its
    server span and its prefill span."""
    slow = Worker("--kv-blocks", "128", "--max-running", "1", "--fault-inject", "slow-step:25")
    broken = Worker("--fault-inject", "step-throw")
    rs = Router([slow.endpoint], *otlp_opts(receiver), "--local-queue", "0", "--queue-timeout-s", "0.5")
    rb = Router([broken.endpoint], *otlp_opts(receiver), "--max-attempts", "1")
    try:
        hold = threading.Thread(target=rs.post, args=("/v1/completions", {
            "model": MODEL_ID, "prompt": "Tell me a long story.", "max_tokens": 120, "ignore_eos": True}),
            kwargs={"timeout": 300})
        hold.start()
        deadline = time.time() + 60
        while rs.metrics().get(f'switchyard_router_active_requests{{model="{MODEL_ID}"}}', 0) < 1:
            assert time.time() < deadline, "the slow request never arrived"
            time.sleep(0.05)
        waited = "f" * 31 + "1"
        status, _, raw = rs.post("/v1/chat/completions", CHAT, headers=traceparent(waited))
        assert status == 408 and json.loads(raw)["error"]["code"] == "queue_timeout", raw
        _, children = error_spans(receiver, waited, 2, 408, "queue_timeout", "queue")
        assert [c["name"] for c in children] == ["queue"]  # never dispatched: no prefill, no decode
        failed = "f" * 31 + "2"
        status, _, raw = rb.post("/v1/chat/completions", CHAT, headers=traceparent(failed))
        assert status == 502, raw
        code = json.loads(raw)["error"]["code"]
        _, children = error_spans(receiver, failed, 3, 502, code, "prefill")
        assert {c["name"] for c in children} == {"queue", "prefill"}
        hold.join(300)
    finally:
        rs.stop()
        rb.stop()
        slow.stop()
        broken.stop()
