"""A small "kubelet" + endpoints controller for the test's pods.

Per pod it starts the process inside the pod's network namespace, runs its startup, readiness
and liveness probes as the pod spec writes them (Pod) and publishes the ready, non-terminating
pods:
  * worker pods as A records of the headless Service name in the test's DNS (EndpointSlices with
    publishNotReadyAddresses: false: not ready or terminating = not in DNS), and pods of the other
    kinds given in `services` (Redis) under their Service's name;
  * router pods to a `Service` object that clients read, with kube-proxy's propagation lag.
Deleting a pod takes it out of its endpoints at once, runs its preStop (a sleep), sends SIGTERM and
SIGKILL after the grace period (which, as in Kubernetes, includes the preStop time), then deletes
its network namespace (the IP disappears)."""
import http.client
import os
import signal
import socket
import subprocess
import threading
import time


def http_get(ip, port, path, timeout=1.0):
    """(status, body) or (None, error) when nothing answers."""
    c = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        return None, str(e)
    finally:
        c.close()


class Service:
    """The router Service as clients see it: ready router pod IPs, each change visible `lag_s` later."""

    def __init__(self, lag_s):
        self.lag_s = lag_s
        self._hist = [(0.0, ())]
        self._lock = threading.Lock()
        self._rr = 0

    def update(self, ips):
        with self._lock:
            ips = tuple(ips)
            if ips != self._hist[-1][1]:
                self._hist.append((time.monotonic(), ips))

    def endpoints(self):
        cutoff = time.monotonic() - self.lag_s
        with self._lock:
            for t, ips in reversed(self._hist):
                if t <= cutoff:
                    return ips
        return ()

    def pick(self):
        eps = self.endpoints()
        if not eps:
            return None
        with self._lock:
            self._rr += 1
            return eps[self._rr % len(eps)]


class Pod:
    """A pod: its process in its network namespace, and a prober thread running its probes on
    their own schedule (`probes`: {"startupProbe" | "readinessProbe" | "livenessProbe": Probe},
    k8s_manifest.Probe):
      * startup first: until it succeeds no other probe runs; failureThreshold failures kill the
        container;
      * readiness: ready after successThreshold successes in a row, unready after
        failureThreshold failures in a row, or at once when the process has exited;
      * liveness: failureThreshold failures in a row kill the container.
    A killed or exited container is not restarted (restartPolicy is not emulated: the scenarios
    replace pods themselves); the pod is then Failed. With `pending_s` the pod is Pending that
    long first (unscheduled, pulling its image): no process, no probes."""

    def __init__(self, kubelet, name, kind, host, argv, probes, env=None, pending_s=0):
        self.kubelet, self.name, self.kind, self.host = kubelet, name, kind, host
        self.ip = host.ip
        self.argv = argv
        self.probes = probes
        self.ready = False
        self.started = "startupProbe" not in probes
        self.terminating = False
        self.phase = "Pending" if pending_s > 0 else "Running"
        self.pending_s = pending_s
        self.exit_code = None
        self.sigkilled = False  # killed after its grace period
        self.killed_by = None   # the probe that had the container killed
        self.created = time.monotonic()
        self.ready_at = None     # first time ready
        self.ready_since = None  # ready without interruption since (minReadySeconds)
        self.probe_log = []      # (seconds since creation, probe kind, ok)
        self.log_path = os.path.join(kubelet.logdir, f"{name}.log")
        self.log = open(self.log_path, "w")
        self.env = env or {}
        self.proc = None if pending_s > 0 else self._start()
        self._thread = threading.Thread(target=self._probe_loop, name=f"probe-{name}", daemon=True)
        self._thread.start()

    def _start(self):
        return subprocess.Popen(self.host.exec_argv(self.argv), stdout=self.log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **self.env})

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def check(self, probe):
        """One run of `probe` against the pod (from the node: its IP)."""
        if not self.alive():
            return False
        if probe.http_path is not None:
            status, _ = http_get(self.ip, probe.port, probe.http_path, timeout=probe.timeout_s)
            return status is not None and 200 <= status < 400
        if probe.tcp:
            try:
                socket.create_connection((self.ip, probe.port), timeout=probe.timeout_s).close()
                return True
            except OSError:
                return False
        try:
            return subprocess.run(self.host.exec_argv(probe.exec_argv), capture_output=True, timeout=probe.timeout_s,
                                  env={**os.environ, **self.env}).returncode == 0
        except (subprocess.TimeoutExpired, OSError):
            return False

    def _set_ready(self, r):
        if r == self.ready:
            return
        self.ready = r
        now = time.monotonic()
        self.ready_since = now if r else None
        if r and self.ready_at is None:
            self.ready_at = now
        self.kubelet.event(f"{self.name} {'ready' if r else 'not ready'}")
        self.kubelet.endpoints_changed()

    def _probe_loop(self):
        kl = self.kubelet
        if self.proc is None:
            kl._closing.wait(self.pending_s)
            with kl._lock:
                if kl._closing.is_set() or self.phase != "Pending":
                    return  # deleted while Pending
                self.proc, self.phase, self.created = self._start(), "Running", time.monotonic()
            kl.event(f"{self.name} container started after {self.pending_s} s Pending")
        due = {k: self.created + p.initial_delay_s for k, p in self.probes.items()}
        succ = dict.fromkeys(self.probes, 0)
        fail = dict.fromkeys(self.probes, 0)
        while not kl._closing.is_set() and self.phase in ("Running", "Terminating"):
            if not self.alive():
                self._set_ready(False)
                if self.phase == "Running":
                    self.phase = "Failed"
                    kl.event(f"{self.name} exited on its own ({self.proc.returncode})")
                break
            now = time.monotonic()
            for kind, probe in self.probes.items():
                if (kind == "startupProbe") == self.started or now < due[kind]:
                    continue
                due[kind] = now + probe.period_s
                ok = self.check(probe)
                self.probe_log.append((round(now - self.created, 2), kind, ok))
                succ[kind], fail[kind] = (succ[kind] + 1, 0) if ok else (0, fail[kind] + 1)
                if kind == "startupProbe" and ok:
                    self.started = True
                    kl.event(f"{self.name} started (startup probe)")
                    t = time.monotonic()
                    due.update({k: t + p.initial_delay_s for k, p in self.probes.items() if k != kind})
                elif kind == "readinessProbe":
                    if ok and succ[kind] >= probe.success_threshold:
                        self._set_ready(True)
                    elif not ok and fail[kind] >= probe.failure_threshold:
                        self._set_ready(False)
                elif not ok and fail[kind] >= probe.failure_threshold and self.alive():
                    self.killed_by = kind
                    kl.event(f"{self.name} killed: {kind} failed {fail[kind]} times")
                    self.proc.kill()
            nxt = min((t for k, t in due.items() if (k == "startupProbe") != self.started), default=now + 0.1)
            kl._closing.wait(min(0.1, max(0.005, nxt - time.monotonic())))

    def log_tail(self, n=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


class Deletion:
    def __init__(self, pod, thread):
        self.pod, self.thread = pod, thread
        self.started = time.monotonic()
        self.sigterm_at = None
        self.ended_at = None
        self.observed = None

    def wait(self, timeout):
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"deleting {self.pod.name} did not finish within {timeout} s")
        return self.pod.exit_code


class Kubelet:
    def __init__(self, net, dns, logdir, worker_service, router_lag_s=0.5, probe_period_s=0.25, failure_threshold=3,
                 services=None):
        """`services`: {pod kind: DNS name} of other kinds published like the workers (the ready
        pods' addresses), e.g. Redis behind its Service."""
        self.net, self.dns, self.logdir = net, dns, logdir
        self.worker_service = worker_service
        self.services = dict(services or {})
        self._published_other = {}
        self.router_service = Service(router_lag_s)
        self.probe_period_s = probe_period_s
        self.failure_threshold = failure_threshold
        self.pods = {}
        self.events = []  # (seconds since start, text)
        self.service_deleted = False  # the worker Service's name removed from DNS (NXDOMAIN)
        self.dual_stack = set()  # worker pods that also publish an AAAA record
        self._published = None
        self.dns_history = []  # (monotonic time the DNS server answered with it, [addresses])
        self._t0 = time.monotonic()
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._counter = {}

    def event(self, text):
        self.events.append((round(time.monotonic() - self._t0, 2), text))

    # ---- pods --------------------------------------------------------------------------------

    def readiness_probe(self, port, path):
        """The suite's own readiness probe (scenarios not driven by the overlay): GET `path` every
        probe_period_s, 1 s timeout, failureThreshold as configured."""
        from k8s_manifest import Probe
        return {"readinessProbe": Probe("readinessProbe", {
            "httpGet": {"path": path, "port": port}, "periodSeconds": self.probe_period_s, "timeoutSeconds": 1,
            "failureThreshold": self.failure_threshold}, {})}

    def create(self, kind, argv_fn, probes, name=None, resolver=None, search=None, env_fn=None, prefix=None,
               pending_s=0):
        """Starts a pod; `argv_fn(ip, name)` gives the process's command line, `env_fn(name)` its
        environment, `probes` its probes ({kind: k8s_manifest.Probe}); `resolver` (and the
        `search` list, with ndots:5) its resolv.conf. Named `<prefix or kind><n>` unless `name`
        is given; Pending for `pending_s` first."""
        if name is None:
            n = self._counter.get(kind, 0) + 1
            self._counter[kind] = n
            name = f"{prefix or kind}{n}"
        host = self.net.add_host(name)
        if resolver:
            host.set_resolver(resolver, search=search)
        pod = Pod(self, name, kind, host, argv_fn(host.ip, name), probes, env_fn(name) if env_fn else None, pending_s)
        with self._lock:
            self.pods[name] = pod
        self.event(f"{name} created at {host.ip}")
        return pod

    def wait_ready(self, pods, timeout=60):
        pods = pods if isinstance(pods, (list, tuple)) else [pods]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in pods:
                if p.proc is not None and not p.alive() and not p.terminating:
                    raise RuntimeError(f"pod {p.name} exited ({p.proc.returncode}) before it was ready:\n"
                                       + p.log_tail())
            if all(p.ready for p in pods):
                return
            time.sleep(0.05)
        raise TimeoutError("not ready within %d s: %s" % (timeout, ", ".join(p.name for p in pods if not p.ready)))

    def crash(self, pod, sig=signal.SIGKILL):
        """The container dies (no restart): the pod stays, its probe fails, it leaves its endpoints."""
        self.event(f"{pod.name} killed with {signal.Signals(sig).name}")
        pod.proc.send_signal(sig)

    def delete(self, pod, pre_stop_s=0.0, grace_s=30.0, before_sigterm=None):
        """Graceful deletion in the background; returns a Deletion to wait on. `before_sigterm(pod)`,
        if given, runs after the preStop, just before the SIGTERM (its result in Deletion.observed)."""
        with self._lock:
            pod.terminating = True
            pod.phase = "Terminating"
            self.event(f"{pod.name} deleted (preStop {pre_stop_s} s, grace {grace_s} s)")
            self._reconcile()
        d = Deletion(pod, None)

        def run():
            end = d.started + grace_s
            if pre_stop_s > 0:
                self._closing.wait(min(pre_stop_s, grace_s))
            if pod.alive() and before_sigterm is not None:
                try:
                    d.observed = before_sigterm(pod)
                except Exception as e:  # noqa: BLE001 - an observation, never a reason not to stop
                    d.observed = e
            if pod.alive():
                d.sigterm_at = time.monotonic()
                self.event(f"{pod.name} SIGTERM")
                pod.proc.send_signal(signal.SIGTERM)
            try:
                if pod.proc is not None:  # None: deleted while Pending
                    pod.proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.event(f"{pod.name} SIGKILL after the grace period")
                pod.sigkilled = True
                pod.proc.kill()
                pod.proc.wait(10)
            pod.exit_code = pod.proc.returncode if pod.proc is not None else 0
            d.ended_at = time.monotonic()
            self.event(f"{pod.name} exited with {pod.exit_code}")
            pod.log.close()
            self.net.remove_host(pod.name)
            pod.phase = "Deleted"

        d.thread = threading.Thread(target=run, name=f"delete-{pod.name}", daemon=True)
        d.thread.start()
        return d

    def wait_available(self, pods, min_ready_s, timeout=60):
        """Waits until each pod has been ready without interruption for `min_ready_s` (a
        Deployment's minReadySeconds: only then does a rollout count it available)."""
        pods = pods if isinstance(pods, (list, tuple)) else [pods]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.wait_ready(pods, max(0.1, deadline - time.monotonic()))
            now = time.monotonic()
            if all(p.ready_since is not None and now - p.ready_since >= min_ready_s for p in pods):
                return
            time.sleep(0.05)
        raise TimeoutError(f"not available (ready for {min_ready_s} s) within {timeout} s: "
                           + ", ".join(p.name for p in pods))

    def live(self, kind):
        with self._lock:
            return [p for p in self.pods.values() if p.kind == kind and p.phase == "Running"]

    # ---- endpoints ---------------------------------------------------------------------------

    def set_service_deleted(self, deleted):
        with self._lock:
            self.service_deleted = deleted
            self.event(f"worker Service {'deleted' if deleted else 'restored'}")
            self._reconcile()

    def set_dual_stack(self, pod, on=True):
        with self._lock:
            if on:
                if pod.host.ipv6 is None:
                    try:
                        pod.host.add_ipv6(self.net.ipv6_of(pod.host))
                    except RuntimeError:
                        pod.host.ipv6 = self.net.ipv6_of(pod.host)  # no IPv6 here: the record alone
                self.dual_stack.add(pod.name)
            else:
                self.dual_stack.discard(pod.name)
            self._reconcile()

    def _reconcile(self):
        with self._lock:
            ready = [p for p in self.pods.values() if p.ready and not p.terminating]
            workers = [p for p in ready if p.kind == "worker"]
            addrs = [p.ip for p in workers] + [p.host.ipv6 for p in workers if p.name in self.dual_stack]
            if self.service_deleted:
                addrs = []
            if addrs != self._published:
                self.dns.set(self.worker_service, addrs)
                self._published = addrs
                self.dns_history.append((time.monotonic(), list(addrs)))
                self.event(f"DNS {self.worker_service} -> {addrs or 'NXDOMAIN'}")
            self.router_service.update([p.ip for p in ready if p.kind == "router"])
            for kind, name in self.services.items():
                addrs = [p.ip for p in ready if p.kind == kind]
                if addrs != self._published_other.get(name):
                    self.dns.set(name, addrs)
                    self._published_other[name] = addrs
                    self.event(f"DNS {name} -> {addrs or 'NXDOMAIN'}")

    def endpoints_changed(self):
        """A pod's readiness changed (its prober thread): republish the endpoints."""
        try:
            self._reconcile()
        except RuntimeError as e:
            self.event(f"endpoints update failed: {e}")

    def close(self):
        self._closing.set()
        for p in list(self.pods.values()):
            p._thread.join(10)
        for p in list(self.pods.values()):
            if p.alive():
                p.proc.send_signal(signal.SIGCONT)
                p.proc.kill()
        for p in list(self.pods.values()):
            try:
                if p.proc is not None:
                    p.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if not p.log.closed:
                p.log.close()

    def report(self):
        lines = ["kubelet events:"] + [f"  {t:8.2f} {e}" for t, e in self.events]
        for p in self.pods.values():
            lines.append(f"--- {p.name} ({p.kind}, {p.ip}, {p.phase}, exit {p.proc and p.proc.poll()}) log tail:")
            lines.append(p.log_tail(15))
        return "\n".join(lines)
