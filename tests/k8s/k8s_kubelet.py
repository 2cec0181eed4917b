"""A small "kubelet" + endpoints controller for the test's pods.

Per pod it starts the process inside the pod's network namespace, polls its readiness probe
(HTTP GET on the pod IP) and publishes the ready, non-terminating pods:
  * worker pods as A records of the headless Service name in the test's DNS (EndpointSlices with
    publishNotReadyAddresses: false: not ready or terminating = not in DNS);
  * router pods to a `Service` object that clients read, with kube-proxy's propagation lag.
Deleting a pod takes it out of its endpoints at once, runs its preStop (a sleep), sends SIGTERM and
SIGKILL after the grace period (which, as in Kubernetes, includes the preStop time), then deletes
its network namespace (the IP disappears)."""
import http.client
import os
import signal
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
    def __init__(self, kubelet, name, kind, host, argv, probe_port, probe_paths):
        self.kubelet, self.name, self.kind, self.host = kubelet, name, kind, host
        self.ip = host.ip
        self.argv = argv
        self.probe_port, self.probe_paths = probe_port, list(probe_paths)
        self.probe_path = None  # chosen at the first answer: the first path that is not 404
        self.ready = False
        self.failures = 0  # consecutive failed probes (failureThreshold)
        self.terminating = False
        self.phase = "Running"
        self.exit_code = None
        self.sigkilled = False  # killed after its grace period
        self.created = time.monotonic()
        self.ready_at = None
        self.log_path = os.path.join(kubelet.logdir, f"{name}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(host.exec_argv(argv), stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def alive(self):
        return self.proc.poll() is None

    def probe(self):
        if not self.alive():
            return False
        paths = [self.probe_path] if self.probe_path else self.probe_paths
        for p in paths:
            status, _ = http_get(self.ip, self.probe_port, p)
            if status is None:
                return False
            if status == 404 and self.probe_path is None:
                continue  # this binary has no such endpoint yet: try the next one
            self.probe_path = p
            return status == 200
        return False

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
    def __init__(self, net, dns, logdir, worker_service, router_lag_s=0.5, probe_period_s=0.25, failure_threshold=3):
        self.net, self.dns, self.logdir = net, dns, logdir
        self.worker_service = worker_service
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
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self._thread.start()

    def event(self, text):
        self.events.append((round(time.monotonic() - self._t0, 2), text))

    # ---- pods --------------------------------------------------------------------------------

    def create(self, kind, argv_fn, probe_port, probe_paths, name=None, resolver=None):
        """Starts a pod; `argv_fn(ip)` gives the process's command line."""
        if name is None:
            n = self._counter.get(kind, 0) + 1
            self._counter[kind] = n
            name = f"{kind}{n}"
        host = self.net.add_host(name)
        if resolver:
            host.set_resolver(resolver)
        pod = Pod(self, name, kind, host, argv_fn(host.ip), probe_port, probe_paths)
        with self._lock:
            self.pods[name] = pod
        self.event(f"{name} created at {host.ip}")
        return pod

    def wait_ready(self, pods, timeout=60):
        pods = pods if isinstance(pods, (list, tuple)) else [pods]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in pods:
                if not p.alive() and not p.terminating:
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
                pod.proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.event(f"{pod.name} SIGKILL after the grace period")
                pod.sigkilled = True
                pod.proc.kill()
                pod.proc.wait(10)
            pod.exit_code = pod.proc.returncode
            d.ended_at = time.monotonic()
            self.event(f"{pod.name} exited with {pod.exit_code}")
            pod.log.close()
            self.net.remove_host(pod.name)
            pod.phase = "Deleted"

        d.thread = threading.Thread(target=run, name=f"delete-{pod.name}", daemon=True)
        d.thread.start()
        return d

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

    def _loop(self):
        while not self._closing.is_set():
            with self._lock:
                pods = [p for p in self.pods.values() if p.phase in ("Running", "Terminating")]
            changed = False
            for p in pods:
                # Ready on one success; unready after failureThreshold failures in a row (or at once
                # when the process has exited).
                ok = p.probe()
                p.failures = 0 if ok else p.failures + 1
                r = ok or (p.ready and p.alive() and p.failures < self.failure_threshold)
                if r != p.ready:
                    p.ready = r
                    if r and p.ready_at is None:
                        p.ready_at = time.monotonic()
                    self.event(f"{p.name} {'ready' if r else 'not ready'}")
                    changed = True
                if not p.alive() and p.phase == "Running":
                    p.phase = "Failed"
                    self.event(f"{p.name} exited on its own ({p.proc.returncode})")
            if changed:
                try:
                    self._reconcile()
                except RuntimeError as e:
                    self.event(f"endpoints update failed: {e}")
            self._closing.wait(self.probe_period_s)

    def close(self):
        self._closing.set()
        self._thread.join(10)
        for p in list(self.pods.values()):
            if p.proc.poll() is None:
                p.proc.send_signal(signal.SIGCONT)
                p.proc.kill()
        for p in list(self.pods.values()):
            try:
                p.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if not p.log.closed:
                p.log.close()

    def report(self):
        lines = ["kubelet events:"] + [f"  {t:8.2f} {e}" for t, e in self.events]
        for p in self.pods.values():
            lines.append(f"--- {p.name} ({p.kind}, {p.ip}, {p.phase}, exit {p.proc.poll()}) log tail:")
            lines.append(p.log_tail(15))
        return "\n".join(lines)
