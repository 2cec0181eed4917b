"""Router and worker behaviour a Kubernetes rollout relies on, on real processes: a worker that
leaves the worker list drains and is dropped (entry, metric labels, connection), an empty list
retires everyone while an unreadable one changes nothing, the worker's /ready through start,
serving and drain with --drain-timeout-s, and the router's --shutdown-delay-s (not ready, still
admitting) followed by its drain."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import openai

from cluster import MODEL_ID, ROUTER, Router
from support import needs_model, wait_for
from worker_client import MODEL, WORKER, Client, Worker, free_port, http_get, spawn, tokenize

pytestmark = needs_model


def stream(port, body, out, key):
    """POSTs a streamed completion, stores (status line, every data: payload) in out[key]."""
    data = json.dumps({"model": MODEL_ID, "stream": True, **body}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        raw = b""
        while b"data: [DONE]" not in raw:
            chunk = s.recv(65536)
            if not chunk:
                break
            raw += chunk
    text = raw.decode(errors="replace")
    out[key] = (text.split("\r\n", 1)[0], re.findall(r"^data: (.*)$", text, re.M))


def established_to(port):
    """Established IPv4 TCP connections whose remote end is 127.0.0.1:`port` (from /proc/net/tcp)."""
    n = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if state == "01" and remote == f"0100007F:{port:04X}":
                n += 1
    return n


def worker_metric(w, name):
    return w.metrics().get(name, 0)


def test_a_worker_removed_from_the_list_drains_and_is_dropped(tmp_path):
    workers = [Worker("--kv-blocks", "256", "--max-running", "8") for _ in range(2)]
    listing = tmp_path / "workers.txt"
    listing.write_text("".join(w.endpoint + "\n" for w in workers))
    # A long heartbeat timeout: the busy worker is held stopped below, and must not be declared dead.
    r = Router([], "--workers-file", str(listing), "--dns-interval-s", "0.2", "--heartbeat-timeout-ms", "30000")
    held = None
    try:
        wait_for("both workers ready", lambda: r.metrics().get('switchyard_router_workers{state="ready"}') == 2)
        results = {}
        t = threading.Thread(target=stream, args=(r.port, {"prompt": "A long story:", "max_tokens": 100,
                                                           "ignore_eos": True}, results, "long"))
        t.start()
        busy = wait_for("the stream running on a worker",
                        lambda: next((w for w in workers if worker_metric(w, "switchyard_worker_requests_running")),
                                     None))
        other = workers[1] if busy is workers[0] else workers[0]
        finished_before = worker_metric(busy, 'switchyard_worker_requests_finished_total{reason="length"}')
        port = int(busy.endpoint.rsplit(":", 1)[1])
        assert established_to(port) == 1
        held = busy
        busy.proc.send_signal(signal.SIGSTOP)  # its stream cannot end before we have looked

        listing.write_text(other.endpoint + "\n")  # the busy worker leaves the list
        m = wait_for("the busy worker retired",
                     lambda: (lambda m: m if m.get('switchyard_router_workers{state="retired"}') == 1 else None)(
                         r.metrics()))
        assert m['switchyard_router_workers{state="ready"}'] == 1
        assert m[f'switchyard_router_worker_in_flight{{worker="{busy.endpoint}"}}'] == 1
        assert r.get("/ready")[0] == 200  # the other one still serves
        for i in range(3):  # new work goes to the other worker
            status, _, raw = r.post("/v1/completions", {"model": MODEL_ID, "prompt": f"Question {i}:", "max_tokens": 4})
            assert status == 200, raw
        assert any(busy.endpoint in k for k in r.metrics())  # still there: its stream runs
        assert established_to(port) == 1

        busy.proc.send_signal(signal.SIGCONT)
        held = None
        t.join(120)
        status_line, events = results["long"]
        assert "200" in status_line
        assert events[-1] == "[DONE]"
        assert not any('"error"' in e for e in events)  # finished where it ran, not cut off
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        # Only the stream ran there since it retired.
        assert worker_metric(busy, 'switchyard_worker_requests_finished_total{reason="length"}') == finished_before + 1

        # Then it is gone: no state counts it, its labels are gone, its connection closed.
        def dropped():
            m = r.metrics()
            return m if not any(busy.endpoint in k for k in m) else None
        m = wait_for("the worker dropped", dropped, timeout=5)
        assert m['switchyard_router_workers{state="retired"}'] == 0
        assert sum(v for k, v in m.items() if k.startswith("switchyard_router_workers{")) == 1
        wait_for("the router's connection to it closed", lambda: established_to(port) == 0, timeout=5)
        log = open(r.log.name).read()
        assert f"worker {busy.endpoint} ready -> retired" in log
        assert f"worker {busy.endpoint} removed (was retired)" in log

        # Listed again: it rejoins.
        listing.write_text("".join(w.endpoint + "\n" for w in workers))
        wait_for("both ready again", lambda: r.metrics().get('switchyard_router_workers{state="ready"}') == 2)
        assert established_to(port) == 1
    finally:
        if held:
            held.proc.send_signal(signal.SIGCONT)
        r.stop()
        for w in workers:
            w.stop()


def test_an_unreadable_list_changes_nothing_and_an_empty_one_retires_every_worker(tmp_path):
    w = Worker("--kv-blocks", "64")
    listing = tmp_path / "workers.txt"
    listing.write_text(w.endpoint + "\n")
    r = Router([], "--workers-file", str(listing), "--dns-interval-s", "0.2")
    try:
        listing.unlink()  # like a DNS timeout: keep what is known
        wait_for("the failure logged", lambda: "lookup failed" in open(r.log.name).read())
        time.sleep(0.5)
        assert r.metrics()['switchyard_router_workers{state="ready"}'] == 1
        assert r.get("/ready")[0] == 200

        listing.write_text("# no workers (like NXDOMAIN: every pod unready, or the Service gone)\n")
        # Ready through the no-worker grace (--no-worker-timeout-s, 10 s: requests queue for a
        # worker meanwhile), then not.
        wait_for("the router not ready", lambda: r.get("/ready")[0] == 503, timeout=30)
        m = wait_for("the worker dropped",
                     lambda: (lambda m: m if not any(w.endpoint in k for k in m) else None)(r.metrics()))
        assert sum(v for k, v in m.items() if k.startswith("switchyard_router_workers{")) == 0
        # No worker left past the grace: a request is refused at once, with the answer a router
        # that never met a worker gives.
        status, h, raw = r.post("/v1/completions", {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2, "timeout": 1},
                                timeout=10)
        assert status == 503 and json.loads(raw)["error"]["code"] == "no_workers", raw
        assert h.get("Retry-After"), h
    finally:
        r.stop()
        w.stop()


def test_worker_ready_through_start_serve_and_drain_with_its_drain_timeout():
    port, metrics_port = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    proc = spawn([WORKER, "serve", "--model", MODEL, "--listen", endpoint, "--metrics-port",
                             str(metrics_port), "--threads", "2", "--kv-blocks", "128", "--drain-timeout-s", "2"],
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []  # /ready answers from the start: 503 while the model loads, then 200

        def ready_now():
            try:
                seen.append(http_get(metrics_port, "/ready"))
            except OSError:
                return None
            return seen[-1][0] == 200
        wait_for("the worker ready", ready_now, timeout=60, every=0.005)
        assert seen[0] == (503, "not ready: loading the model\n"), seen[:3]
        assert http_get(metrics_port, "/health")[0] == 200

        c = Client(endpoint)
        assert c.hello()[0] == "welcome"
        prompt = tokenize("Tell me a story.")
        for i in range(4):  # 4 x 1500 tokens: far more than 2 s of work
            c.submit(f"long-{i}", prompt, max_tokens=1500, ignore_eos=True)
        typ, _ = c.recv()
        while typ != "tokens":
            typ, _ = c.recv()
        t_term = time.time()
        proc.terminate()
        wait_for("/ready 503 while draining",
                 lambda: http_get(metrics_port, "/ready") == (503, "not ready: draining\n"), timeout=2, every=0.02)
        assert http_get(metrics_port, "/health")[0] == 200  # alive while it drains
        rc = proc.wait(20)
        elapsed = time.time() - t_term
        assert rc == 0
        assert 1.5 < elapsed < 6, elapsed  # --drain-timeout-s 2 cut the long requests short
        assert "drain timeout" in proc.stderr.read()
        c.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_router_shutdown_delay_keeps_admitting_while_not_ready_then_drains():
    workers = [Worker("--kv-blocks", "256", "--max-running", "8") for _ in range(2)]
    # A long heartbeat timeout: one worker is held stopped below, and must not be declared dead.
    r = Router([w.endpoint for w in workers], "--shutdown-delay-s", "3", "--drain-timeout-s", "30",
               "--heartbeat-timeout-ms", "30000")
    held = None
    try:
        results = {}
        t = threading.Thread(target=stream, args=(r.port, {"prompt": "A long story:", "max_tokens": 100,
                                                           "ignore_eos": True}, results, "long"))
        t.start()
        held = wait_for("the stream running",
                        lambda: next((w for w in workers if worker_metric(w, "switchyard_worker_requests_running")),
                                     None))
        held.proc.send_signal(signal.SIGSTOP)  # its stream cannot end until SIGCONT: the drain waits for it
        t_term = time.time()
        r.proc.terminate()
        wait_for("/ready 503", lambda: r.get("/ready")[0] == 503, timeout=1, every=0.02)
        assert json.loads(r.get("/ready")[2])["status"] == "not ready: shutting down"
        # Within the delay a new request is still admitted and answered (by the other worker).
        status, _, raw = r.post("/v1/completions", {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 4})
        assert status == 200, raw
        assert time.time() - t_term < 3
        # After it the router drains: new requests get 503 while the held stream is still running.
        time.sleep(max(0.0, t_term + 3.5 - time.time()))
        status, _, raw = r.post("/v1/completions", {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 4})
        assert status == 503 and json.loads(raw)["error"]["code"] == "draining", raw
        assert r.proc.poll() is None
        held.proc.send_signal(signal.SIGCONT)
        held = None
        t.join(120)
        assert results["long"][1][-1] == "[DONE]"
        assert not any('"error"' in e for e in results["long"][1])  # it finished during the drain
        assert r.proc.wait(30) == 0
        log = open(r.log.name).read()
        assert "not ready, still admitting for 3 s" in log and "draining (at most 30 s)" in log
    finally:
        if held:
            held.proc.send_signal(signal.SIGCONT)
        r.stop()
        for w in workers:
            w.stop()


def test_bad_discovery_flags_are_refused():
    for bad, says in ((["--workers-dns", "w:5555", "--workers-file", "/tmp/x"], "one discovery source"),
                      (["--workers-dns", "w:5555", "--dns-family", "5"], "--dns-family"),
                      (["--workers-dns", "nohost"], "NAME:PORT"),
                      (["--workers", "tcp://127.0.0.1:1", "--drain-timeout-s", "-1"], "--drain-timeout-s")):
        p = subprocess.run([ROUTER, "--port", "0", *bad], capture_output=True, text=True, timeout=30)
        assert p.returncode == 1, (bad, p.stderr)
        assert says in p.stderr, (bad, p.stderr)


def test_router_drain_timeout_cuts_what_still_runs():
    w = Worker("--kv-blocks", "256", "--max-running", "8")
    r = Router([w.endpoint], "--drain-timeout-s", "1")
    try:
        results = {}
        t = threading.Thread(target=stream, args=(r.port, {"prompt": "A long story:", "max_tokens": 1500,
                                                           "ignore_eos": True}, results, "long"))
        t.start()
        wait_for("the stream running", lambda: w.metrics()["switchyard_worker_requests_running"] == 1)
        t_term = time.time()
        r.proc.terminate()
        assert r.proc.wait(20) == 0
        assert time.time() - t_term < 5  # not the default 30 s
        t.join(30)
        assert "drain timeout with 1 requests unfinished" in open(r.log.name).read()
        # The worker is told: the cut-off request is cancelled there (its router went away).
        wait_for("the worker idle", lambda: w.metrics()["switchyard_worker_requests_running"] == 0, timeout=20)
    finally:
        r.stop()
        w.stop()


def test_router_closes_keep_alive_connections_from_sigterm_on():
    """Pooled keep-alive clients (the openai SDK) would keep sending to a terminating router until
    its drain refused them with 503 `draining`. From SIGTERM on, the router closes connections
    idle between requests at once and ends every response with `Connection: close`, so clients
    open their next connection elsewhere (through the Service, to a router that stays)."""
    w = Worker("--kv-blocks", "256", "--max-running", "4")
    r = Router([w.endpoint], "--shutdown-delay-s", "3", "--drain-timeout-s", "10")
    try:
        body = json.dumps({"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2}).encode()
        pooled = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
        pooled.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        first = pooled.getresponse()
        first.read()
        assert first.status == 200 and first.getheader("Connection") == "keep-alive"
        client = openai.OpenAI(base_url=r.url + "/v1", api_key="x", max_retries=0, timeout=30)
        assert client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2).choices  # pools a connection
        r.proc.terminate()
        wait_for("/ready 503", lambda: r.get("/ready")[0] == 503, timeout=2, every=0.02)
        # The idle pooled connection is closed by the router (EOF to its reader).
        pooled.sock.settimeout(3)
        assert pooled.sock.recv(1) == b""
        # The SDK's pooled connection was closed too: its next request opens a new one and is
        # served (still admitted during --shutdown-delay-s), told to close after it.
        raw = client.completions.with_raw_response.create(model=MODEL_ID, prompt="Hi", max_tokens=2)
        assert raw.http_response.status_code == 200
        assert raw.headers.get("connection") == "close"
        assert r.proc.wait(30) == 0
    finally:
        r.stop()
        w.stop()


def test_worker_probes_are_answered_while_other_clients_stall_its_metrics_port():
    """The kubelet probes the worker's metrics port with a 2 s timeout and failureThreshold 1: a
    server that answered one connection at a time let one client that connects and sends nothing
    (a port scan, a half-open scraper) fail the probe and take the worker out of its Service. 20
    silent connections stay open while /ready, /health and /metrics are each answered within a
    probe's timeout; a client that sends half a request line is closed after 2 s."""
    w = Worker("--kv-blocks", "64")
    silent = []
    try:
        for _ in range(20):
            silent.append(socket.create_connection(("127.0.0.1", w.metrics_port), timeout=10))
        half = socket.create_connection(("127.0.0.1", w.metrics_port), timeout=10)
        half.sendall(b"GET /rea")
        for path, want in (("/ready", 200), ("/health", 200), ("/metrics", 200)):
            status, body = http_get(w.metrics_port, path, timeout=2)
            assert status == want, (path, body)
        half.settimeout(5)
        assert half.recv(1) == b""  # closed at its 2 s limit, without an answer
        half.close()
    finally:
        for s in silent:
            s.close()
        w.stop()


def test_published_keys_are_refused_unless_a_demo(tmp_path):
    """A router given the example tenants (deploy/tenants.example.json: public keys, one of them
    an admin's) refuses to start, naming the tenant and what to do; with --allow-example-keys it
    starts and says it is a demo. A worker refuses the CURVE key the Kubernetes base once carried."""
    example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "tenants.example.json")
    p = subprocess.run([ROUTER, "--port", "0", "--workers", "tcp://127.0.0.1:1", "--tenants", example],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1, p.stderr
    assert "an example tenant API key published with Switchyard" in p.stderr and "make-secrets.py" in p.stderr
    r = Router([], "--workers", "tcp://127.0.0.1:1", "--tenants", example, "--allow-example-keys", wait_ready=False)
    try:
        assert r.get("/health")[0] == 200
        assert "--allow-example-keys: a demo" in open(r.log.name).read()
    finally:
        r.stop()
    key = tmp_path / "worker.key"
    key.write_text("g&Hg!>s4oZOe&*D9ER%%>^T[YbJ5c9z0^1Ji*WzI\n")  # the base's example pair, once committed
    p = subprocess.run([WORKER, "serve", "--model", MODEL, "--listen", f"tcp://127.0.0.1:{free_port()}",
                        "--curve-secret-key", str(key)], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "the example worker CURVE secret key" in p.stderr, p.stderr
