"""The pods of the rendered CPU overlay, as the suite's kubelet runs them.

`kubectl kustomize deploy/k8s/overlays/cpu`, rendered from a temporary copy of deploy/k8s with
secrets from deploy/k8s/make-secrets.py (tests/deploy/deploy_common.py: k8s_tree, render), is
read into one `Template` per Deployment (router, worker, Redis): the container's command and
arguments with `$(VAR)` expanded from its env (downward API, Secret keys), its ports, its startup,
liveness and readiness probes with their periods, timeouts and thresholds, the preStop sleep,
terminationGracePeriodSeconds, minReadySeconds, replicas, the rollout's surge, the
PodDisruptionBudget's minAvailable, and the Secret volumes, written out as files under a
per-cluster root (`materialize`) so the arguments' paths point at what the pod would mount.

Only machine-size arguments are replaced (`CAPACITY`: this machine has 2 cores, not 4 per
worker); everything else runs as written. `unapplied(overlay)` lists every field of the rendered
pods that the emulation neither applies nor deliberately leaves out (`NOT_EMULATED`, each with
its reason): a changed overlay that adds a probe kind, a probe setting, a lifecycle hook or a
timing the kubelet does not implement fails the suite instead of being silently ignored."""
import base64
import copy
import functools
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "deploy"))

import deploy_common  # noqa: E402

KUSTOMIZATION = "overlays/cpu"
DOMAIN = "cluster.local"

# Arguments sized for the overlay's nodes that this 2-core machine cannot give every worker: CPU
# threads and the KV budget (allocated at start). Timings, probes, ports, names and every other
# argument are the overlay's own.
CAPACITY = {"switchyard-worker": {"--threads": "1", "--kv-memory-mb": "256"}}

# Fields of the rendered Deployments, pod specs and containers that the kubelet emulation applies
# (k8s_kubelet.py, k8s_cluster.py): the overlay test fails on any other field, unless listed in
# NOT_EMULATED below.
APPLIED = {
    "spec.replicas", "spec.minReadySeconds", "spec.strategy.type", "spec.strategy.rollingUpdate.maxSurge",
    "spec.strategy.rollingUpdate.maxUnavailable", "spec.selector",
    "pod.terminationGracePeriodSeconds", "pod.volumes",
    "container.name", "container.command", "container.args", "container.env", "container.ports",
    "container.volumeMounts", "container.lifecycle.preStop.sleep.seconds",
    # Probes: httpGet (path, port by name or number), tcpSocket, exec, and their timings.
    *(f"container.{p}.{f}" for p in ("startupProbe", "livenessProbe", "readinessProbe")
      for f in ("httpGet.path", "httpGet.port", "tcpSocket.port", "exec.command", "periodSeconds", "timeoutSeconds",
                "failureThreshold", "successThreshold", "initialDelaySeconds")),
}
# What the emulation deliberately does not reproduce, and why.
NOT_EMULATED = {
    "spec.revisionHistoryLimit": "no ReplicaSet history: the suite does not roll back",
    "pod.enableServiceLinks": "no Service environment variables are injected either way",
    "pod.automountServiceAccountToken": "no API server: no token to mount",
    "pod.nodeSelector": "one node, x86-64",
    "pod.securityContext": "the pods run as the test's user (root: namespaces need it)",
    "pod.topologySpreadConstraints": "one node",
    "container.image": "the binaries of this build run instead of the images",
    "container.resources": "no cgroup limits; CAPACITY sizes the worker to this machine",
    "container.securityContext": "the pods run as the test's user",
    "container.ports.protocol": "TCP",
}


class Probe:
    """A container probe: exactly one of http_path (+ port), tcp (port) or exec_argv."""

    def __init__(self, kind, spec, ports):
        self.kind = kind
        port = (spec.get("httpGet") or spec.get("tcpSocket") or {}).get("port")
        self.port = ports.get(port, port) if isinstance(port, str) else port
        self.http_path = (spec.get("httpGet") or {}).get("path")
        self.tcp = "tcpSocket" in spec
        self.exec_argv = (spec.get("exec") or {}).get("command")
        # Kubernetes' defaults where the manifest leaves a field out.
        self.period_s = spec.get("periodSeconds", 10)
        self.timeout_s = spec.get("timeoutSeconds", 1)
        self.failure_threshold = spec.get("failureThreshold", 3)
        self.success_threshold = spec.get("successThreshold", 1)
        self.initial_delay_s = spec.get("initialDelaySeconds", 0)

    def __repr__(self):
        what = (f"GET :{self.port}{self.http_path}" if self.http_path else f"tcp :{self.port}" if self.tcp
                else f"exec {self.exec_argv}")
        return (f"<{self.kind} {what} every {self.period_s} s, timeout {self.timeout_s} s, "
                f"failure {self.failure_threshold}, success {self.success_threshold}>")


class Template:
    """One Deployment's pods, as rendered."""

    def __init__(self, deployment, docs, namespace):
        self.name = deployment["metadata"]["name"]
        spec = deployment["spec"]
        self.pod_spec = spec["template"]["spec"]
        self.labels = spec["template"]["metadata"].get("labels", {})
        self.container = self.pod_spec["containers"][0]
        self.namespace = namespace
        self.replicas = spec.get("replicas", 1)
        self.min_ready_s = spec.get("minReadySeconds", 0)
        rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        self.max_surge, self.max_unavailable = rolling.get("maxSurge", 1), rolling.get("maxUnavailable", 0)
        self.grace_s = self.pod_spec.get("terminationGracePeriodSeconds", 30)
        self.pre_stop_s = (((self.container.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}) \
            .get("seconds", 0)
        self.ports = {p["name"]: p["containerPort"] for p in self.container.get("ports", []) if "name" in p}
        self.probes = {k: Probe(k, self.container[k], self.ports)
                       for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in self.container}
        self.pdb_min_available = None
        for d in docs:
            sel = ((d.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if d["kind"] == "PodDisruptionBudget" and sel and all(self.labels.get(k) == v for k, v in sel.items()):
                self.pdb_min_available = d["spec"].get("minAvailable")
        self._secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}

    def secret_value(self, name, key):
        return base64.b64decode(self._secrets[name]["data"][key]).decode()

    def env(self, pod_name):
        """The container's environment for pod `pod_name`: literal values, the downward API and
        Secret keys resolved."""
        out = {}
        meta = {"name": pod_name, "namespace": self.namespace, "labels": self.labels}
        for e in self.container.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                out[e["name"]] = self.secret_value(ref["name"], ref["key"])
            else:
                out[e["name"]] = deploy_common.expand(f"$({e['name']})", self.container, meta)
        return out

    def argv(self, pod_name, root, models_dir):
        """The container's command line for pod `pod_name`, $(VAR) expanded from its env, paths
        under its volume mounts moved under `root` (materialize()) or, for the models volume, to
        `models_dir`, and CAPACITY's arguments replaced."""
        c = copy.deepcopy(self.container)
        c["env"] = [{"name": k, "value": v} for k, v in self.env(pod_name).items()]
        meta = {"name": pod_name, "namespace": self.namespace, "labels": self.labels}
        argv = [deploy_common.expand(a, c, meta) for a in deploy_common.args_of(c)]
        mounts = self.mounts()
        for i, a in enumerate(argv):
            for path, (kind, _) in mounts.items():
                if a.startswith(path + "/"):
                    base = models_dir if kind == "models" else os.path.join(root, self.name) + path
                    argv[i] = base + a[len(path):]
        for flag, value in CAPACITY.get(self.name, {}).items():
            if flag in argv:
                argv[argv.index(flag) + 1] = value
        return argv

    def mounts(self):
        """{mountPath: (kind, volume)}: kind "secret", "models" (the model claim or image) or
        "scratch" (emptyDir)."""
        vols = {v["name"]: v for v in self.pod_spec.get("volumes") or []}
        out = {}
        for m in self.container.get("volumeMounts") or []:
            v = vols[m["name"]]
            kind = "secret" if "secret" in v else "scratch" if "emptyDir" in v else "models"
            out[m["mountPath"]] = (kind, v)
        return out

    def materialize(self, root):
        """Writes the Secret volumes' files under root/<deployment>/<mountPath>/ (mode 0440), as
        the kubelet mounts them."""
        for path, (kind, v) in self.mounts().items():
            if kind != "secret":
                continue
            secret = v["secret"]
            data = self._secrets[secret["secretName"]]["data"]
            items = secret.get("items") or [{"key": k, "path": k} for k in data]
            d = os.path.join(root, self.name) + path
            os.makedirs(d, exist_ok=True)
            for it in items:
                f = os.path.join(d, it["path"])
                with open(f, "wb") as out:
                    out.write(base64.b64decode(data[it["key"]]))
                os.chmod(f, secret.get("defaultMode", 0o644))

    def port(self, name):
        return self.ports[name]

    def __repr__(self):
        return (f"<{self.name}: {self.replicas} replicas, minReady {self.min_ready_s} s, surge {self.max_surge}/"
                f"unavailable {self.max_unavailable}, preStop {self.pre_stop_s} s, grace {self.grace_s} s, "
                f"PDB minAvailable {self.pdb_min_available}, probes {list(self.probes.values())}>")


class Overlay:
    def __init__(self, docs):
        self.docs = docs
        self.namespace = next(d["metadata"]["name"] for d in docs if d["kind"] == "Namespace")
        deps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
        self.deployments = deps
        self.router = Template(deps["switchyard-router"], docs, self.namespace)
        self.worker = Template(deps["switchyard-worker"], docs, self.namespace)
        self.redis = Template(deps["switchyard-redis"], docs, self.namespace)
        self.services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}

    def service_name(self, service):
        """The Service's DNS name: <name>.<namespace>.svc.cluster.local."""
        return f"{service}.{self.namespace}.svc.{DOMAIN}"

    def search(self):
        """A pod's resolv.conf search list in this namespace (ndots:5 goes with it)."""
        return [f"{self.namespace}.svc.{DOMAIN}", f"svc.{DOMAIN}", DOMAIN]

    def api_key(self, admin=True):
        """A key of the tenants Secret: the first admin tenant's (or the first other tenant's)."""
        import json
        tenants = json.loads(self.router.secret_value(
            next(n for n in self.router._secrets if n.startswith("switchyard-tenants")), "tenants.json"))["tenants"]
        for t in tenants:
            if bool(t.get("admin")) == admin:
                return t["keys"][0]
        return tenants[0]["keys"][0]


@functools.lru_cache(maxsize=None)
def load(kustomization=KUSTOMIZATION):
    """The rendered overlay (rendered once per run, from a copy with freshly made secrets)."""
    return Overlay(deploy_common.render(kustomization))


def _walk(obj, prefix):
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}.{k}")
    elif isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        for x in obj:
            yield from _walk(x, prefix)
    else:
        yield prefix


def unapplied(overlay):
    """Field paths of the switchyard Deployments' specs, pod specs and containers that are in
    neither APPLIED nor NOT_EMULATED (a field is covered by any entry that is it or a parent)."""
    covered = APPLIED | set(NOT_EMULATED)

    def ok(path):
        parts = path.split(".")
        return any(".".join(parts[:i]) in covered for i in range(1, len(parts) + 1))

    out = []
    for t in (overlay.router, overlay.worker, overlay.redis):
        spec = {k: v for k, v in overlay.deployments[t.name]["spec"].items() if k != "template"}
        pod = {k: v for k, v in t.pod_spec.items() if k != "containers"}
        paths = list(_walk(spec, "spec")) + list(_walk(pod, "pod")) + list(_walk(t.container, "container"))
        if len(t.pod_spec["containers"]) != 1 or t.pod_spec.get("initContainers"):
            paths.append("pod.containers[1:] / initContainers")
        out += [f"{t.name}: {p}" for p in paths if not ok(p)]
    return out
