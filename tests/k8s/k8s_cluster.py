"""One test's whole "Kubernetes cluster": the network, the DNS, the kubelet, worker and router pods
with the project's binaries, and the clients. Closing it removes every process, namespace, the
bridge and the /etc/netns files, whatever state the test left."""
import math
import os
import subprocess
import time

from k8s_dns import DnsServer
from k8s_features import has_flag
from k8s_kubelet import Kubelet, http_get
from k8s_load import ROUTER_PORT, Load
from k8s_net import Network

from cluster import MODEL_ID, ROUTER
from http_load import rss_bytes
from worker_client import MODEL, WORKER, parse_prometheus

WORKER_SERVICE = "workers.switchyard.svc.cluster.local"
WORKER_PORT, METRICS_PORT = 5555, 9100


class Cluster:
    # Heartbeat timeout: 5 s, not the router's 2 s default, so that a worker starved of CPU for a
    # moment on a small shared machine is not declared dead (and its streams ended) in scenarios
    # where no worker dies; the SIGKILL scenario sets its own.
    def __init__(self, logdir, dns_interval_s=1.0, router_lag_s=0.5, heartbeat_timeout_ms=5000, grace_s=30.0):
        self.logdir = logdir
        self.dns_interval_s = dns_interval_s
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.grace_s = grace_s
        self.model = MODEL_ID
        self.loads = []
        self.net = Network()
        self.dns = self.kubelet = None
        try:
            self.dns = DnsServer(self.net, logdir)
            self.kubelet = Kubelet(self.net, self.dns, logdir, WORKER_SERVICE, router_lag_s=router_lag_s)
        except Exception:
            self.close()
            raise

    # ---- pods --------------------------------------------------------------------------------

    def default_pre_stop_s(self):
        """Long enough for every router to re-resolve (one interval) and a margin."""
        return self.dns_interval_s + 1.0

    def worker(self, max_running=4, kv_blocks=128, extra=(), name=None, model=None):
        drain = ["--drain-timeout-s", str(int(self.grace_s - self.default_pre_stop_s() - 3))] \
            if has_flag(WORKER, "--drain-timeout-s") else []

        def argv(ip):
            return [WORKER, "serve", "--model", model or MODEL, "--listen", f"tcp://0.0.0.0:{WORKER_PORT}", "--metrics-host",
                    "0.0.0.0", "--metrics-port", str(METRICS_PORT), "--threads", "1", "--kv-blocks", str(kv_blocks),
                    "--max-running", str(max_running), "--max-context", "512", "--worker-id", f"worker-{ip}", *drain,
                    *extra]

        # Readiness: the worker's /ready once it has one (404 before), else /health.
        return self.kubelet.create("worker", argv, METRICS_PORT, ["/ready", "/health"], name=name)

    def router(self, extra=(), name=None):
        drain = ["--drain-timeout-s", str(int(self.grace_s - self.default_pre_stop_s() - 3))] \
            if has_flag(ROUTER, "--drain-timeout-s") else []

        hb = ["--heartbeat-timeout-ms", str(self.heartbeat_timeout_ms)] if self.heartbeat_timeout_ms else []

        def argv(ip):
            return [ROUTER, "--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--workers-dns",
                    f"{WORKER_SERVICE}:{WORKER_PORT}", "--dns-interval-s", str(self.dns_interval_s),
                    "--http-threads", "1", "--router-id", f"router-{ip}", *hb, *drain, *extra]

        return self.kubelet.create("router", argv, ROUTER_PORT, ["/ready"], resolver=self.dns.ip, name=name)

    def start(self, workers=0, routers=0, worker_kw=None, router_kw=None, timeout=60):
        ws = [self.worker(**(worker_kw or {})) for _ in range(workers)]
        rs = [self.router(**(router_kw or {})) for _ in range(routers)]
        self.kubelet.wait_ready(ws + rs, timeout)
        return ws, rs

    def delete(self, pod, pre_stop_s=None, grace_s=None):
        return self.kubelet.delete(pod, self.default_pre_stop_s() if pre_stop_s is None else pre_stop_s,
                                   self.grace_s if grace_s is None else grace_s)

    # ---- observation -------------------------------------------------------------------------

    def metrics(self, pod):
        port = ROUTER_PORT if pod.kind == "router" else METRICS_PORT
        status, body = http_get(pod.ip, port, "/metrics", timeout=2)
        if status != 200:
            raise RuntimeError(f"/metrics of {pod.name}: {status} {body!r}")
        return parse_prometheus(body.decode())

    def status(self, pod, path):
        port = ROUTER_PORT if pod.kind == "router" else METRICS_PORT
        return http_get(pod.ip, port, path, timeout=2)[0]

    @staticmethod
    def cpu_seconds(pod):
        """User + system CPU time the pod's process has used (its /proc/PID/stat)."""
        fields = open(f"/proc/{pod.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def rss_mib(pod):
        return rss_bytes(pod.proc.pid) / (1 << 20)

    def router_workers(self, router):
        """{state: count} of switchyard_router_workers."""
        m = self.metrics(router)
        return {k.split('"')[1]: v for k, v in m.items() if k.startswith("switchyard_router_workers{")}

    def wait_until(self, what, cond, timeout, period=0.1):
        """Polls `cond()` until truthy (returns it) or fails after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = cond()
            except (RuntimeError, OSError) as e:
                last = e
            if last and not isinstance(last, Exception):
                return last
            time.sleep(period)
        raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")

    def wait_routers_see(self, routers, n_ready, timeout=20):
        for r in routers:
            self.wait_until(f"{r.name} to have {n_ready} ready workers",
                            lambda r=r: self.router_workers(r).get("ready", 0) >= n_ready
                            and self.status(r, "/ready") == 200, timeout)

    def sockets_to(self, pod, ip):
        """TCP sockets from inside `pod` to `ip` that are open or opening (ESTAB, SYN-SENT, SYN-RECV,
        CLOSE-WAIT); sockets this side has closed (FIN-WAIT, TIME-WAIT, LAST-ACK...) are not listed."""
        p = subprocess.run(pod.host.exec_argv(["ss", "-Htan", "dst", ip]), capture_output=True, text=True, timeout=10)
        if p.returncode != 0:
            raise RuntimeError(f"ss failed: {p.stderr}")
        open_states = ("ESTAB", "SYN-SENT", "SYN-RECV", "CLOSE-WAIT")
        rows = (line.split() for line in p.stdout.splitlines())
        return [f"{f[0]} {f[-1]}" for f in rows if f and f[0] in open_states]

    def worker_requests(self, worker):
        """Requests the worker has been given (finished, running or waiting)."""
        m = self.metrics(worker)
        return (sum(v for k, v in m.items() if k.startswith("switchyard_worker_requests_finished_total"))
                + m.get("switchyard_worker_requests_running", 0) + m.get("switchyard_worker_requests_waiting", 0))

    def active_requests(self, routers):
        """Sum over routers of switchyard_router_active_requests for the model (the per-model
        series when the router has it, else the router-wide gauge); (value, series used)."""
        total, series = 0.0, set()
        for r in routers:
            m = self.metrics(r)
            key = f'switchyard_router_active_requests{{model="{self.model}"}}'
            if key in m:
                total += m[key]
                series.add("per-model")
            else:
                total += m.get("switchyard_router_active_requests", 0)
                series.add("router-wide")
        return total, series

    # ---- clients -----------------------------------------------------------------------------

    def load(self, concurrency, routers=None, max_tokens=24, name="load"):
        """Closed-loop streaming clients; through the readiness-following Service unless a fixed
        list of router pods is given (then round robin over them)."""
        if routers is None:
            svc = self.kubelet.router_service
            ready = {p.ip for p in self.kubelet.live("router") if p.ready and not p.terminating}
            self.wait_until("the ready routers behind the Service", lambda: ready and set(svc.endpoints()) == ready,
                            svc.lag_s + 5, 0.05)
            pick = svc.pick
        else:
            ips, n = [r.ip for r in routers], [0]

            def pick():
                n[0] += 1
                return ips[n[0] % len(ips)]
        ld = Load(pick, self.model, concurrency, max_tokens, name)
        self.loads.append(ld)
        return ld

    def close(self):
        for ld in self.loads:
            ld._stop.set()  # no new requests; those in flight end when the pods go
        if self.kubelet:
            self.kubelet.close()
        for ld in self.loads:
            ld.abort()
        if self.dns:
            self.dns.stop()
        self.net.close()

    def report(self):
        return self.kubelet.report() if self.kubelet else ""


def desired_replicas(active, target, lo, hi):
    """The HPA rule: ceil(metric / target), clamped."""
    return max(lo, min(hi, math.ceil(active / target))) if active > 0 else lo
