"""The CPU overlay's router and worker command lines, as rendered, run the binaries this build
made: the worker and router start with exactly those arguments (only addresses, ports, the model
path, the pod name, the tenants, link-key and cache-MAC-key paths replaced by local ones: loopback, free ports), the probes
the manifests name answer as they expect (/health, then /ready once serving; the router ready once
it found the worker through the --workers-dns name), a request is answered, and SIGTERM follows
the order the grace period is sized for: the router's /ready turns 503 at once while it still
admits requests for --shutdown-delay-s, and each process exits within its grace period. With the
model file missing at the manifest's --model path (an unfilled models volume), the worker exits
at once with an error that names the path and the docs' "Model source".

    .venv/bin/python tests/deploy/test_manifest_smoke.py --router R --worker W   (ctest: deploy/manifest-smoke)"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import (ROOT, Report, args_of, flag_value, need_modules, parse_args, render,  # noqa: E402
                           secrets_dir, skip)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, key=None, timeout=30):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as f:
            return f.status, f.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return None, str(e).encode()


def wait_for(pred, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def replace_value(argv, flag, value):
    out = list(argv)
    i = out.index(flag)
    out[i + 1] = value
    return out


def main():
    a = parse_args()
    need_modules("yaml")
    for b in (a.router, a.worker):
        if not os.access(b, os.X_OK):
            skip(f"{b} is not built")
    docs = render("overlays/cpu")
    deps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    wspec, rspec = (deps[n]["spec"]["template"]["spec"] for n in ("switchyard-worker", "switchyard-router"))
    wargv, rargv = args_of(wspec["containers"][0]), args_of(rspec["containers"][0])
    model = os.path.join(ROOT, "models", os.path.basename(flag_value(wargv, "--model")))
    if not os.path.exists(model):
        skip(f"{model} is missing")
    zmq, metrics, http_port = free_port(), free_port(), free_port()
    wargv = replace_value(wargv, "--model", model)
    wargv = replace_value(wargv, "--listen", f"tcp://127.0.0.1:{zmq}")
    wargv = replace_value(wargv, "--metrics-host", "127.0.0.1")
    wargv = replace_value(wargv, "--metrics-port", str(metrics))
    wargv = replace_value(wargv, "--worker-id", "switchyard-worker-smoke")
    rargv = replace_value(rargv, "--host", "127.0.0.1")
    rargv = replace_value(rargv, "--port", str(http_port))
    rargv = replace_value(rargv, "--workers-dns", f"localhost:{zmq}")
    rargv = replace_value(rargv, "--router-id", "switchyard-router-smoke")
    rargv = replace_value(rargv, "--metrics-host", "127.0.0.1")
    rargv = replace_value(rargv, "--metrics-port", str(free_port()))
    rargv = replace_value(rargv, "--tenants", os.path.join(secrets_dir(), "tenants.json"))
    # The link keys: the Secret's files (make-secrets.py's link-keys/), where the pods mount them.
    keys = os.path.join(secrets_dir(), "link-keys")
    wargv = replace_value(wargv, "--curve-secret-key", os.path.join(keys, "worker.key"))
    wargv = replace_value(wargv, "--curve-allowed-clients", os.path.join(keys, "routers.pub"))
    rargv = replace_value(rargv, "--curve-server-key", os.path.join(keys, "worker.pub"))
    rargv = replace_value(rargv, "--curve-secret-key", os.path.join(keys, "router.key"))
    rargv = replace_value(rargv, "--cache-mac-key-file", os.path.join(secrets_dir(), "cache-mac.key"))
    redis = None
    if shutil.which("redis-server"):
        rport = free_port()
        # With the generated password, as the base's Redis requires it.
        with open(os.path.join(secrets_dir(), "redis-password")) as f:
            password = f.read().strip()
        redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--requirepass", password],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rargv = replace_value(rargv, "--redis", f"redis://:{password}@127.0.0.1:{rport}/0")
    else:
        rargv = replace_value(rargv, "--redis", f"redis://127.0.0.1:{free_port()}/0")  # down: the cache is bypassed
    with open(os.path.join(secrets_dir(), "tenants.json")) as f:
        key = json.load(f)["tenants"][0]["keys"][0]
    r = Report()
    # The models volume not filled yet: the manifest's own --model path, with nothing there.
    missing = os.path.join(tempfile.mkdtemp(prefix="switchyard-smoke-models-"), os.path.basename(model))
    try:
        out = subprocess.run([a.worker] + replace_value(wargv, "--model", missing), capture_output=True, text=True,
                             timeout=10)
        r.check(out.returncode == 1 and missing in out.stderr and "Model source" in out.stderr,
                "a worker without its model file exits at once, naming the path and docs/operations.md's \"Model source\"",
                f"exit {out.returncode}: {out.stderr.strip()}")
    except subprocess.TimeoutExpired:
        r.check(False, "a worker without its model file exits at once", "still running after 10 s")
    logs = tempfile.mkdtemp(prefix="switchyard-smoke-")
    wlog, rlog = open(os.path.join(logs, "worker.log"), "w"), open(os.path.join(logs, "router.log"), "w")
    print("worker: " + " ".join(wargv))
    print("router: " + " ".join(rargv))
    worker = subprocess.Popen([a.worker] + wargv, stdout=wlog, stderr=subprocess.STDOUT)
    router = subprocess.Popen([a.router] + rargv, stdout=rlog, stderr=subprocess.STDOUT)
    wurl, rurl = f"http://127.0.0.1:{metrics}", f"http://127.0.0.1:{http_port}"
    try:
        r.check(wait_for(lambda: http(wurl + "/health", timeout=2)[0] == 200 or worker.poll() is not None, 30)
                and worker.poll() is None, "worker starts with the manifest's arguments and answers /health")
        r.check(wait_for(lambda: http(wurl + "/ready", timeout=2)[0] == 200 or worker.poll() is not None, 120)
                and worker.poll() is None, "worker /ready turns 200 once serving")
        r.check(router.poll() is None and http(rurl + "/health", timeout=2)[0] == 200,
                "router starts with the manifest's arguments and answers /health")
        dns_s = float(flag_value(rargv, "--dns-interval-s"))
        r.check(wait_for(lambda: http(rurl + "/ready", timeout=2)[0] == 200, dns_s + 30),
                f"router /ready turns 200 once it found the worker through --workers-dns (every {dns_s:g} s)")
        body = {"model": os.path.basename(model)[:-5], "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Hi!"}]}
        status, out = http(rurl + "/v1/chat/completions", body, key)
        r.check(status == 200, "a chat completion through the router is answered", out[:200].decode(errors="replace"))

        delay, rgrace = float(flag_value(rargv, "--shutdown-delay-s")), rspec["terminationGracePeriodSeconds"]
        t0 = time.time()
        router.send_signal(signal.SIGTERM)
        r.check(wait_for(lambda: http(rurl + "/ready", timeout=1)[0] == 503, 2), "router /ready turns 503 at SIGTERM")
        status, out = http(rurl + "/v1/chat/completions", body, key)
        r.check(status == 200 and time.time() - t0 < delay,
                f"router still answers requests during --shutdown-delay-s ({delay:g} s)", f"{status} {out[:120]!r}")
        try:
            router.wait(timeout=rgrace)
        except subprocess.TimeoutExpired:
            pass
        took = time.time() - t0
        r.check(router.poll() == 0 and delay - 0.5 <= took < rgrace,
                f"router exits {took:.1f} s after SIGTERM: after the shutdown delay, within the grace period {rgrace} s")
        wgrace = wspec["terminationGracePeriodSeconds"]
        t0 = time.time()
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=wgrace)
        except subprocess.TimeoutExpired:
            pass
        took = time.time() - t0
        r.check(worker.poll() == 0 and took < wgrace, f"idle worker exits {took:.1f} s after SIGTERM (grace {wgrace} s)")
    finally:
        for p in (router, worker, redis):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        wlog.close()
        rlog.close()
    if r.failed:
        for name in ("worker.log", "router.log"):
            print(f"--- {name}")
            print(open(os.path.join(logs, name)).read()[-3000:])
    shutil.rmtree(logs, ignore_errors=True)
    r.close()


if __name__ == "__main__":
    main()
