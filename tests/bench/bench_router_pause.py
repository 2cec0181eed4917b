#!/usr/bin/env python3
"""A router paused while another shares its worker, measured (docs/reliability.md, "The
router-worker link"): two routers on one worker (the demo model), 24 streams of 200 tokens on
router B, B SIGSTOPped for PAUSE seconds (20 by default) while router A serves 8 streams of 200
tokens; the control is the same load without the pause, in the same run. Prints A's slowest
stream and its inter-token latency p99 (from the arrival times of the chunks), B's outcomes
after SIGCONT, and the p99 ratio paused / control. Exits non-zero when a stream failed or
nothing was measured. Not part of CI.

usage: tests/bench/bench_router_pause.py [PAUSE_S]
"""
import concurrent.futures
import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration"))
from cluster import MODEL_ID, Router  # noqa: E402
from worker_client import Worker  # noqa: E402

PAUSE = float(sys.argv[1]) if len(sys.argv) > 1 else 20


def stream(port, i, n):
    """One streamed completion: (seconds, chunk arrival times, completion tokens, error code)."""
    body = json.dumps({"model": MODEL_ID, "prompt": f"Story {i}: once upon a time", "max_tokens": n, "stream": True,
                       "ignore_eos": True, "temperature": 0, "stream_options": {"include_usage": True}}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=300)
    t0 = time.time()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    buf, times, toks, err = b"", [], None, None
    while b"data: [DONE]" not in buf:
        d = s.recv(65536)
        if not d:
            break
        now = time.time()
        times += [now] * d.count(b'"text"')
        buf += d
    s.close()
    for line in buf.split(b"\n"):
        if line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            if ev.get("usage"):
                toks = ev["usage"]["completion_tokens"]
            if ev.get("error"):
                err = ev["error"].get("code")
    return time.time() - t0, times, toks, err



def run(pause):
    w = Worker("--kv-blocks", "1024", "--max-running", "32")
    w.settle()
    a = Router([w.endpoint], "--router-id", "a")
    b = Router([w.endpoint], "--router-id", "b")
    try:
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            bs = [pool.submit(stream, b.port, i, 200) for i in range(24)]
            time.sleep(2)
            if pause:
                os.kill(b.proc.pid, signal.SIGSTOP)
            t_stop = time.time()
            as_ = [pool.submit(stream, a.port, 100 + i, 200) for i in range(8)]
            ar = [f.result() for f in as_]
            if pause:
                time.sleep(max(0, pause - (time.time() - t_stop)))
                os.kill(b.proc.pid, signal.SIGCONT)
            br = [f.result() for f in bs]
        itl = sorted(x for _, t, _, _ in ar for x in (t[k + 1] - t[k] for k in range(len(t) - 1)))
        p99 = itl[int(0.99 * (len(itl) - 1))]
        print(f"pause {pause:>4} s: A slowest {max(r[0] for r in ar):.1f} s, A ITL p99 {p99 * 1000:.0f} ms, "
              f"A tokens {[r[2] for r in ar]}, B ok {sum(r[2] == 200 and r[3] is None for r in br)}/24, "
              f"B errors {[r[3] for r in br if r[3]]}, B retries {b.metrics()['switchyard_router_retries_total']}")
        ok = all(r[2] == 200 and r[3] is None for r in ar + br)
        return p99, ok
    finally:
        a.stop()
        b.stop()
        w.stop()


c, ok_c = run(0)
p, ok_p = run(PAUSE)
if not (c > 0 and p > 0):
    sys.exit("measured nothing: no inter-token gaps")
print(f"ITL p99 ratio paused/control: {p / c:.2f}")
sys.exit(0 if ok_c and ok_p else "a stream did not complete with all its tokens")
