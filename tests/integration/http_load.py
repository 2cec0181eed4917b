"""One HTTP request to the router as a load test's client makes it, over a raw loopback socket so
that the client can also walk away (close mid-stream, or before any answer), and the outcome it
saw, classified: an answer, a named error, or the cancellation the client itself made. Anything
else (a read that timed out, a malformed or truncated answer) is an outcome of its own that the
soak and chaos tests count as a failure."""
import json
import socket

OK = "ok"
CANCELLED = "cancelled"  # by the client: it closed the connection on purpose
HUNG = "hung"  # no byte within the client's read timeout
BROKEN = "broken"  # the connection ended without a complete answer, or the answer did not parse


def error_outcome(code):
    return f"error:{code}"


class _Reader:
    """Buffered reads on a socket, each bounded by the socket's timeout."""

    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def _more(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server")
        self.buf += chunk

    def until(self, sep):
        while sep not in self.buf:
            self._more()
        out, _, self.buf = self.buf.partition(sep)
        return out

    def exactly(self, n):
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def _chunks(reader):
    """The payloads of a chunked body, as they arrive."""
    while True:
        size = int(reader.until(b"\r\n").split(b";")[0], 16)
        if size == 0:
            reader.until(b"\r\n")
            return
        yield reader.exactly(size)
        reader.exactly(2)


class Result:
    def __init__(self, outcome, status=0, headers=None, body=None, events=None, detail=""):
        self.outcome, self.status, self.headers = outcome, status, headers or {}
        self.body, self.events, self.detail = body, events, detail

    def __repr__(self):
        return f"Result({self.outcome}, status={self.status}, detail={self.detail[:300]!r})"


def _error_code(doc):
    err = doc.get("error") if isinstance(doc, dict) else None
    return err.get("code") if isinstance(err, dict) else None


def request(port, path, body, mode="full", timeout=60.0):
    """POSTs `body` (a dict) to `path`. `mode`: "full" reads the whole answer; "cancel" closes the
    connection after the first SSE event (or the head, if not streamed); "disconnect" closes it
    right after sending. Every read is bounded by `timeout` seconds."""
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError as e:
        return Result(BROKEN, detail=f"connect: {e}")
    try:
        sock.sendall(head + data)
        if mode == "disconnect":
            return Result(CANCELLED)
        reader = _Reader(sock)
        lines = reader.until(b"\r\n\r\n").decode().split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return _read_stream(reader, status, headers, mode)
        if mode == "cancel":
            return Result(CANCELLED, status, headers)
        raw = reader.exactly(int(headers.get("content-length", "0")))
        doc = json.loads(raw)
        if status == 200:
            return Result(OK, status, headers, body=doc)
        code = _error_code(doc)
        return Result(error_outcome(code) if code else BROKEN, status, headers, body=doc, detail=raw.decode())
    except socket.timeout:
        return Result(HUNG, detail=f"no byte for {timeout} s")
    except (OSError, ValueError, IndexError) as e:
        return Result(BROKEN, detail=f"{type(e).__name__}: {e}")
    finally:
        sock.close()


def _read_stream(reader, status, headers, mode):
    """An SSE answer: OK when it ends with [DONE] and carries no error event; a named error when
    its (last) event is an error; CANCELLED when the client closes after the first event."""
    events, pending = [], b""
    for payload in _chunks(reader):
        pending += payload
        while b"\n\n" in pending:
            event, _, pending = pending.partition(b"\n\n")
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    d = line[6:]
                    events.append("[DONE]" if d == b"[DONE]" else json.loads(d))
        if mode == "cancel" and events and events[-1] != "[DONE]":
            return Result(CANCELLED, status, headers, events=events)
    errors = [e for e in events if isinstance(e, dict) and _error_code(e)]
    if errors:
        return Result(error_outcome(_error_code(errors[-1])), status, headers, events=events, detail=json.dumps(errors))
    if status != 200 or not events or events[-1] != "[DONE]":
        return Result(BROKEN, status, headers, events=events, detail=f"status {status}, {len(events)} events")
    return Result(OK, status, headers, events=events)


def stream_text(events, index=0):
    """The text of choice `index` of a streamed completion or chat completion."""
    out = ""
    for e in events:
        if isinstance(e, dict):
            for c in e.get("choices") or []:
                if c.get("index", 0) == index:
                    out += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return out


def rss_bytes(pid):
    """Resident set size of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


