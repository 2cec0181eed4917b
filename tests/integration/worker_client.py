"""A small client for the router <-> worker protocol (ZeroMQ DEALER + MessagePack), used by the
integration tests to drive a real switchyard-worker process the way a router does.

Where the binaries come from (environment):
  SY_BUILD_DIR   build folder of both binaries, and where process logs go (default: build)
  SY_WORKER_BIN  the switchyard-worker to run instead of SY_BUILD_DIR's (cluster.py has
                 SY_ROUTER_BIN): tests/sanitize.sh runs an ASan build of one against a normal
                 build of the other
  SY_MODEL       the GGUF model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)"""
import json
import os
import signal
import socket
import subprocess
import time

import msgpack
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("SY_BUILD_DIR", os.path.join(ROOT, "build"))
WORKER = os.environ.get("SY_WORKER_BIN") or os.path.join(BUILD, "worker", "switchyard-worker")
MODEL = os.environ.get("SY_MODEL", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))


def parse_prometheus(text):
    """{'name{labels}': value} for every sample line of a Prometheus text exposition."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            values[k] = float(v)
    return values


_spawned = []  # every process spawn() started in this test session


def spawn(argv, **kw):
    """subprocess.Popen for a process a test owns: started in a process group of its own, and ended
    (with everything in its group) by end_spawned() at the end of the session whatever the tests'
    outcome (conftest.py), so a failing test cannot leave servers holding ports and cores."""
    proc = subprocess.Popen(argv, start_new_session=True, **kw)
    _spawned.append(proc)
    return proc


def end_spawned():
    """Kills the process groups of spawned processes that still run; returns their command lines."""
    left = []
    for proc in _spawned:
        if proc.poll() is None:
            left.append(" ".join(map(str, proc.args)) if isinstance(proc.args, (list, tuple)) else str(proc.args))
        for sig in (signal.SIGCONT, signal.SIGKILL):  # a stopped (SIGSTOP) process too; its children too
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
    _spawned.clear()
    return left


def stop_process(proc, sig=15, timeout=40):
    """Signals `proc` and waits; kills it after `timeout` seconds. Returns its exit code. A process
    that outlives SIGKILL by 10 s (stuck in the kernel) raises, naming where it is stuck."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"pid {proc.pid} survived SIGKILL for 10 s:\n" + describe_process(proc.pid))
    return proc.returncode


def describe_process(pid):
    """Where a live process and each of its threads are: state and kernel wait channel (and the
    kernel stack of a thread in uninterruptible sleep, where readable), for a test that hangs on it."""
    lines = []
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            base = f"/proc/{pid}/task/{tid}"
            stat = open(f"{base}/stat").read()
            name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
            wchan = open(f"{base}/wchan").read().strip() or "-"
            lines.append(f"  thread {tid} ({name}): state {state}, waiting in {wchan}")
            if state == "D":
                try:
                    lines += ["    " + f for f in open(f"{base}/stack").read().split()[1::2][:8]]
                except OSError:
                    pass  # /proc/*/stack needs root
    except (OSError, ValueError) as e:
        lines.append(f"  not readable: {e}")
    return "\n".join(lines)


def alive_spawned():
    """(pid, command line) of the processes spawn() started that still run."""
    return [(p.pid, " ".join(map(str, p.args))) for p in _spawned if p.poll() is None]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path, timeout=2):
    """(status, body) of GET `path` on 127.0.0.1:`port` (a server that closes after answering)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split(" ")[1]), body


def tokenize(prompt, chat=True):
    cmd = [WORKER, "tokenize", "--model", MODEL, "--prompt", prompt] + (["--chat"] if chat else [])
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


class Worker:
    """A switchyard-worker process on free loopback ports."""

    def __init__(self, *extra, prefix=(), port=None):
        """`prefix`: a command the worker runs under (e.g. faketime); `port`: the link's port (a
        worker restarted at the address of one that died), else a free one."""
        self.port, self.metrics_port = port or free_port(), free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        # Its log goes to a file (build/worker-PORT.log), never to a pipe nobody reads: a worker
        # that logs more than a pipe holds would block in write().
        self.log_path = os.path.join(BUILD, f"worker-{self.port}.log")
        with open(self.log_path, "w") as log:
            self.proc = spawn([*prefix, WORKER, "serve", "--model", MODEL, "--listen", self.endpoint, "--metrics-port",
                               str(self.metrics_port), "--threads", "2", *extra], stderr=log)
        deadline = time.time() + 60
        while time.time() < deadline:  # until /ready says 200: model loaded, link bound
            if self.proc.poll() is not None:
                raise RuntimeError("worker exited: " + self.log())
            try:
                if self.get("/ready")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"worker not ready after 60 s:\n{describe_process(self.proc.pid)}\nits log:\n{self.log()}")

    def settle(self, timeout=180):
        """Waits until the worker has moved its weights and KV cache onto huge pages (it starts on
        small ones to be ready sooner: docs/cpu-backend.md, "Start-up"), so a benchmark measures the
        worker it would meet a minute later. Returns the seconds waited."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.metrics().get("switchyard_worker_huge_page_pending_bytes", 0) == 0:
                return time.time() - t0
            time.sleep(0.1)
        raise RuntimeError(f"worker still moving onto huge pages after {timeout} s")

    def get(self, path):
        """(status, body) of GET `path` on the metrics port."""
        return http_get(self.metrics_port, path)

    def metrics(self):
        return parse_prometheus(self.get("/metrics")[1])

    def stop(self, sig=15, timeout=40):
        return stop_process(self.proc, sig, timeout)

    def log(self):
        """What the worker has written to stderr so far."""
        with open(self.log_path) as f:
            return f.read()


class Client:
    """A DEALER socket speaking to one worker, like a router does."""

    def __init__(self, endpoint, identity=None):
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        if identity:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def close(self):
        self.sock.close(0)

    def send(self, typ, body):
        raw = body if isinstance(body, bytes) else msgpack.packb(body, use_bin_type=True)
        self.sock.send_multipart([typ.encode(), raw])

    def send_raw(self, frames):
        self.sock.send_multipart(frames)

    def recv(self, timeout=30.0):
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError("no message from the worker")
        frames = self.sock.recv_multipart()
        return frames[0].decode(), msgpack.unpackb(frames[1], raw=False)

    def hello(self, version=1):
        self.send("hello", {"version": version, "router_id": "test-router"})
        return self.recv()

    def submit(self, request_id, prompt, max_tokens=16, stream=True, **sampling):
        s = {"max_tokens": max_tokens, **sampling}
        self.send("submit", {"request_id": request_id, "prompt": prompt, "sampling": s, "stream": stream,
                             **{k: v for k, v in sampling.items() if k in ("priority", "budget_ms")}})

    def collect(self, ids, timeout=120.0):
        """Reads until every id in `ids` has ended; returns {id: {"tokens", "text", "finish", "usage",
        "stop", "messages", "errors"}} (heartbeats skipped)."""
        out = {i: {"tokens": [], "text": "", "finish": None, "usage": None, "stop": "", "messages": 0, "error": None}
               for i in ids}
        pending = set(ids)
        end = time.time() + timeout
        while pending:
            typ, body = self.recv(max(0.1, end - time.time()))
            if typ == "tokens":
                r = out[body["request_id"]]
                r["tokens"] += body.get("token_ids", [])
                r["text"] += body.get("text", "")
                r["messages"] += 1
                if body.get("finish_reason"):
                    r["finish"], r["usage"] = body["finish_reason"], body.get("usage")
                    r["stop"] = body.get("stop", "")
                    pending.discard(body["request_id"])
            elif typ == "error" and body.get("request_id") in out:
                out[body["request_id"]]["error"] = body
                pending.discard(body["request_id"])
        return out
