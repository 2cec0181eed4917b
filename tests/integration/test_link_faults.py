"""Faults at the router-worker link, with real router and worker processes on loopback
(docs/reliability.md, "The router-worker link"): a router paused while another shares its worker,
and a model whose only worker died. Each fault is made for real (SIGSTOP, kill -9); nothing is
faked."""
import concurrent.futures
import os
import signal
import time

from cluster import MODEL_ID, Router
from http_load import OK, request, stream_text
from support import require_model, wait_for
from worker_client import Worker

require_model()


def stream_body(i, max_tokens):
    return {"model": MODEL_ID, "prompt": f"Story {i}: once upon a time", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0, "stream_options": {"include_usage": True}}


def completion_tokens(result):
    usage = [e["usage"] for e in result.events if isinstance(e, dict) and e.get("usage")]
    return usage[-1]["completion_tokens"] if usage else None


def test_a_paused_router_recovers_its_streams_and_does_not_hold_up_another():
    """Two routers share one worker. Router B has 12 streams running when it is SIGSTOPped for
    four heartbeat timeouts; router A serves 4 streams meanwhile. A's streams end while B is
    still stopped (B's full connection does not hold A's frames back), and after SIGCONT B
    sees that it stalled (not its worker): no worker declared dead, nothing re-dispatched, every
    one of its streams completes with all its tokens."""
    worker = Worker("--kv-blocks", "512", "--max-running", "16")
    a = Router([worker.endpoint], "--router-id", "router-a")
    b = Router([worker.endpoint], "--router-id", "router-b")
    stopped = False
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            b_streams = [pool.submit(request, b.port, "/v1/completions", stream_body(i, 160), timeout=120)
                         for i in range(12)]
            # All of B's streams are running on the worker before the pause.
            wait_for("B's streams to start", lambda: b.metrics().get("switchyard_router_ttft_seconds_count", 0) >= 12,
                     timeout=60)
            os.kill(b.proc.pid, signal.SIGSTOP)
            stopped = True
            t_stop = time.time()
            a_streams = [pool.submit(request, a.port, "/v1/completions", stream_body(100 + i, 32), timeout=60)
                         for i in range(4)]
            a_results = [f.result() for f in a_streams]
            a_done_s = time.time() - t_stop
            # Hold B stopped for at least 8 s (4 x its 2 s heartbeat timeout) in all.
            time.sleep(max(0.0, 8.0 - a_done_s))
            os.kill(b.proc.pid, signal.SIGCONT)
            stopped = False
            b_results = [f.result() for f in b_streams]
        assert [r.outcome for r in a_results] == [OK] * 4, a_results
        assert [completion_tokens(r) for r in a_results] == [32] * 4
        assert [r.outcome for r in b_results] == [OK] * 12, b_results
        assert [completion_tokens(r) for r in b_results] == [160] * 12
        log = open(b.log.name).read()
        assert "missed its heartbeats" not in log
        assert "this router stalled for" in log
        mb = b.metrics()
        assert mb["switchyard_router_stalls_total"] >= 1
        assert mb["switchyard_router_retries_total"] == 0
        assert mb["switchyard_router_redispatched_total"] == 0
        assert "missed its heartbeats" not in open(a.log.name).read()
        assert worker.metrics()["switchyard_worker_link_dropped_total"] == 0
    finally:
        if stopped:
            os.kill(b.proc.pid, signal.SIGCONT)
        a.stop()
        b.stop()
        worker.stop()


def test_a_model_whose_only_worker_died_answers_503_no_workers_instead_of_hanging():
    """One router, one worker, kill -9 of the worker: a request sent at once waits out the short
    no-worker timeout (a replacement could still come) and then gets 503 no_workers; one sent
    after it is refused at once with Retry-After. A worker back at the address serves again."""
    worker = Worker("--kv-blocks", "256", "--max-running", "4")
    r = Router([worker.endpoint], "--heartbeat-timeout-ms", "1000", "--no-worker-timeout-s", "3")
    body = {"model": MODEL_ID, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    try:
        assert request(r.port, "/v1/completions", body).outcome == OK
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()
        t0 = time.time()
        first = request(r.port, "/v1/completions", body, timeout=30)
        waited = time.time() - t0
        assert first.status == 503 and first.outcome == "error:no_workers", first
        assert waited < 15, waited  # heartbeat timeout + no-worker timeout, not the 600 s deadline
        t0 = time.time()
        later = request(r.port, "/v1/completions", dict(body, stream=True), timeout=30)
        assert later.status == 503 and later.outcome == "error:no_workers", later
        assert later.headers.get("retry-after") == "2"
        assert time.time() - t0 < 5
        wait_for("both counted", lambda: r.metrics().get("switchyard_router_no_workers_total") == 2, timeout=5)
        # A new worker process at the same address: served again.
        port = int(worker.endpoint.rsplit(":", 1)[1])
        back = Worker("--kv-blocks", "256", "--max-running", "4", port=port)
        try:
            wait_for("the worker back", lambda: request(r.port, "/v1/completions", body).outcome == OK, timeout=60,
                     every=0.5)
        finally:
            back.stop()
    finally:
        r.stop()
        worker.stop()


def test_frames_lost_on_the_link_leave_no_hole_in_any_stream():
    """A worker that loses tokens frames on the link (`--fault-inject drop-frames:3`: its first
    3 frames that are not a request's last are never sent). Each gap is seen from the next
    frame's sequence number and the stream resumes from what the client has: 6 concurrent
    streams all complete with all their tokens, no error event, and the same text as the same
    requests once the drops are spent."""
    worker = Worker("--kv-blocks", "512", "--max-running", "16", "--fault-inject", "drop-frames:3")
    r = Router([worker.endpoint])
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            lossy = list(pool.map(lambda i: request(r.port, "/v1/completions", stream_body(200 + i, 40), timeout=120),
                                  range(6)))
        assert worker.metrics()["switchyard_worker_fault_frames_dropped_total"] == 3
        gaps = r.metrics()["switchyard_router_frame_gaps_total"]
        clean = [request(r.port, "/v1/completions", stream_body(200 + i, 40), timeout=120) for i in range(6)]
        assert [x.outcome for x in lossy] == [OK] * 6, [x.detail for x in lossy]
        assert [completion_tokens(x) for x in lossy] == [40] * 6
        assert [x.outcome for x in clean] == [OK] * 6
        assert [stream_text(x.events) for x in lossy] == [stream_text(x.events) for x in clean]
        # Every drop was a gap the router saw (a drop inside an attempt it had already given up
        # on goes unseen), and none was charged to the worker or the retry budget.
        assert 1 <= gaps <= 3
        m = r.metrics()
        assert m["switchyard_router_retries_total"] == 0
        assert m.get("switchyard_router_worker_ejections_total", 0) == 0
    finally:
        r.stop()
        worker.stop()


def test_a_stream_its_live_worker_stopped_sending_resumes_after_the_try_idle_timeout():
    """A request lost inside a live worker (`--fault-inject mute-first:1`: the first request sends
    its first tokens frame, then nothing, while the worker runs it and heartbeats on). Before, its
    client waited out the request's deadline (605 s by default); with `--try-idle-timeout-s 2` the
    router resumes the stream from what the client has: it completes with all its tokens and the
    text the same request gets from a healthy run."""
    worker = Worker("--kv-blocks", "256", "--max-running", "8", "--fault-inject", "mute-first:1")
    r = Router([worker.endpoint], "--try-idle-timeout-s", "2")
    try:
        muted = request(r.port, "/v1/completions", stream_body(300, 48), timeout=60)
        clean = request(r.port, "/v1/completions", stream_body(300, 48), timeout=60)
        assert muted.outcome == OK, muted
        assert completion_tokens(muted) == 48
        assert clean.outcome == OK and stream_text(muted.events) == stream_text(clean.events)
        m = r.metrics()
        assert m["switchyard_router_idle_tries_total"] == 1
        assert m["switchyard_router_retries_total"] == 0
        assert "missed its heartbeats" not in open(r.log.name).read()
    finally:
        r.stop()
        worker.stop()
