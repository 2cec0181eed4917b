"""One test's whole "Kubernetes cluster": the network, the DNS, the kubelet, worker and router pods
with the project's binaries, and the clients. Closing it removes every process, namespace, the
bridge and the /etc/netns files, whatever state the test left."""
import math
import os
import shutil
import subprocess
import tempfile
import time

from k8s_dns import DnsServer
from k8s_features import has_flag
from k8s_kubelet import Kubelet, http_get
from k8s_load import ROUTER_PORT, Load
from k8s_net import Network

from cluster import MODEL_ID, ROUTER
from http_load import rss_bytes
from worker_client import MODEL, WORKER, parse_prometheus

import deploy_common

WORKER_SERVICE = "workers.switchyard.svc.cluster.local"
WORKER_PORT, METRICS_PORT = 5555, 9100
# The TTL of the cluster DNS's answers for Services (CoreDNS's kubernetes plugin's default), which
# the overlay's minReadySeconds and worker preStop are sized for.
CLUSTER_DNS_TTL_S = 5


class Cluster:
    # Heartbeat timeout: 5 s, not the router's 2 s default, so that a worker starved of CPU for a
    # moment on a small shared machine is not declared dead (and its streams ended) in scenarios
    # where no worker dies; the SIGKILL scenario sets its own.
    #
    # With `overlay` (k8s_manifest.load()), the pods are the rendered overlay's instead: its
    # command lines (tenants, CURVE link keys, Redis, the metrics port), probes, preStop, grace
    # periods and the Service names it uses, with a Redis pod; the other timing arguments then
    # do not apply.
    def __init__(self, logdir, dns_interval_s=1.0, router_lag_s=0.5, heartbeat_timeout_ms=5000, grace_s=30.0,
                 overlay=None):
        self.logdir = logdir
        self.overlay = overlay
        self.dns_interval_s = dns_interval_s
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.grace_s = grace_s
        self.model = MODEL_ID
        self.api_key = None
        self.worker_service = WORKER_SERVICE
        self.router_metrics_port, self.worker_metrics_port = ROUTER_PORT, METRICS_PORT
        services = {}
        self.pod_root = None
        if overlay:
            r, w = overlay.router, overlay.worker
            self.dns_interval_s = float(deploy_common.flag_value(r.argv("r", "", ""), "--dns-interval-s"))
            self.heartbeat_timeout_ms = None
            self.api_key = overlay.api_key()
            self.worker_service = overlay.service_name("switchyard-worker")
            services = {"redis": overlay.service_name("switchyard-redis")}
            self.router_metrics_port, self.worker_metrics_port = r.port("metrics"), w.port("metrics")
            self.model = os.path.basename(deploy_common.flag_value(w.argv("w", "", ""), "--model"))[:-len(".gguf")]
            self.pod_root = tempfile.mkdtemp(prefix="sy-k8s-pods-")  # the Secret volumes (0700: root only)
            for t in (r, w, overlay.redis):
                t.materialize(self.pod_root)
        self.loads = []
        self.proxy = None
        self.net = Network()
        self.dns = self.kubelet = self.dns_cache = None
        try:
            # With the overlay: answers with CoreDNS's TTL, and the pods ask a caching forwarder
            # (CoreDNS's cache, NodeLocal DNSCache) that keeps them that long.
            self.dns = DnsServer(self.net, logdir, ttl=CLUSTER_DNS_TTL_S if overlay else 0)
            if overlay:
                self.dns_cache = DnsServer(self.net, logdir, upstream=self.dns, name="dns-cache")
            self.kubelet = Kubelet(self.net, self.dns, logdir, self.worker_service, router_lag_s=router_lag_s,
                                   services=services)
        except Exception:
            self.close()
            raise

    # ---- pods --------------------------------------------------------------------------------

    def default_pre_stop_s(self):
        """Long enough for every router to re-resolve (one interval) and a margin."""
        return self.dns_interval_s + 1.0

    def overlay_pod(self, template, kind, name=None, pending_s=0):
        """A pod of the overlay's Deployment `template` (k8s_manifest.Template): its command line,
        environment and probes; the Secret volumes under pod_root, the models volume = the
        model's folder here; resolv.conf as the kubelet writes it for the namespace."""
        binary = {"router": ROUTER, "worker": WORKER}.get(kind)
        models = os.path.dirname(MODEL)

        def argv(ip, name):
            a = template.argv(name, self.pod_root, models)
            return a if template.container.get("command") else [binary, *a]

        return self.kubelet.create(kind, argv, template.probes, name=name, resolver=self.dns_cache.ip,
                                   search=self.overlay.search(), env_fn=template.env, prefix=template.name + "-",
                                   pending_s=pending_s)

    def template(self, pod):
        return {"router": self.overlay.router, "worker": self.overlay.worker, "redis": self.overlay.redis}[pod.kind] \
            if self.overlay else None

    def redis(self):
        return self.overlay_pod(self.overlay.redis, "redis")

    def worker(self, max_running=4, kv_blocks=128, extra=(), name=None, model=None, pending_s=0):
        if self.overlay:
            return self.overlay_pod(self.overlay.worker, "worker", name, pending_s)
        drain = ["--drain-timeout-s", str(int(self.grace_s - self.default_pre_stop_s() - 3))] \
            if has_flag(WORKER, "--drain-timeout-s") else []

        def argv(ip):
            return [WORKER, "serve", "--model", model or MODEL, "--listen", f"tcp://0.0.0.0:{WORKER_PORT}",
                    "--metrics-host", "0.0.0.0", "--metrics-port", str(METRICS_PORT), "--threads", "1", "--kv-blocks", str(kv_blocks),
                    "--max-running", str(max_running), "--max-context", "512", "--worker-id", f"worker-{ip}", *drain,
                    *extra]

        probes = self.kubelet.readiness_probe(METRICS_PORT, "/ready")
        return self.kubelet.create("worker", lambda ip, _: argv(ip), probes, name=name)

    def router(self, extra=(), name=None):
        if self.overlay:
            return self.overlay_pod(self.overlay.router, "router", name)
        drain = ["--drain-timeout-s", str(int(self.grace_s - self.default_pre_stop_s() - 3))] \
            if has_flag(ROUTER, "--drain-timeout-s") else []

        hb = ["--heartbeat-timeout-ms", str(self.heartbeat_timeout_ms)] if self.heartbeat_timeout_ms else []

        def argv(ip):
            return [ROUTER, "--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--workers-dns",
                    f"{WORKER_SERVICE}:{WORKER_PORT}", "--dns-interval-s", str(self.dns_interval_s),
                    "--http-threads", "1", "--router-id", f"router-{ip}", *hb, *drain, *extra]

        probes = self.kubelet.readiness_probe(ROUTER_PORT, "/ready")
        return self.kubelet.create("router", lambda ip, _: argv(ip), probes, resolver=self.dns.ip, name=name)

    def start(self, workers=None, routers=None, worker_kw=None, router_kw=None, timeout=60):
        """`workers` and `routers` pods (with the overlay: its replicas by default, and its Redis
        first), once all are ready."""
        if self.overlay:
            workers = self.overlay.worker.replicas if workers is None else workers
            routers = self.overlay.router.replicas if routers is None else routers
            self.kubelet.wait_ready(self.redis(), timeout)
        ws = [self.worker(**(worker_kw or {})) for _ in range(workers or 0)]
        rs = [self.router(**(router_kw or {})) for _ in range(routers or 0)]
        self.kubelet.wait_ready(ws + rs, timeout)
        return ws, rs

    def delete(self, pod, pre_stop_s=None, grace_s=None, before_sigterm=None):
        """Graceful deletion: the overlay's preStop and grace period for its pods, else the suite's."""
        t = self.template(pod)
        if pre_stop_s is None:
            pre_stop_s = t.pre_stop_s if t else self.default_pre_stop_s()
        if grace_s is None:
            grace_s = t.grace_s if t else self.grace_s
        return self.kubelet.delete(pod, pre_stop_s, grace_s, before_sigterm)

    # ---- observation -------------------------------------------------------------------------

    def metrics(self, pod):
        port = self.router_metrics_port if pod.kind == "router" else self.worker_metrics_port
        status, body = http_get(pod.ip, port, "/metrics", timeout=2)
        if status != 200:
            raise RuntimeError(f"/metrics of {pod.name}: {status} {body!r}")
        return parse_prometheus(body.decode())

    def status(self, pod, path):
        port = ROUTER_PORT if pod.kind == "router" else self.worker_metrics_port
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

    def load(self, concurrency, routers=None, max_tokens=24, name="load", tag="", timeouts=(90.0, 30.0)):
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
        ld = Load(pick, self.model, concurrency, max_tokens, name, key=self.api_key, tag=tag, timeouts=timeouts)
        self.loads.append(ld)
        return ld

    def cluster_ip(self):
        """The router Service's ClusterIP (k8s_proxy: kube-proxy), once it forwards to the ready
        routers."""
        from k8s_proxy import ClusterIP
        if self.proxy is None:
            self.proxy = ClusterIP(self.net, self.kubelet.router_service, ROUTER_PORT)
        ready = {p.ip for p in self.kubelet.live("router") if p.ready and not p.terminating}
        self.wait_until("the ClusterIP forwarding to the ready routers",
                        lambda: ready and set(self.proxy.applied or ()) == ready, self.proxy.service.lag_s + 5, 0.05)
        return self.proxy.ip

    def close(self):
        for ld in self.loads:
            ld._stop.set()  # no new requests; those in flight end when the pods go
        if self.kubelet:
            self.kubelet.close()
        for ld in self.loads:
            ld.abort()
        if self.proxy:
            self.proxy.close()
        if self.dns_cache:
            self.dns_cache.stop()
        if self.dns:
            self.dns.stop()
        self.net.close()
        if self.pod_root:
            shutil.rmtree(self.pod_root, ignore_errors=True)

    def report(self):
        return self.kubelet.report() if self.kubelet else ""


def desired_replicas(active, target, lo, hi):
    """The HPA rule: ceil(metric / target), clamped."""
    return max(lo, min(hi, math.ceil(active / target))) if active > 0 else lo
