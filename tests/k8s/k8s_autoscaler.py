"""KEDA and the HPA as deploy/k8s/examples/cpu-autoscaled renders them, run against the suite's
pods (docs/operations.md, "Autoscaling").

Every second the emulated Prometheus scrapes each router's metrics port (adding the `namespace`
and `pod` labels the ServiceMonitor adds) and records kube-state-metrics' view of the worker
Deployment from the kubelet: `kube_deployment_spec_replicas` (the replicas the HPA set, Pending
pods included) and `kube_deployment_status_replicas_available` (pods ready for minReadySeconds).
Every pollingInterval the ScaledObject's query, exactly as rendered, is evaluated on those series
by promtool's PromQL engine (`promql`), and the HPA's arithmetic turns it into replicas:
ceil(value / threshold) (AverageValue) outside the 10 % tolerance, the scale-up policies of the
ScaledObject's `behavior` (the most of the Pods and Percent policies over their period), the
scale-down stabilization window, [minReplicaCount, maxReplicaCount]. New workers are created
Pending for `pending_s` (unscheduled, pulling the image), then start and probe as any pod.

`prometheus_up = False`: the query fails (Prometheus unreachable). KEDA passes the error on, and
the HPA keeps its replicas, until `fallback.failureThreshold` polls in a row have failed; from
then on KEDA reports the fallback (`replicas`, or with `behavior: currentReplicasIfHigher` the
running replicas where they are more) as the metric, fallback replicas x threshold."""
import math
import os
import re
import subprocess
import tempfile
import threading
import time

import deploy_common

EXAMPLE = "examples/cpu-autoscaled"


class ScaledObject:
    def __init__(self, doc):
        spec = doc["spec"]
        self.name = doc["metadata"]["name"]
        self.namespace = doc["metadata"]["namespace"]
        trig = next(t for t in spec["triggers"] if t["type"] == "prometheus")
        assert trig.get("metricType") == "AverageValue", trig
        self.query = trig["metadata"]["query"].strip()
        self.threshold = float(trig["metadata"]["threshold"])
        self.min, self.max = spec.get("minReplicaCount", 0), spec["maxReplicaCount"]
        self.polling_s = spec.get("pollingInterval", 30)
        b = (((spec.get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}).get("behavior") or {})
        self.up = b.get("scaleUp", {})
        self.down = b.get("scaleDown", {})
        self.fallback = spec.get("fallback") or {}

    def fallback_replicas(self, current):
        """The replicas KEDA's fallback reports with `current` running."""
        n = self.fallback["replicas"]
        return max(n, current) if self.fallback.get("behavior") == "currentReplicasIfHigher" else n

    def up_limit(self, base):
        """The most replicas the scale-up policies allow from `base` (the count one period ago)."""
        limits = [base + p["value"] if p["type"] == "Pods" else math.ceil(base * (1 + p["value"] / 100))
                  for p in self.up.get("policies", [])]
        if not limits:
            return self.max
        return min(limits) if self.up.get("selectPolicy") == "Min" else max(limits)

    def down_limit(self, base):
        """The fewest replicas the scale-down policies allow from `base` (the most in a period)."""
        limits = [base - p["value"] if p["type"] == "Pods" else math.ceil(base * (1 - p["value"] / 100))
                  for p in self.down.get("policies", [])]
        if not limits:
            return self.min
        return max(limits) if self.down.get("selectPolicy") == "Min" else min(limits)


def load_scaled_object():
    return ScaledObject(next(d for d in deploy_common.render(EXAMPLE) if d["kind"] == "ScaledObject"))


def promql(promtool, expr, series, at_index):
    """`expr` evaluated by `promtool` at sample `at_index` of `series` ({'name{labels}': [value or
    None]}, one sample a second); the scalar or single-sample value, or None for no result."""
    import yaml
    test = {"rule_files": [], "evaluation_interval": "1s", "tests": [{
        "interval": "1s",
        "input_series": [{"series": k, "values": " ".join("_" if v is None else repr(float(v)) for v in vs)}
                         for k, vs in series.items()],
        "promql_expr_test": [{"expr": expr, "eval_time": f"{at_index}s", "exp_samples": []}]}]}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "eval.yml")
        with open(path, "w") as f:
            yaml.safe_dump(test, f)
        out = subprocess.run([promtool, "test", "rules", path], capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    if out.returncode == 0:
        return None  # matched the empty expectation: no result
    m = re.search(r"got:\s*(.*)", text)
    if not m:
        raise RuntimeError(f"promtool could not evaluate the query: {text.strip()}")
    got = re.findall(r"\}\s*([-+0-9.eE]+|NaN)", m.group(1))
    if len(got) != 1:
        raise RuntimeError(f"the query gave {m.group(1)!r}, not one value")
    return float(got[0])


class KedaAutoscaler:
    def __init__(self, c, so, routers, promtool, pending_s=0.0, scrape_s=1.0):
        self.c, self.so, self.routers, self.pending_s = c, so, routers, pending_s
        self.promtool = promtool
        self.series = {}
        self.n = 0  # samples recorded
        self.pods = [p for p in c.kubelet.live("worker") if not p.terminating]
        self.spec = len(self.pods)  # the Deployment's spec.replicas (the HPA writes it)
        self.history = []  # dicts: one per poll
        self.prometheus_up = True
        self.recommendations = []  # (time, replicas the metric asked for): the HPA's stabilization
        self.failures = 0  # polls failed in a row
        self.replica_history = [(time.monotonic(), self.spec)]
        self.errors = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(scrape_s,), name="keda", daemon=True)
        self._thread.start()

    # ---- what Prometheus holds ------------------------------------------------------------------

    def available(self):
        now, m = time.monotonic(), self.c.overlay.worker.min_ready_s
        return sum(1 for p in self.pods
                   if not p.terminating and p.ready_since is not None and now - p.ready_since >= m)

    def _record(self, values):
        for k, v in values.items():
            self.series.setdefault(k, [None] * self.n).append(v)
        self.n += 1
        for vs in self.series.values():
            if len(vs) < self.n:
                vs.append(None)

    def scrape(self):
        ns, dep = self.so.namespace, self.c.overlay.worker.name
        values = {}
        for r in self.routers:
            for k, v in self.c.metrics(r).items():
                name = k.split("{")[0]
                if name in ("switchyard_router_active_requests", "switchyard_router_queue_oldest_wait_seconds") \
                        and "{" in k:
                    values[f'{name}{{namespace="{ns}",pod="{r.name}",{k.split("{", 1)[1]}'] = v
        values[f'kube_deployment_spec_replicas{{namespace="{ns}",deployment="{dep}"}}'] = self.spec
        values[f'kube_deployment_status_replicas_available{{namespace="{ns}",deployment="{dep}"}}'] = self.available()
        self._record(values)
        return values

    # ---- KEDA + HPA --------------------------------------------------------------------------

    def desired(self, value, now):
        """The HPA's replicas for the metric `value` (AverageValue: the total over the target), as
        its controller computes them: the metric's replicas (unchanged within the 10 %
        tolerance), stabilized (the current count held between the least recommendation of the
        scale-up window and the most of the scale-down window), then rate-limited by the
        behavior's policies and clamped to [min, max]."""
        cur = self.spec
        want = cur if value is not None and abs(value / (self.so.threshold * cur) - 1) <= 0.1 \
            else math.ceil((value or 0) / self.so.threshold)
        self.recommendations.append((now, want))
        up_w = self.so.up.get("stabilizationWindowSeconds", 0)
        down_w = self.so.down.get("stabilizationWindowSeconds", 300)
        up = min([r for t, r in self.recommendations if t > now - up_w] + [want])
        down = max([r for t, r in self.recommendations if t > now - down_w] + [want])
        rec = min(max(cur, up), down)
        if rec > cur:
            period = max((p["periodSeconds"] for p in self.so.up.get("policies", [])), default=60)
            base = min([n for t, n in self.replica_history if t >= now - period] + [cur])
            rec = min(rec, max(cur, self.so.up_limit(base)))
        elif rec < cur:
            period = max((p["periodSeconds"] for p in self.so.down.get("policies", [])), default=60)
            base = max([n for t, n in self.replica_history if t >= now - period] + [cur])
            rec = max(rec, min(cur, self.so.down_limit(base)))
        return max(self.so.min, min(self.so.max, rec))

    def poll(self):
        now = time.monotonic()
        at = self.n - 1
        # What the query gives (also evaluated while "Prometheus is down", for comparison).
        value = promql(self.promtool, self.so.query, self.series, at)
        no_ksm = {k: v for k, v in self.series.items() if not k.startswith("kube_")}
        blind = promql(self.promtool, self.so.query, no_ksm, at)
        h = {"t": now, "sample": at, "spec": self.spec, "available": self.available(), "demand": value,
             "demand_without_ksm": blind, "prometheus_up": self.prometheus_up}
        if self.prometheus_up:
            self.failures = 0
        else:
            self.failures += 1
            h["failures"] = self.failures
            if self.failures < self.so.fallback.get("failureThreshold", 3):
                h["desired_raw"] = h["replicas"] = self.spec  # the HPA cannot compute: no change
                self.history.append(h)
                return
            h["fallback"] = self.so.fallback_replicas(self.spec)
            value = h["fallback"] * self.so.threshold
        h["desired_raw"] = max(self.so.min, min(self.so.max, math.ceil((value or 0) / self.so.threshold)))
        want = self.desired(value, now)
        h["replicas"] = want
        self.history.append(h)
        if want > self.spec:
            for _ in range(want - self.spec):
                self.pods.append(self.c.worker(pending_s=self.pending_s))
            self.spec = want
            self.replica_history.append((now, want))
        elif want < self.spec:
            for p in sorted(self.pods, key=lambda p: p.created, reverse=True)[:self.spec - want]:
                self.c.delete(p)
                self.pods.remove(p)
            self.spec = want
            self.replica_history.append((now, want))

    def _run(self, scrape_s):
        next_poll = time.monotonic() + self.so.polling_s
        while not self._stop.wait(scrape_s):
            try:
                with self._lock:
                    self.scrape()
                    if time.monotonic() >= next_poll:
                        next_poll += self.so.polling_s
                        self.poll()
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                self.errors.append(e)

    def stop(self):
        self._stop.set()
        self._thread.join(60)
