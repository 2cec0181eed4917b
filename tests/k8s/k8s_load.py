"""Clients of the test cluster: one streaming completion over HTTP with its outcome classified, and
closed-loop load generators that pick a router per request (from the readiness-following
Service, or from a fixed list).

Outcome kinds:
  ok        HTTP 200, a finish_reason, `data: [DONE]`, no error event;
  error     a named error: an HTTP error status with an OpenAI error body, or an SSE error event
            (`code` holds its code, e.g. worker_lost, draining);
  transport no terminal answer: refused or reset connection, a stream cut before [DONE], a timeout,
            or no router endpoint to send to. Never acceptable: every request must end in an
            answer or a named error."""
import http.client
import json
import threading
import time
from collections import Counter

ROUTER_PORT = 8000


class Outcome:
    def __init__(self, router, i):
        self.router, self.i = router, i
        self.kind, self.status, self.code, self.detail = None, None, None, ""
        self.finish = None
        self.tokens = 0  # answer chunks received (non-streamed: completion tokens)
        self.text = ""   # the answer's text (choice 0)
        self.t0 = time.monotonic()
        self.t_end = None

    @property
    def started(self):
        return self.tokens > 0

    def __repr__(self):
        return (f"<#{self.i} via {self.router}: {self.kind} status={self.status} code={self.code} "
                f"chunks={self.tokens} finish={self.finish} {self.detail[:160]}>")


def _error_code(raw):
    try:
        err = json.loads(raw)["error"]
        return err.get("code") or err.get("type") or "?"
    except (ValueError, KeyError, TypeError):
        return None


def completion(router, body, i=0, timeout=90.0, chunk_timeout=30.0, key=None):
    """POST /v1/completions (streamed when body says so) to router:8000, with `key` as the bearer
    token when given (routers with --tenants); returns an Outcome."""
    o = Outcome(router, i)
    deadline = time.monotonic() + timeout
    c = http.client.HTTPConnection(router, ROUTER_PORT, timeout=chunk_timeout)
    try:
        payload = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        c.request("POST", "/v1/completions", payload, headers)
        r = c.getresponse()
        o.status = r.status
        if r.status != 200:
            raw = r.read()
            o.code = _error_code(raw)
            o.kind = "error" if o.code else "transport"
            o.detail = raw.decode(errors="replace")
            return o
        if not body.get("stream"):
            data = json.loads(r.read())
            o.finish = data["choices"][0]["finish_reason"]
            o.text = data["choices"][0].get("text") or ""
            o.tokens = data.get("usage", {}).get("completion_tokens", 0)
            o.kind = "ok" if o.finish else "transport"
            return o
        done = False
        while time.monotonic() < deadline:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                o.code = ev["error"].get("code") or ev["error"].get("type") or "?"
                o.detail = data.decode(errors="replace")
                continue
            for ch in ev.get("choices", []):
                o.tokens += 1  # a chunk of the answer: the stream has started
                if ch.get("index", 0) == 0:
                    o.text += ch.get("text") or ""
                if ch.get("finish_reason"):
                    o.finish = ch["finish_reason"]
        if not done:
            o.kind, o.detail = "transport", o.detail or "stream ended without [DONE]"
        elif o.code:
            o.kind = "error"
        elif o.finish:
            o.kind = "ok"
        else:
            o.kind, o.detail = "transport", "[DONE] without a finish_reason"
        return o
    except (OSError, http.client.HTTPException, ValueError) as e:
        o.kind, o.detail = "transport", f"{type(e).__name__}: {e}"
        return o
    finally:
        o.t_end = time.monotonic()
        c.close()


def story(i, max_tokens=24, tag=""):
    # Short distinct prompts (under one KV block): no prefix affinity, dispatch goes to the least
    # loaded. `tag` keeps two loads' prompts apart (a router with Redis answers a repeat from its cache).
    return {"model": None, "prompt": f"Story {tag}{i}: once upon a time", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}


def join_all(threads, timeout, who):
    """Waits up to `timeout` s in all for `threads` to end; fails naming those still waiting."""
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"{who} still waiting for an answer after {timeout} s: {alive}"


class Load:
    """`concurrency` closed-loop clients; each picks a router per request with `pick()`."""

    def __init__(self, pick, model, concurrency, max_tokens=24, name="load", key=None, tag="", timeouts=(90.0, 30.0)):
        """`timeouts`: (whole request, silence between two chunks) in seconds."""
        self.pick, self.model, self.max_tokens, self.name, self.key = pick, model, max_tokens, name, key
        self.tag, self.timeouts = tag, timeouts
        self.outcomes = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._n = 0
        self.target = concurrency
        self._threads = []
        self.set_concurrency(concurrency)

    def _next_i(self):
        with self._lock:
            self._n += 1
            return self._n

    def _client(self, slot):
        while not self._stop.is_set():
            if slot >= self.target:  # scaled down: idle
                self._stop.wait(0.05)
                continue
            i = self._next_i()
            router = self.pick()
            if router is None:
                o = Outcome(None, i)
                o.kind, o.detail, o.t_end = "transport", "no ready router endpoint", time.monotonic()
                self._record(o)
                self._stop.wait(0.2)
                continue
            body = story(i, self.max_tokens, self.tag)
            body["model"] = self.model
            self._record(completion(router, body, i, *self.timeouts, key=self.key))

    def _record(self, o):
        with self._lock:
            self.outcomes.append(o)

    def set_concurrency(self, n):
        self.target = n
        while len(self._threads) < n:
            slot = len(self._threads)
            t = threading.Thread(target=self._client, args=(slot,), name=f"{self.name}-{slot}", daemon=True)
            self._threads.append(t)
            t.start()

    def abort(self, timeout=5):
        """Clean-up: stop sending and wait a little (the cluster is going away under the clients)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout=120):
        """Lets every request in flight end (bounded), returns all outcomes."""
        self._stop.set()
        join_all(self._threads, timeout, "clients")
        return list(self.outcomes)


def summary(outcomes):
    return dict(Counter((o.kind, o.status, o.code) for o in outcomes))


def assert_all_terminal(outcomes):
    """Every request ended in an answer or a named error (never a cut connection or a hang)."""
    bad = [o for o in outcomes if o.kind not in ("ok", "error") or (o.kind == "error" and not o.code)]
    assert not bad, f"{len(bad)} of {len(outcomes)} requests got no terminal answer: {bad[:8]}; {summary(outcomes)}"


def assert_no_failures(outcomes, at_least=1):
    assert len(outcomes) >= at_least, f"only {len(outcomes)} requests ran (expected at least {at_least})"
    assert_all_terminal(outcomes)
    failed = [o for o in outcomes if o.kind != "ok"]
    assert not failed, f"{len(failed)} of {len(outcomes)} requests failed: {failed[:8]}; {summary(outcomes)}"


class SdkLoad:
    """`concurrency` closed-loop clients of the OpenAI Python SDK, each with its own client (an
    httpx pool: keep-alive connections reused across requests, the SDK's default retries of
    connection errors and 408/409/429/5xx before a response starts) on `base_url` (a Service's
    ClusterIP). Outcomes as Load's: a stream cut after it started is `transport` (the SDK does
    not retry it), an API error with a status is `error` with its code."""

    def __init__(self, base_url, key, model, concurrency, max_tokens=24, tag="sdk"):
        import openai
        self.outcomes = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clients = [openai.OpenAI(base_url=base_url, api_key=key, timeout=60.0) for _ in range(concurrency)]
        self._threads = [threading.Thread(target=self._run, args=(i, model, max_tokens, tag), name=f"sdk-{i}",
                                          daemon=True) for i in range(concurrency)]
        for t in self._threads:
            t.start()

    def _run(self, slot, model, max_tokens, tag):
        import openai
        client, n = self._clients[slot], 0
        while not self._stop.is_set():
            n += 1
            o = Outcome("service", f"{slot}.{n}")
            try:
                stream = client.completions.create(model=model, prompt=f"Story {tag}{slot}.{n}: once upon a time",
                                                   max_tokens=max_tokens, temperature=0, stream=True,
                                                   extra_body={"ignore_eos": True})
                o.status = 200
                for chunk in stream:
                    for ch in chunk.choices:
                        o.tokens += 1
                        o.text += ch.text or ""
                        o.finish = ch.finish_reason or o.finish
                o.kind = "ok" if o.finish else "transport"
                o.detail = "" if o.finish else "stream ended without a finish_reason"
            except openai.APIStatusError as e:
                o.kind, o.status = "error", e.status_code
                o.code = (e.body or {}).get("code") if isinstance(e.body, dict) else None
                o.code = o.code or e.code or str(e.status_code)
                o.detail = str(e)
            except (openai.APIError, OSError, ValueError) as e:  # connection, timeout, cut stream
                o.kind, o.detail = "transport", f"{type(e).__name__}: {e}"
            except Exception as e:  # noqa: BLE001 - httpx errors raised mid-stream
                o.kind, o.detail = "transport", f"{type(e).__name__}: {e}"
            o.t_end = time.monotonic()
            with self._lock:
                self.outcomes.append(o)

    def stop(self, timeout=120):
        self._stop.set()
        join_all(self._threads, timeout, "SDK clients")
        for c in self._clients:
            c.close()
        return list(self.outcomes)
