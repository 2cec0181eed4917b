"""The router <-> worker link under attack and skew (docs/reliability.md, "The worker link and the
admin surface"), with real worker and router processes on loopback: CURVE keys made by
`switchyard-worker keygen`; a peer without the keys (or with a key the worker does not list) is
refused before any of its frames reaches the worker; a 64 MiB frame drops its connection without the
worker holding it (and a frame over the router's limit, its worker's connection); a worker whose
clock is hours off (libfaketime) still serves and still ends requests at their deadline, because the
wire carries a relative time budget; a client's `timeout` is clamped to the router's maximum."""
import glob
import os
import subprocess
import time

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from cluster import MODEL_ID, Router
from support import needs_model, skip_test
from worker_client import WORKER, Client, Worker

pytestmark = needs_model

HELLO = msgpack.packb({"version": 1, "router_id": "intruder"})


def keygen(prefix):
    """(public, secret) Z85 bytes of a new pair written to PREFIX.pub / PREFIX.key."""
    out = subprocess.run([WORKER, "keygen", "--out", str(prefix)], check=True, capture_output=True, text=True)
    pub = open(f"{prefix}.pub").read().strip()
    assert out.stdout.strip() == pub
    assert oct(os.stat(f"{prefix}.key").st_mode & 0o777) == "0o600"
    return pub.encode(), open(f"{prefix}.key").read().strip().encode()


def dealer(endpoint, server_pub=None, own=None):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if server_pub:
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server_pub, own[0], own[1]
    s.connect(endpoint)
    return s


def frames_in(worker):
    return worker.metrics()["switchyard_worker_link_frames_in_total"]


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    worker, router, stranger = keygen(d / "worker"), keygen(d / "router"), keygen(d / "stranger")
    (d / "routers.txt").write_text("# routers this worker admits\n" + router[0].decode() + "\n")
    return {"dir": d, "worker": worker, "router": router, "stranger": stranger}


@pytest.fixture(scope="module")
def secured(keys):
    w = Worker("--curve-secret-key", str(keys["dir"] / "worker.key"), "--curve-allowed-clients",
               str(keys["dir"] / "routers.txt"))
    yield w
    w.stop()


def test_peers_without_the_right_keys_are_refused_before_the_worker_sees_a_frame(secured, keys):
    assert frames_in(secured) == 0
    plain = dealer(secured.endpoint)  # no CURVE at all
    wrong_server = dealer(secured.endpoint, keys["stranger"][0], keys["router"])  # not the worker's key
    unlisted = dealer(secured.endpoint, keys["worker"][0], keys["stranger"])  # a key the worker does not list
    for s in (plain, wrong_server, unlisted):
        s.send_multipart([b"hello", HELLO])
    for s in (plain, wrong_server, unlisted):
        assert s.poll(1500) == 0, "a peer without the right keys got an answer"
        s.close(0)
    m = secured.metrics()
    assert m["switchyard_worker_link_frames_in_total"] == 0
    assert m["switchyard_worker_link_auth_refused_total"] >= 1  # the unlisted key, refused by the ZAP handler

    listed = dealer(secured.endpoint, keys["worker"][0], keys["router"])
    listed.send_multipart([b"hello", HELLO])
    assert listed.poll(10000), "the listed router got no welcome"
    assert listed.recv_multipart()[0] == b"welcome"
    listed.close(0)
    assert frames_in(secured) == 1


def test_a_router_with_the_keys_serves_and_exports_its_link_counters(secured, keys):
    r = Router([secured.endpoint], "--curve-server-key", str(keys["dir"] / "worker.pub"), "--curve-secret-key",
               str(keys["dir"] / "router.key"))
    try:
        status, _, body = r.post("/v1/completions", {"model": MODEL_ID, "prompt": "The capital of France is",
                                                     "max_tokens": 4})
        assert status == 200, body
        m = r.metrics()
        for name in ("frames_in", "frames_out", "backlogged", "dropped", "backlog_overflow", "closed"):
            assert f"switchyard_router_link_{name}_total" in m
        assert m["switchyard_router_link_frames_out_total"] >= 2  # hello + submit
        assert m["switchyard_router_link_backlog_overflow_total"] == 0
    finally:
        r.stop()
    # A router that has the worker's key but a pair of its own the worker does not list: refused.
    refused = secured.metrics()["switchyard_worker_link_auth_refused_total"]
    r = Router([secured.endpoint], "--curve-server-key", str(keys["dir"] / "worker.pub"), "--curve-secret-key",
               str(keys["dir"] / "stranger.key"), wait_ready=False)
    try:
        end = time.time() + 20
        while secured.metrics()["switchyard_worker_link_auth_refused_total"] == refused and time.time() < end:
            time.sleep(0.1)
        assert secured.metrics()["switchyard_worker_link_auth_refused_total"] > refused
        assert r.get("/ready")[0] == 503
    finally:
        r.stop()


def test_a_64_mib_frame_drops_the_connection_and_the_worker_memory_stays_flat():
    w = Worker()
    try:
        c = Client(w.endpoint)
        assert c.hello()[0] == "welcome"
        c.close()
        before = rss_kib(w.proc.pid)
        s = dealer(w.endpoint)
        mon = s.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        s.send_multipart([b"submit", b"\x00" * (64 << 20)])
        events, end = [], time.time() + 20
        while zmq.EVENT_DISCONNECTED not in events and time.time() < end:
            if mon.poll(500):
                events.append(recv_monitor_message(mon)["event"])
        assert zmq.EVENT_DISCONNECTED in events, "the worker kept the connection of a 64 MiB frame"
        s.disable_monitor()
        s.close(0)
        mon.close(0)
        grown = rss_kib(w.proc.pid) - before
        assert grown < 16 * 1024, f"worker memory grew by {grown} KiB"
        assert frames_in(w) == 1  # the hello only: the big frame never reached the worker
        c = Client(w.endpoint)  # and it serves on
        assert c.hello()[0] == "welcome"
        c.close()
    finally:
        w.stop()


def test_a_worker_sending_a_frame_over_the_routers_limit_is_disconnected():
    """A fake worker (a ROUTER socket) answers the router's hello with a 32 MiB frame: the router
    drops that connection before reading it (the frame is never counted) and serves on."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    r = Router([f"tcp://127.0.0.1:{port}"], wait_ready=False)
    try:
        assert sock.poll(20000), "no hello from the router"
        ident, typ, _ = sock.recv_multipart()
        assert typ == b"hello"
        sock.send_multipart([ident, b"welcome", b"\x00" * (32 << 20)])
        assert mon.poll(20000), "the router kept the connection of a 32 MiB frame"
        assert r.metrics()["switchyard_router_link_frames_in_total"] == 0
        assert r.get("/health")[0] == 200
    finally:
        r.stop()
        sock.disable_monitor()
        mon.close(0)
        sock.close(0)


def libfaketime_or_skip():
    """libfaketime's multi-threaded library, preloaded into the worker itself: the `faketime`
    command would run the worker as its child and not pass the tests' SIGTERM on to it."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1") + glob.glob("/usr/local/lib/faketime/libfaketimeMT.so.1"))
    if not found:
        skip_test("libfaketime is not installed (deploy/setup.sh installs the faketime package)")
    return found[0]


@pytest.mark.parametrize("shift", ["+2h", "-2h"])
def test_a_worker_with_a_shifted_clock_serves_and_honours_deadlines(shift):
    lib = libfaketime_or_skip()
    # The wall clock only: a host's monotonic clock counts from its boot and is never compared
    # across hosts (libfaketime's shifted monotonic clock also upsets timed waits).
    w = Worker(prefix=["env", f"LD_PRELOAD={lib}", f"FAKETIME={shift}", "FAKETIME_DONT_FAKE_MONOTONIC=1"])
    r = Router([w.endpoint], "--request-timeout-s", "3", "--max-request-timeout-s", "3")
    try:
        c = Client(w.endpoint)  # the worker's clock is shifted indeed: its heartbeat says so
        assert c.hello()[0] == "welcome"
        typ, hb = c.recv()
        c.close()
        assert typ == "heartbeat"
        skew_s = hb["unix_ms"] / 1000 - time.time()
        assert abs(abs(skew_s) - 7200) < 600 and (skew_s > 0) == (shift[0] == "+"), skew_s
        status, _, body = r.post("/v1/completions", {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 4})
        assert status == 200, body  # a worker ahead used to refuse every request ("deadline already passed")
        # A client asking for a day gets the router's 3 s; the worker ends the generation itself
        # (finish "deadline"), not the router's lost-frame sweep after deadline + grace.
        status, _, body = r.post("/v1/completions", {"model": MODEL_ID, "prompt": "Tell me a story.",
                                                     "max_tokens": 1900, "ignore_eos": True, "timeout": 86400},
                                 timeout=60)
        assert status == 504, body
        assert b"deadline_exceeded" in body and b"while generating" in body, body
    finally:
        r.stop()
        rc = w.stop()
    assert rc == 0, w.log()  # drained and stopped on its own under the shifted clock
