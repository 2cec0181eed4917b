"""The cache-hit dashboard in a real headless Chromium: after a known workload through a router
with a real redis-server, the page at /dashboard shows the same hit rate as GET /v1/cache/stats,
escapes prompt previews, says so when the stats cannot be read, and a screenshot of it is not
blank. Also checks deploy/grafana-dashboard.json against a live router's /metrics."""
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from decimal import ROUND_HALF_UP, Decimal
from html.parser import HTMLParser

import pytest

from cluster import MODEL_ID, Redis, Router
from support import needs_model
from worker_client import BUILD, ROOT, Worker, free_port, spawn

pytestmark = [
    needs_model,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed (deploy/setup.sh)"),
]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="no chromium or chromium-browser binary (apt-get install chromium)")

ADMIN_KEY, APP_KEY = "sk-dash-ops", "sk-dash-app"
# A prompt with markup: its preview must reach the page as text, never as elements.
HOSTILE = 'Reply "ok" to <b>bold</b> & <img src=x onerror="document.title=\'pwned\'">'
PLAIN = "How do I register an account on a website?"
GRAFANA = os.path.join(ROOT, "deploy", "grafana-dashboard.json")
SCRAPE_LABELS = {"instance", "job"}  # added by Prometheus when it scrapes, not in /metrics itself


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tenants = tmp_path_factory.mktemp("dash") / "tenants.json"
    tenants.write_text(json.dumps({"tenants": [
        {"name": "ops", "keys": [ADMIN_KEY], "admin": True},
        {"name": "app", "keys": [APP_KEY], "cache_previews": True},
    ]}))
    redis = Redis()
    worker = Worker("--kv-blocks", "256", "--max-running", "8")
    router = Router([worker.endpoint], "--redis", redis.url, "--tenants", str(tenants), admin_key=ADMIN_KEY)
    yield router
    assert router.stop() == 0
    worker.stop()
    redis.stop()


def chat(router, key, prompt, temperature=0.0):
    status, headers, body = router.post(
        "/v1/chat/completions",
        {"model": MODEL_ID, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8,
         "temperature": temperature},
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert status == 200, body
    return headers.get("X-Cache", "")


def stats(router):
    status, _, body = router.get("/v1/cache/stats?top=10", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert status == 200, body
    return json.loads(body)


@pytest.fixture(scope="module")
def workload(stack):
    """2 distinct greedy prompts asked 3 times each (2 misses + 4 hits) and one sampled request
    (bypass); returns the stats JSON once all 7 events have landed in Redis."""
    for stored, (key, prompt) in enumerate(((APP_KEY, HOSTILE), (ADMIN_KEY, PLAIN)), start=1):
        outcomes = [chat(stack, key, prompt)]
        deadline = time.time() + 10  # the entry is written to Redis after the response: wait for it
        while stack.metrics().get("switchyard_router_cache_stores_total", 0) < stored and time.time() < deadline:
            time.sleep(0.02)
        outcomes += [chat(stack, key, prompt) for _ in range(2)]
        assert outcomes[1:] == ["hit", "hit"], outcomes
    chat(stack, APP_KEY, PLAIN, temperature=0.9)
    deadline = time.time() + 10
    while True:
        time.sleep(0.5)  # analytics are written asynchronously
        s = stats(stack)
        if s["totals"]["requests"] >= 7 or time.time() > deadline:
            break
    t = s["totals"]
    assert (t["hit"], t["miss"], t["coalesced"], t["bypass"]) == (4, 2, 0, 1), t
    return s


def as_page_shows(rate):
    """The page's (rate * 100).toFixed(1) + " %": JS rounds the exact double, ties away from zero."""
    return str(Decimal(rate * 100).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)) + " %"


def run_chromium(*args, timeout=120):
    with tempfile.TemporaryDirectory(prefix="sy-chromium-") as profile:
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
               f"--user-data-dir={profile}", "--virtual-time-budget=10000", *args]
        proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # chromium's own helpers are in its session
            proc.communicate()
            raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode()


class Dom(HTMLParser):
    """The dumped DOM: attributes by element id, text by element id, all tag names, table cells."""

    def __init__(self, html):
        super().__init__()
        self.attrs_by_id, self.text_by_id, self.tags, self.body_attrs, self.cells = {}, {}, [], {}, []
        self._open = []  # (tag, id) of the enclosing elements
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "body":
            self.body_attrs = a
        if "id" in a:
            self.attrs_by_id[a["id"]] = a
            self.text_by_id[a["id"]] = ""
        if tag == "td":
            self.cells.append("")
        if tag not in ("br", "img", "meta", "input", "link", "hr"):
            self._open.append((tag, a.get("id")))

    def handle_endtag(self, tag):
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break

    def handle_data(self, data):
        for t, i in self._open:
            if i is not None:
                self.text_by_id[i] += data
        if any(t == "td" for t, _ in self._open) and self.cells:
            self.cells[-1] += data


def png_pixels(path):
    """(width, height, list of pixel tuples) of an 8-bit RGB/RGBA, non-interlaced PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        ftype, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 0xFF
            elif ftype == 2:
                line[x] = (line[x] + b) & 0xFF
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
            else:
                assert ftype == 0, f"bad PNG filter {ftype}"
        rows.append(bytes(line))
        prev = line
    pixels = [row[x:x + 3] for row in rows for x in range(0, stride, bpp)]
    return width, height, pixels


def sign_in(stack, key):
    """(status, headers) of posting the sign-in form; urllib does not follow a POST's 303."""
    req = urllib.request.Request(stack.url + "/dashboard/login", data=urllib.parse.urlencode({"key": key}).encode(),
                                 method="POST", headers={"Content-Type": "application/x-www-form-urlencoded"})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **kw):
            return None
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=10) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def test_chart_js_is_served_to_a_signed_in_browser(stack):
    assert stack.get("/dashboard/chart.js")[0] == 401  # tenants configured: nothing is open but /health, /ready
    _, headers = sign_in(stack, ADMIN_KEY)
    cookie = headers["Set-Cookie"].split(";")[0]
    status, headers, body = stack.get("/dashboard/chart.js", headers={"Cookie": cookie})
    assert status == 200, "libjs-chart.js missing? (deploy/setup.sh installs it)"
    assert headers["Content-Type"].startswith("application/javascript")
    assert b"Chart.js v3" in body[:200]


def test_dashboard_needs_an_admin_key_from_the_sign_in_form_never_the_address(stack):
    status, headers, body = stack.get("/dashboard")
    assert status == 401 and b'action="/dashboard/login"' in body and b'type="password"' in body
    assert stack.get(f"/dashboard?key={ADMIN_KEY}")[0] == 401  # a key in the address is not read
    assert sign_in(stack, "wrong")[0] == 401
    assert sign_in(stack, APP_KEY)[0] == 403
    status, headers = sign_in(stack, ADMIN_KEY)
    assert status == 303 and headers["Location"] == "/dashboard"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
    status, headers, body = stack.get("/dashboard", headers={"Cookie": cookie.split(";")[0]})
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'src="/dashboard/chart.js"' in body and b"http://" not in body and b"https://" not in body


@needs_chromium
def test_page_shows_the_api_hit_rate(stack, workload):
    # The key in the fragment goes to the sign-in form, never to the server's address line.
    html = run_chromium("--dump-dom", f"{stack.url}/dashboard#key={ADMIN_KEY}")
    dom = Dom(html)
    assert dom.body_attrs.get("data-ready") == "1", "the page never rendered the stats"
    assert "hidden" in dom.attrs_by_id["error"], dom.text_by_id["error"]
    # The page fetched its own (later) copy of the stats; the workload is long over, so they agree.
    expected = as_page_shows(stats(stack)["totals"]["hit_rate"])
    assert expected == as_page_shows(workload["totals"]["hit_rate"]) == "57.1 %"
    assert dom.text_by_id["hit-rate"].strip() == expected
    for k, v in (("t-requests", "7"), ("t-hit", "4"), ("t-miss", "2"), ("t-coalesced", "0"), ("t-bypass", "1")):
        assert dom.text_by_id[k].strip() == v, k
    # The lookup latency came from /metrics' histogram: 6 lookups happened.
    assert re.fullmatch(r"[\d.]+ (µs|ms|s)", dom.text_by_id["lat-p50"].strip()), dom.text_by_id["lat-p50"]
    assert re.fullmatch(r"[\d.]+ (µs|ms|s)", dom.text_by_id["lat-p99"].strip()), dom.text_by_id["lat-p99"]
    # Top prompts: both asked 3 times; the app tenant's preview is shown as text, not markup.
    assert HOSTILE in dom.cells, dom.cells
    assert "img" not in dom.tags and "pwned" not in re.search(r"<title>(.*?)</title>", html, re.S).group(1)
    counts = [c for c in dom.cells if c == "3"]
    assert len(counts) == 2, dom.cells


@needs_chromium
def test_screenshot_is_not_blank(stack, workload, tmp_path):
    shot = tmp_path / "dashboard.png"
    run_chromium(f"--screenshot={shot}", "--window-size=1280,1000", "--hide-scrollbars",
                 f"{stack.url}/dashboard#key={ADMIN_KEY}")
    width, height, pixels = png_pixels(shot)
    assert (width, height) == (1280, 1000)
    colours = set(pixels)
    assert len(colours) > 20, f"only {len(colours)} distinct colours"
    # The big hit-rate number and the hit-rate line are drawn in the "hit" green (#2e9e5b).
    green = sum(1 for p in pixels if p == b"\x2e\x9e\x5b")
    assert green > 100, f"{green} pixels of the hit colour"


@needs_chromium
def test_page_shows_an_error_when_stats_fail():
    """No --redis: /dashboard still loads (admin), but /v1/cache/stats answers 404 cache_disabled."""
    router = Router([f"tcp://127.0.0.1:{free_port()}"], wait_ready=False)  # no worker needed
    try:
        dom = Dom(run_chromium("--dump-dom", f"{router.url}/dashboard"))  # no --tenants: open
    finally:
        router.stop()
    assert "hidden" not in dom.attrs_by_id["error"]
    assert "404" in dom.text_by_id["error"] and "cache" in dom.text_by_id["error"], dom.text_by_id["error"]
    assert "data-ready" not in dom.body_attrs
    assert dom.text_by_id["hit-rate"].strip() == "—"


def test_grafana_dashboard_queries_existing_metrics(stack, workload):
    board = json.load(open(GRAFANA))
    assert board["__inputs"][0]["name"] == "DS_PROMETHEUS" and board["schemaVersion"] >= 36
    panels = [p for p in board["panels"] if p.get("type") != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    exprs = []
    for p in panels:
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}"
            exprs.append(t["expr"])

    _, _, body = stack.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    exposed = {}  # metric name -> {label: set of values}
    for line in body.decode().splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? ", line)
        if not m or line.startswith("#"):
            continue
        labels = exposed.setdefault(m.group(1), {})
        for k, v in re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""):
            labels.setdefault(k, set()).add(v)

    needed = {"switchyard_router_cache_lookups_total", "switchyard_router_cache_lookup_seconds_bucket",
              "switchyard_router_coalesced_total", "switchyard_router_requests_total",
              "switchyard_router_ttft_seconds_bucket", "switchyard_router_queue_depth",
              "switchyard_router_admission_rejections_total", "switchyard_router_workers"}
    used = set()
    for e in exprs:
        for name, sel in re.findall(r"(switchyard_\w+)(\{[^}]*\})?", e):
            used.add(name)
            assert name in exposed, f"{name} (in {e}) is not in the router's /metrics"
            for k, op, v in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', sel):
                if k in SCRAPE_LABELS:
                    continue
                assert k in exposed[name], f"{name} has no label {k}"
                if op == "=":
                    assert v in exposed[name][k], f'{name}{{{k}="{v}"}} is never exposed'
        for by in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", e):
            for k in filter(None, (x.strip() for x in by.split(","))):
                assert k == "le" or any(k in exposed.get(n, {}) for n in re.findall(r"switchyard_\w+", e)), (k, e)
    assert needed <= used, needed - used
