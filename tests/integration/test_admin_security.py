"""The router's admin surface and its secrets (docs/reliability.md, "The worker link and the admin
surface"), with real router, worker and redis-server processes: with tenants configured every route
but /health and /ready answers 401 without a key (/metrics wants an admin key; --metrics-port serves
it to a scraper alone); cache entries sealed with HMAC-SHA256 (--cache-mac-key-file) read as misses
once someone with write access to Redis forges or moves them; and neither the Redis password, the
API keys nor the MAC key appears in any log line."""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from cluster import MODEL_ID, Router
from support import needs_model
from worker_client import BUILD, Worker, free_port, spawn

pytestmark = [
    needs_model,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed (deploy/setup.sh)"),
]

ADMIN_KEY, APP_KEY = "sk-admin-0b5e7c1d", "sk-app-93f1aa27"
REDIS_PASSWORD = "redis-pw-6f0c2e9a"
MAC_KEY = "mac-key-4d1b8e2f7a93c605"
SECRETS = (ADMIN_KEY, APP_KEY, REDIS_PASSWORD, MAC_KEY)


class PasswordRedis:
    """A throwaway redis-server that requires a password, and a byte-safe RESP client for it."""

    def __init__(self):
        self.port = free_port()
        self.log = os.path.join(BUILD, f"redis-{self.port}.log")
        self.proc = spawn(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--requirepass", REDIS_PASSWORD],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        end = time.time() + 10
        while time.time() < end:
            try:
                if self.cmd("PING") == b"PONG":
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not come up")

    def cmd(self, *args):
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            f = s.makefile("rb")
            for c in (("AUTH", REDIS_PASSWORD), args):
                parts = [a if isinstance(a, bytes) else str(a).encode() for a in c]
                s.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
                reply = self._read(f)
            return reply

    def _read(self, f):
        line = f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else f.read(n + 2)[:-2]
        if kind == b"*":
            return [self._read(f) for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    d = tmp_path_factory.mktemp("admin")
    (d / "tenants.json").write_text(json.dumps({"tenants": [
        {"name": "ops", "keys": [ADMIN_KEY], "admin": True},
        {"name": "app", "keys": [APP_KEY]},
    ]}))
    (d / "cache-mac.key").write_text(MAC_KEY + "\n")
    redis = PasswordRedis()
    worker = Worker("--kv-blocks", "256")
    metrics_port = free_port()
    router = Router([worker.endpoint], "--tenants", str(d / "tenants.json"), "--redis",
                    f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis.port}/0", "--cache-mac-key-file",
                    str(d / "cache-mac.key"), "--metrics-port", str(metrics_port), admin_key=ADMIN_KEY)
    router.metrics_port = metrics_port
    yield {"router": router, "worker": worker, "redis": redis}
    router.stop()
    worker.stop()
    redis.stop()


ROUTES = [("GET", "/v1/models"), ("GET", f"/v1/models/{MODEL_ID}"), ("POST", "/v1/completions"),
          ("POST", "/v1/chat/completions"), ("GET", "/metrics"), ("GET", "/v1/cache/stats"), ("GET", "/dashboard"),
          ("GET", "/dashboard/chart.js"), ("GET", "/version"), ("POST", "/tokenize"), ("POST", "/detokenize"),
          ("GET", "/no/such/route"), ("DELETE", "/v1/completions")]


def get_status(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_every_route_but_health_and_ready_needs_a_key(stack):
    r = stack["router"]
    for method, path in ROUTES:
        body = b"{}" if method == "POST" else None
        assert r.request(method, path, body)[0] == 401, (method, path)
        assert r.request(method, path, body, headers={"Authorization": "Bearer sk-wrong"})[0] == 401, (method, path)
    assert r.get("/health")[0] == 200
    assert r.get("/ready")[0] == 200
    # /metrics is the admin's; the separate listener serves it to the scraper without a key.
    assert r.get("/metrics", headers={"Authorization": f"Bearer {APP_KEY}"})[0] == 403
    assert r.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})[0] == 200
    status, text = get_status(f"http://127.0.0.1:{r.metrics_port}/metrics")
    assert status == 200 and b"switchyard_router_link_frames_out_total" in text
    assert get_status(f"http://127.0.0.1:{r.metrics_port}/v1/models")[0] == 404
    # ... and /health, the router's liveness off the API port (no key: it says nothing).
    assert get_status(f"http://127.0.0.1:{r.metrics_port}/health")[0] == 200


def completion(r, prompt):
    status, h, raw = r.post("/v1/completions", {"model": MODEL_ID, "prompt": prompt, "max_tokens": 8,
                                                "temperature": 0}, headers={"Authorization": f"Bearer {APP_KEY}"})
    assert status == 200, raw
    return h.get("X-Cache"), json.loads(raw)["choices"][0]["text"]


def stored(r, prompt):
    before = r.metrics()["switchyard_router_cache_stores_total"]
    out = completion(r, prompt)
    end = time.time() + 5
    while r.metrics()["switchyard_router_cache_stores_total"] == before and time.time() < end:
        time.sleep(0.05)
    assert r.metrics()["switchyard_router_cache_stores_total"] > before, "the answer was not stored"
    return out


def test_a_forged_or_moved_cache_entry_reads_as_a_miss(stack):
    r, redis = stack["router"], stack["redis"]
    a, b = "Name a colour of the sky.", "Name a fruit that is yellow."
    assert stored(r, a)[0] is None
    hit, text_a = completion(r, a)
    assert hit == "hit"  # sealed entries are read back
    assert stored(r, b)[0] is None
    keys = redis.cmd("KEYS", "sy:v1:r:*")
    assert len(keys) == 2, keys
    values = {k: redis.cmd("GET", k) for k in keys}
    # Someone with write access to Redis swaps the two answers (each a valid, checksummed entry):
    # the MAC binds an entry to its key, so both read as misses and are answered afresh.
    (ka, va), (kb, vb) = values.items()
    redis.cmd("SET", ka, vb)
    redis.cmd("SET", kb, va)
    corrupt = 'switchyard_router_cache_lookups_total{status="corrupt"}'
    before = r.metrics().get(corrupt, 0)
    hit, again = completion(r, a)
    assert hit is None and again == text_a
    hit, _ = completion(r, b)
    assert hit is None
    assert r.metrics()[corrupt] == before + 2


def test_no_secret_in_any_log(stack, tmp_path):
    r = stack["router"]
    # Requests that could log a key: a wrong one, the sign-in form with a wrong and a right one.
    r.get("/v1/models", headers={"Authorization": f"Bearer {APP_KEY}x"})
    for key in (APP_KEY + "x", ADMIN_KEY):
        r.post("/dashboard/login", f"key={key}".encode(), headers={"Content-Type": "application/x-www-form-urlencoded"})
    # A router whose Redis (password in the URL) is unreachable logs its cache errors too.
    (tmp_path / "tenants.json").write_text(json.dumps({"tenants": [{"name": "ops", "keys": [ADMIN_KEY]}]}))
    bad = Router([stack["worker"].endpoint], "--tenants", str(tmp_path / "tenants.json"), "--redis",
                 f"redis://user:{REDIS_PASSWORD}@127.0.0.1:{free_port()}/0", wait_ready=False)
    status, _, _ = bad.post("/v1/completions", {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2},
                            headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    bad.stop()
    logs = {"router": open(r.log.name).read(), "router without redis": open(bad.log.name).read(),
            "redis": open(stack["redis"].log).read()}
    assert "response cache on redis://:***@127.0.0.1" in logs["router"], logs["router"]
    assert "redis://user:***@127.0.0.1" in logs["router without redis"], logs["router without redis"]
    for name, text in logs.items():
        for s in SECRETS:
            assert s not in text, f"{name} log: ...{text[max(0, text.find(s) - 80):text.find(s) + len(s)]}"
