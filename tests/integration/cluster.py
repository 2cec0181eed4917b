"""Real router + worker processes on loopback for the integration tests and benchmarks.

SY_ROUTER_BIN: the switchyard-router to run instead of SY_BUILD_DIR's (tests/sanitize.sh points
it at an ASan + UBSan build, and sets SY_ROUTER_SANITIZED=1); SY_ROUTER_EXIT_LOG: a file to which Router.stop() appends "PID EXIT_CODE"
(the sanitizer stage checks that each router ended by itself on SIGTERM, where LeakSanitizer runs);
SY_WORKER_BIN and the other variables: worker_client.py."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from worker_client import BUILD, MODEL, Worker, free_port, parse_prometheus, spawn, stop_process

ROUTER = os.environ.get("SY_ROUTER_BIN") or os.path.join(BUILD, "router", "switchyard-router")
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
# A sanitizer build's resident memory holds ASan's shadow and its quarantine of freed blocks (up
# to 256 MiB), not the router's own: the tests' resident-memory bounds do not apply to it.
ROUTER_SANITIZED = os.environ.get("SY_ROUTER_SANITIZED", "") not in ("", "0")


class Router:
    """A switchyard-router process in front of the given worker endpoints."""

    def __init__(self, endpoints, *extra, wait_ready=True, admin_key=None, redis_budget_ms=1000):
        """`admin_key`: sent by metrics() (with --tenants, /metrics needs an admin key).
        `redis_budget_ms`: --cache-lookup-timeout-ms when `extra` has --redis (None: the router's own)."""
        self.admin_key = admin_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(BUILD, f"router-{self.port}.log"), "w")
        workers = ["--workers", ",".join(endpoints)] if endpoints else []
        # Tests give Redis commands 1 s, not the production 5 ms: an ASan router on a busy 2-core
        # machine can miss 5 ms, and a GET that times out reads as a miss (`error`) where a test
        # counts hits, corrupt entries or stored responses. Tests of a slow or paused Redis pass
        # their own --cache-lookup-timeout-ms after this one (the last value of an option wins);
        # benchmarks pass redis_budget_ms=None and measure the router as it ships.
        budget = ["--cache-lookup-timeout-ms", str(redis_budget_ms)] if redis_budget_ms and "--redis" in extra else []
        self.proc = spawn([ROUTER, "--port", str(self.port), *workers, *budget, *extra], stderr=self.log)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("router exited: " + open(self.log.name).read())
            try:
                status, _, _ = self.get("/ready" if wait_ready else "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("router did not become ready: " + open(self.log.name).read())

    def request(self, method, path, body=None, headers=None, timeout=60):
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if data is not None and "Content-Type" not in (headers or {}):
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def metrics(self):
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else None
        status, _, body = self.get("/metrics", headers=headers)
        assert status == 200, body
        return parse_prometheus(body.decode())

    def stop(self, sig=15, timeout=40):
        rc = stop_process(self.proc, sig, timeout)
        self.log.close()
        if os.environ.get("SY_ROUTER_EXIT_LOG"):
            with open(os.environ["SY_ROUTER_EXIT_LOG"], "a") as f:
                f.write(f"{self.proc.pid} {rc}\n")
        return rc


def raw_http(port, payload, timeout=10):
    """Sends raw bytes, returns (status, body) of the single response (the server closes or answers)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:") and len(body) >= int(line.split(b":")[1]):
                        return int(head.split(b" ")[1]), body
    head, _, body = data.partition(b"\r\n\r\n")
    return (int(head.split(b" ")[1]) if head else 0), body


class Redis:
    """A throwaway redis-server on a loopback port: no persistence, so a restart starts empty."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.log = open(os.path.join(BUILD, f"redis-{self.port}.log"), "w")
        self.proc = spawn(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited: " + open(self.log.name).read())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not come up")

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test left it stopped
            self.proc.kill()
            self.proc.wait()
        self.log.close()
