"""Clients that stop reading, and work refused before it is done (docs/reliability.md, "Clients"),
with real router and worker processes over real sockets.

* 200 streams whose clients stop reading after the response headers: each is closed within the
  write-stall timeout, its request cancelled on the worker (KV back to all free), and the
  router's resident memory stays bounded while they hang.
* A tenant limited to 1 request/s that floods the router with ~1 MB prompts is refused from the
  request header (no body read, nothing parsed or tokenized), while another tenant's streams
  run to the end.
"""
import json
import socket
import statistics
import threading
import time

from cluster import MODEL_ID, ROUTER_SANITIZED, Router
from http_load import rss_bytes
from support import require_model, wait_for
from worker_client import Worker

require_model()


def rss_mb(pid):
    return rss_bytes(pid) / (1 << 20)


def post_head(path, body_len, key=None, expect=False):
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {body_len}\r\n")
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    if expect:
        head += "Expect: 100-continue\r\n"
    return (head + "\r\n").encode()


def test_two_hundred_streams_that_stop_reading_are_closed_and_their_kv_freed():
    w = Worker("--kv-blocks", "512", "--max-running", "32")
    # 200 x 1500 tokens queued: on a slow or shared machine the queue-wait estimate passes the
    # default 600 s deadline and admission refuses the latest with 503 deadline; a long deadline
    # keeps every stream admitted, which is what this test is about.
    r = Router([w.endpoint], "--write-stall-timeout-s", "2", "--request-timeout-s", "7200")
    socks = []
    try:
        body = json.dumps({"model": MODEL_ID, "prompt": "Tell me a long story about the sea.", "max_tokens": 1500,
                           "ignore_eos": True, "stream": True}).encode()
        req = post_head("/v1/completions", len(body)) + body
        base_rss = rss_mb(r.proc.pid)
        for _ in range(200):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # the window closes after ~2 KB
            s.settimeout(30)
            s.connect(("127.0.0.1", r.port))
            s.sendall(req)
            socks.append(s)
        heads, others = 0, []
        for s in socks:  # read the response headers, then never read again
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = s.recv(1)
                if not chunk:
                    break
                got += chunk
            heads += got.startswith(b"HTTP/1.1 200")
            if not got.startswith(b"HTTP/1.1 200"):
                others.append(got[:300])
        assert heads == 200, others[:3]
        peak_rss = base_rss

        def all_closed():
            nonlocal peak_rss
            peak_rss = max(peak_rss, rss_mb(r.proc.pid))
            m = r.metrics()
            return m["switchyard_router_http_write_stalls_total"] >= 200 and \
                m[f'switchyard_router_active_requests{{model="{MODEL_ID}"}}'] == 0

        wait_for("all 200 stalled streams closed and cancelled", all_closed, timeout=120, every=0.2)
        m = r.metrics()
        assert m["switchyard_router_http_write_stalls_total"] == 200
        assert m["switchyard_router_client_cancels_total"] == 200

        def worker_idle():
            wm = w.metrics()
            return wm["switchyard_worker_requests_running"] == 0 and wm["switchyard_worker_requests_waiting"] == 0 \
                and wm["switchyard_worker_kv_blocks_free"] == wm["switchyard_worker_kv_blocks_total"]

        wait_for("the worker idle with every KV block free", worker_idle, timeout=20, every=0.2)
        assert w.metrics()['switchyard_worker_requests_finished_total{reason="cancelled"}'] == 200
        print(f"router RSS {base_rss:.0f} MB before, peak {peak_rss:.0f} MB while 200 clients hung")
        if ROUTER_SANITIZED:
            print("router RSS bound not checked: a sanitizer build (cluster.py)")
        else:
            assert peak_rss < base_rss + 64
        # Each closed socket reads as ended (FIN or reset) once its unread bytes are consumed.
        ended = 0
        for s in socks:
            s.settimeout(5)
            try:
                while s.recv(65536):
                    pass
                ended += 1
            except (ConnectionResetError, socket.timeout):
                ended += 1
        assert ended == 200
        assert r.get("/health")[0] == 200
    finally:
        for s in socks:
            s.close()
        r.stop()
        w.stop()


def big_prompt_request(port, key, prompt_bytes, results):
    """One ~1 MB completions request sent the way curl sends large bodies (Expect: 100-continue):
    the body goes only after the server asked for it. Records (status, code, body_sent)."""
    body = json.dumps({"model": MODEL_ID, "prompt": "word " * (prompt_bytes // 5), "max_tokens": 1}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(post_head("/v1/completions", len(body), key, expect=True))
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                results.append((0, "", False))
                return
            got += chunk
        sent = False
        if got.startswith(b"HTTP/1.1 100"):
            got = got[got.index(b"\r\n\r\n") + 4:]
            s.sendall(body)
            sent = True
            while b"\r\n\r\n" not in got:
                got += s.recv(4096)
        head, _, rest = got.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        length = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        code = json.loads(rest[:length]).get("error", {}).get("code", "")
        results.append((status, code, sent))
    finally:
        s.close()


def stream_itl(router, key, out):
    body = json.dumps({"model": MODEL_ID, "prompt": "Write a poem about mountains.", "max_tokens": 48,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
    s = socket.create_connection(("127.0.0.1", router.port), timeout=60)
    s.sendall(post_head("/v1/completions", len(body), key) + body)
    buf, stamps, seen = b"", [], 0
    while b"data: [DONE]" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        events = buf.count(b"\n\n\r\n")  # complete events so far (each is one chunk)
        stamps.extend([time.time()] * (events - seen))
        seen = events
    s.close()
    tokens = 0
    for part in buf.split(b"data: ")[1:]:
        data = part.split(b"\n\n")[0]
        if data != b"[DONE]" and json.loads(data).get("usage"):
            tokens = json.loads(data)["usage"]["completion_tokens"]
    out.append((buf.startswith(b"HTTP/1.1 200"), tokens, stamps))


def test_a_rate_limited_tenant_flooding_big_prompts_is_refused_at_the_header(tmp_path):
    cfg = {"tenants": [{"name": "bulk", "keys": ["sk-bulk"], "requests_per_s": 1, "burst": 1},
                       {"name": "app", "keys": ["sk-app"]}, {"name": "ops", "keys": ["sk-ops"], "admin": True}]}
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(cfg))
    w = Worker("--kv-blocks", "256", "--max-running", "8")
    r = Router([w.endpoint], "--tenants", str(path), admin_key="sk-ops")
    try:
        parsed_before = r.metrics()["switchyard_router_parse_seconds_count"]
        flood, streams = [], []
        stop = time.time() + 8

        def attacker():
            while time.time() < stop:
                big_prompt_request(r.port, "sk-bulk", 1000 * 1000, flood)

        attackers = [threading.Thread(target=attacker) for _ in range(4)]
        for t in attackers:
            t.start()
        time.sleep(1)
        victims = [threading.Thread(target=stream_itl, args=(r, "sk-app", streams)) for _ in range(4)]
        for t in victims:
            t.start()
        for t in victims + attackers:
            t.join(120)
        elapsed = 8 + 1  # the flood's length, plus slack for the last requests in flight
        # No key at all: refused from the header too.
        nokey = []
        big_prompt_request(r.port, None, 1000 * 1000, nokey)
        assert nokey == [(401, "missing_api_key", False)]

        refused = [f for f in flood if f[0] == 429]
        served = [f for f in flood if f[0] != 429]
        print(f"flood: {len(flood)} requests, {len(refused)} refused at the header, {len(served)} read "
              f"({sorted(set((s, c) for s, c, _ in served))})")
        assert all(code == "tenant_rate" and not sent for _, code, sent in refused)
        # What got in was read and tokenized (and refused for its length); at most one per second.
        assert all(status == 400 and code == "context_length_exceeded" for status, code, _ in served)
        assert 1 <= len(served) <= elapsed + 1
        assert len(refused) >= 4 * len(served)
        m = r.metrics()
        assert m["switchyard_router_http_refused_at_header_total"] == len(refused) + 1
        assert m["switchyard_router_parse_seconds_count"] - parsed_before <= len(served) + len(streams)
        # The other tenant's streams all ran to the end.
        assert [(ok, n) for ok, n, _ in streams] == [(True, 48)] * 4
        gaps = sorted(b - a for _, _, st in streams for a, b in zip(st, st[1:]))
        if gaps:
            print(f"app tenant's streams under the flood: ITL p50 {statistics.median(gaps) * 1000:.0f} ms, "
                  f"max {gaps[-1] * 1000:.0f} ms")
        time.sleep(0.3)  # the dispatcher adds the edge's count at its next tick (100 ms)
        assert r.metrics()['switchyard_router_admission_rejections_total{reason="tenant_rate"}'] >= len(refused)
    finally:
        r.stop()
        w.stop()


def head_answer(port, head, timeout=10):
    """Sends only a request head (its body never follows); returns (status, error code) of the
    answer the router gives from the header, or (0, "") when it waits for the body."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(head)
        got = b""
        while b"\r\n\r\n" not in got:
            try:
                chunk = s.recv(4096)
            except socket.timeout:
                return 0, ""
            if not chunk:
                return 0, ""
            got += chunk
        head_part, _, rest = got.partition(b"\r\n\r\n")
        status = int(head_part.split()[1])
        length = int([ln.split(b":")[1] for ln in head_part.split(b"\r\n")
                      if ln.lower().startswith(b"content-length")][0])
        while len(rest) < length:
            rest += s.recv(65536)
        return status, json.loads(rest[:length]).get("error", {}).get("code", "")
    finally:
        s.close()


def test_cheap_checks_come_before_the_body(tmp_path):
    """What the router can refuse from a request's header it refuses before reading a byte of
    body: bodies on routes that take none (the unauthenticated /health and /ready among them),
    a sign-in form past a key's size, a tenant already at its concurrency limit; and /tokenize
    draws on the tenant's requests/s like a generation does."""
    cfg = {"tenants": [{"name": "one-at-a-time", "keys": ["sk-one"], "max_concurrent": 1},
                       {"name": "slow", "keys": ["sk-slow"], "requests_per_s": 1, "burst": 1}]}
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(cfg))
    w = Worker("--kv-blocks", "256", "--max-running", "4")
    r = Router([w.endpoint], "--tenants", str(path))
    try:
        mib = 4 << 20
        for target in ("GET /health", "GET /ready", "GET /v1/models", "POST /health"):
            method, route = target.split()
            head = f"{method} {route} HTTP/1.1\r\nHost: x\r\nContent-Length: {mib}\r\n\r\n".encode()
            assert head_answer(r.port, head) == (413, "body_too_large"), target
        login = f"POST /dashboard/login HTTP/1.1\r\nHost: x\r\nContent-Length: {mib}\r\n\r\n".encode()
        assert head_answer(r.port, login) == (413, "body_too_large")
        # A tenant with its one request in flight: the next is refused from its header.
        body = json.dumps({"model": MODEL_ID, "prompt": "A long story:", "max_tokens": 200, "ignore_eos": True,
                           "stream": True}).encode()
        s = socket.create_connection(("127.0.0.1", r.port), timeout=30)
        s.sendall(post_head("/v1/completions", len(body), "sk-one") + body)
        assert s.recv(12).startswith(b"HTTP/1.1 200")
        second = head_answer(r.port, post_head("/v1/completions", 100000, "sk-one"))
        s.close()
        assert second == (429, "tenant_concurrency")
        # /tokenize is charged to the requests/s bucket (burst 1): the second in a second is refused.
        tok = json.dumps({"model": MODEL_ID, "prompt": "hello"}).encode()
        first = r.post("/tokenize", tok, headers={"Authorization": "Bearer sk-slow",
                                                  "Content-Type": "application/json"})
        again = head_answer(r.port, post_head("/tokenize", len(tok), "sk-slow"))
        assert first[0] == 200, first
        assert again == (429, "tenant_rate")
    finally:
        r.stop()
        w.stop()


def test_big_bodies_are_prepared_off_the_io_thread_and_shed_when_the_prep_pool_is_full():
    """Parsing, templating and tokenizing a request body runs on the prep pool, not on the I/O
    thread: with one I/O thread busy with nothing, /health is answered while megabyte prompts
    are being tokenized (it waited behind all of them before). Bodies the pool has no room for
    (one running + 3 waiting here) are refused at once with 503 router_busy and Retry-After;
    every request gets an answer."""
    w = Worker("--kv-blocks", "256", "--max-running", "4")
    r = Router([w.endpoint], "--http-threads", "1", "--prep-threads", "1", "--prep-queue", "3")
    try:
        # ~1 MB (the prompt limit), ~370k tokens: each takes the prep thread ~0.1 s or more, then
        # is refused for the model's context.
        body = json.dumps({"model": MODEL_ID, "prompt": "lorem ipsum dolor sit amet " * 37000,
                           "max_tokens": 4}).encode()
        answers, lock = [], threading.Lock()

        def send():
            s = socket.create_connection(("127.0.0.1", r.port), timeout=60)
            s.sendall(post_head("/v1/completions", len(body)) + body)
            got = b""
            while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            s.close()
            head, _, payload = got.partition(b"\r\n\r\n")
            with lock:
                answers.append((int(head.split()[1]), json.loads(payload)["error"]["code"],
                                b"Retry-After: 1" in head, time.monotonic()))

        threads = [threading.Thread(target=send) for _ in range(8)]
        for t in threads:
            t.start()
        wait_for("a body waiting for the prep thread",
                   lambda: r.metrics().get("switchyard_router_prep_waiting", 0) >= 1, 10, 0.01)
        status, _, _ = r.get("/health", timeout=30)
        health_at = time.monotonic()
        for t in threads:
            t.join(60)
        assert status == 200
        assert len(answers) == 8
        busy = [a for a in answers if a[1] == "router_busy"]
        done = [a for a in answers if a[1] == "context_length_exceeded"]
        assert len(busy) + len(done) == 8, answers
        assert busy and all(a[0] == 503 and a[2] for a in busy)
        assert 1 <= len(done) <= 4
        # /health did not wait for the pool: prepared bodies were still being answered after it.
        assert sum(a[3] > health_at for a in done) >= 1, (health_at, answers)
        assert r.metrics()["switchyard_router_prep_refused_total"] == len(busy)
    finally:
        r.stop()
        w.stop()
