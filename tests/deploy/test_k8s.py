"""The Kubernetes manifests (deploy/k8s): every kustomization an operator may apply renders
(`kubectl kustomize`), validates strictly against the Kubernetes schemas of two Kubernetes
versions (kubernetes-validate --strict), its custom resources (KEDA ScaledObject, Prometheus
operator ServiceMonitor and PrometheusRule) validate against the hand-written schemas in
schemas/, and what no schema can see holds: selectors match pods, the routers' --workers-dns
names the workers' headless Service, probes hit declared ports, grace periods outlast the drain,
processes listen on 0.0.0.0, the NetworkPolicy lets only routers reach the workers' ZeroMQ port,
resources follow the KV budget, the autoscaler's target follows --max-running, the worker reads
its model from a volume mounted read-only (by default a ReadOnlyMany claim with no init container,
so no pod start reaches the network; docs/operations.md, "Model source"), and the model loader Job
(deploy/k8s/model-loader) renders, validates and writes to that claim.

    .venv/bin/python tests/deploy/test_k8s.py      (ctest: deploy/k8s-manifests)"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import (KUSTOMIZATIONS, LOADER, ROOT, Report, args_of, expand, flag_value, need_modules,
                           parse_args, render, skip, tool)  # noqa: E402

# The oldest Kubernetes release still commonly run and the newest kubernetes-validate ships.
K8S_VERSIONS = ["1.30.0", "1.37.0"]
# Kustomizations that need a newer Kubernetes than the oldest: the image volume source is in the API
# from 1.31, and on by default from 1.35 (components/model-image).
MIN_K8S = {"examples/cpu-model-image": "1.35.0"}
CRD_GROUPS = ("keda.sh/", "monitoring.coreos.com/")
SCHEMAS = os.path.join(os.path.dirname(__file__), "schemas")
MIB = 1 << 20


def ns_of(d):
    return d["metadata"].get("namespace", "default")


def pod_spec(dep):
    return dep["spec"]["template"]["spec"]


def pod_labels(dep):
    return dep["spec"]["template"]["metadata"].get("labels", {})


def selects(selector, labels):
    """Whether a matchLabels/matchExpressions selector (or a plain label map) selects `labels`."""
    if selector is None:
        return False
    match = selector.get("matchLabels", selector if "matchExpressions" not in selector else {})
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for e in selector.get("matchExpressions", []):
        v = labels.get(e["key"])
        op = e["operator"]
        if (op == "In" and v not in e["values"]) or (op == "NotIn" and v in e["values"]) or \
           (op == "Exists" and v is None) or (op == "DoesNotExist" and v is not None):
            return False
    return True


def container_ports(dep):
    """{name or number: containerPort} over the pod's containers."""
    out = {}
    for c in pod_spec(dep).get("containers", []):
        for p in c.get("ports", []):
            out[p["containerPort"]] = p["containerPort"]
            if "name" in p:
                out[p["name"]] = p["containerPort"]
    return out


def role(dep):
    """'router', 'worker', 'redis' or None, from the main container's command line."""
    argv = args_of(pod_spec(dep)["containers"][0])
    image = pod_spec(dep)["containers"][0].get("image", "")
    if "--workers-dns" in argv or "--workers" in argv or "switchyard/router" in image:
        return "router"
    if "serve" in argv[:1] or "switchyard/worker" in image:
        return "worker"
    if "redis" in image:
        return "redis"
    return None


def quantity_bytes(q):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    return float(m.group(1)) * units.get(m.group(2), 1)


def quantity_cpu(q):
    q = str(q)
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def versions_for(name):
    low = tuple(int(x) for x in MIN_K8S.get(name, "0").split("."))
    return [v for v in K8S_VERSIONS if tuple(int(x) for x in v.split(".")) >= low]


def validate_core(r, name, docs, kv):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        import yaml
        yaml.safe_dump_all(docs, f)
        path = f.name
    try:
        for v in versions_for(name):
            out = subprocess.run([kv, "--strict", "-k", v, path], capture_output=True, text=True)
            lines = (out.stdout + out.stderr).splitlines()
            bad = [l for l in lines if not l.startswith("INFO")]
            passed = sum(1 for l in lines if l.startswith("INFO") and " passed " in l)
            r.check(out.returncode == 0 and not bad and passed == len(docs),
                    f"{name}: {passed}/{len(docs)} resources valid against Kubernetes {v} (strict)",
                    "; ".join(bad) or f"exit {out.returncode}")
    finally:
        os.unlink(path)


def crd_validators():
    import jsonschema
    import referencing
    import kubernetes_validate
    defs_path = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema",
                             f"v{K8S_VERSIONS[0]}-local-strict", "_definitions.json")
    with open(defs_path) as f:
        defs = referencing.Resource.from_contents(json.load(f))
    registry = referencing.Registry().with_resource("https://kubernetes.io/api/_definitions.json", defs)
    out = {}
    for fname, kinds in (("keda-scaledobject.schema.json", ["ScaledObject"]),
                         ("prometheus-operator.schema.json", ["ServiceMonitor", "PrometheusRule"])):
        with open(os.path.join(SCHEMAS, fname)) as f:
            schema = json.load(f)
        v = jsonschema.Draft202012Validator(schema, registry=registry)
        for k in kinds:
            out[k] = v
    return out


def validate_crds(r, name, docs, validators):
    for d in docs:
        what = f"{name}: {d['kind']}/{d['metadata']['name']} valid against schemas/ (hand-written CRD schema)"
        v = validators.get(d["kind"])
        if not v:
            r.check(False, what, f"no schema for {d['apiVersion']} {d['kind']}")
            continue
        errors = sorted(v.iter_errors(d), key=lambda e: list(e.absolute_path))
        r.check(not errors, what, "; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors))


def semantic(r, name, docs):
    deps = [d for d in docs if d["kind"] == "Deployment"]
    svcs = [d for d in docs if d["kind"] == "Service"]
    by_role = {}
    for d in deps:
        by_role.setdefault(role(d), []).append(d)
    routers, workers = by_role.get("router", []), by_role.get("worker", [])
    r.check(routers and workers, f"{name}: has router and worker Deployments")
    if not (routers and workers):
        return
    worker, router = workers[0], routers[0]
    wc, rc = pod_spec(worker)["containers"][0], pod_spec(router)["containers"][0]
    wargv, rargv = args_of(wc), args_of(rc)

    # Selectors.
    for d in deps:
        sel = d["spec"]["selector"]
        r.check(selects(sel, pod_labels(d)), f"{name}: Deployment {d['metadata']['name']} selector matches its pods")
    for s in svcs:
        sel = s["spec"].get("selector")
        targets = [d for d in deps if ns_of(d) == ns_of(s) and sel and selects(sel, pod_labels(d))]
        r.check(len(targets) == 1, f"{name}: Service {s['metadata']['name']} selects one Deployment's pods",
                f"selects {[t['metadata']['name'] for t in targets]}")
        for t in targets:
            ports = container_ports(t)
            for p in s["spec"]["ports"]:
                tp = p.get("targetPort", p["port"])
                r.check(tp in ports, f"{name}: Service {s['metadata']['name']} port {p.get('name', p['port'])} "
                        f"targets a container port ({tp})")

    # Workers: their headless Service and the routers' --workers-dns.
    wns = ns_of(worker)
    wsvcs = [s for s in svcs if ns_of(s) == wns and selects(s["spec"].get("selector"), pod_labels(worker))]
    wsvc = wsvcs[0] if wsvcs else None
    r.check(wsvc is not None, f"{name}: a Service selects the worker pods")
    if wsvc:
        spec = wsvc["spec"]
        r.check(spec.get("clusterIP") == "None", f"{name}: worker Service is headless (clusterIP: None)")
        r.check(spec.get("publishNotReadyAddresses") is False,
                f"{name}: worker Service sets publishNotReadyAddresses: false")
        r.check(spec.get("ipFamilyPolicy") == "SingleStack", f"{name}: worker Service is SingleStack")
    wports = container_ports(worker)
    listen = flag_value(wargv, "--listen") or ""
    m = re.fullmatch(r"tcp://([^:]+):(\d+)", listen)
    r.check(m and m.group(1) == "0.0.0.0", f"{name}: worker --listen is on 0.0.0.0", listen)
    zmq_port = int(m.group(2)) if m else None
    r.check(zmq_port in wports.values(), f"{name}: worker --listen port {zmq_port} is a container port")
    # As the kubelet expands it: the namespace comes from the pod's own (downward API), so that
    # the overlay's `namespace:` is the only place it is named.
    dns = expand(flag_value(rargv, "--workers-dns") or "", rc,
                 dict(router["spec"]["template"]["metadata"], namespace=ns_of(router)))
    m = re.fullmatch(r"([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", dns)
    r.check(bool(m), f"{name}: router --workers-dns is <service>.<namespace>.svc.cluster.local:<port>", dns)
    if m and wsvc:
        svc_name, svc_ns, port = m.group(1), m.group(2), int(m.group(3))
        r.check(svc_name == wsvc["metadata"]["name"], f"{name}: --workers-dns names the worker Service",
                f"{svc_name} vs {wsvc['metadata']['name']}")
        r.check(svc_ns == wns, f"{name}: --workers-dns namespace is the workers' ({wns})", svc_ns)
        sp = [p for p in wsvc["spec"]["ports"] if p["port"] == port]
        r.check(sp and wports.get(sp[0].get("targetPort", port)) == port == zmq_port,
                f"{name}: --workers-dns port {port} = worker Service port = container port = --listen port")

    # Listen addresses and ports.
    rports = container_ports(router)
    r.check(flag_value(rargv, "--host") == "0.0.0.0", f"{name}: router --host 0.0.0.0")
    r.check(int(flag_value(rargv, "--port") or 8000) in rports.values(), f"{name}: router --port is a container port")
    r.check(flag_value(wargv, "--metrics-host") == "0.0.0.0", f"{name}: worker --metrics-host 0.0.0.0")
    metrics_port = int(flag_value(wargv, "--metrics-port") or 9100)
    r.check(metrics_port in wports.values(), f"{name}: worker --metrics-port is a container port")
    for d in by_role.get("redis", []):
        a = args_of(pod_spec(d)["containers"][0])
        r.check(flag_value(a, "--bind") == "0.0.0.0", f"{name}: redis --bind 0.0.0.0")
        r.check(int(flag_value(a, "--port") or 6379) in container_ports(d).values(),
                f"{name}: redis --port is a container port")
        redis_url = flag_value(rargv, "--redis") or ""
        rs = [s for s in svcs if selects(s["spec"].get("selector"), pod_labels(d))]
        r.check(any(re.match(rf"redis://(:[^@]*@)?({s['metadata']['name']}|{s['metadata']['name']}\.{ns_of(s)}[.a-z]*):"
                             rf"{s['spec']['ports'][0]['port']}(/|$)", redis_url) for s in rs),
                f"{name}: router --redis names the Redis Service and port", redis_url)
        # Redis requires a password (from a Secret), and the router's URL carries the same one.
        renv = {e["name"]: e for e in (rc.get("env") or [])}
        denv = {e["name"]: e for e in (pod_spec(d)["containers"][0].get("env") or [])}
        pw_ref = (flag_value(a, "--requirepass") or "")
        secret_of = lambda e: ((e or {}).get("valueFrom") or {}).get("secretKeyRef")  # noqa: E731
        r.check(pw_ref.startswith("$(") and secret_of(denv.get(pw_ref[2:-1])) is not None,
                f"{name}: redis --requirepass comes from a Secret", pw_ref)
        m = re.match(r"redis://:\$\((\w+)\)@", redis_url)
        r.check(bool(m) and secret_of(renv.get(m.group(1))) == secret_of(denv.get(pw_ref[2:-1])),
                f"{name}: the router's --redis URL carries Redis's password from the same Secret key", redis_url)

    # Identity from the downward API.
    for dep, c, flag in ((router, rc, "--router-id"), (worker, wc, "--worker-id")):
        v = flag_value(args_of(c), flag) or ""
        m = re.fullmatch(r"\$\((\w+)\)", v)
        env = {e["name"]: e for e in c.get("env", [])}
        ok = bool(m) and env.get(m.group(1), {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name"
        r.check(ok, f"{name}: {flag} is the pod name (downward API)", v)

    # Probes.
    for dep in deps:
        ports = container_ports(dep)
        for c in pod_spec(dep)["containers"] + pod_spec(dep).get("initContainers", []):
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                p = c.get(kind)
                if not p:
                    continue
                h = p.get("httpGet") or p.get("tcpSocket") or p.get("grpc")
                if h is not None:
                    r.check(h.get("port") in ports, f"{name}: {dep['metadata']['name']} {kind} port "
                            f"{h.get('port')} is a container port")
    # The router's liveness is on its metrics listener (--metrics-port: its own threads and
    # connections, which an overloaded API port cannot starve); the rest on the ports they judge.
    api_port = int(flag_value(rargv, "--port") or 8000)
    router_metrics = int(flag_value(rargv, "--metrics-port") or 0)
    for dep, c, want in ((router, rc, {"startupProbe": api_port, "livenessProbe": router_metrics,
                                       "readinessProbe": api_port}),
                         (worker, wc, dict.fromkeys(("startupProbe", "livenessProbe", "readinessProbe"), metrics_port))):
        ports = container_ports(dep)
        for kind, path in (("startupProbe", "/health"), ("livenessProbe", "/health"), ("readinessProbe", "/ready")):
            port = want[kind]
            h = (c.get(kind) or {}).get("httpGet") or {}
            r.check(h.get("path") == path and ports.get(h.get("port")) == port,
                    f"{name}: {dep['metadata']['name']} {kind} is GET {path} on port {port}",
                    f"{h.get('path')} on {h.get('port')}")

    # Graceful shutdown: the grace period (which includes preStop) outlasts preStop + delay + drain.
    for dep, c, flags in ((router, rc, ("--shutdown-delay-s", "--drain-timeout-s")), (worker, wc, ("--drain-timeout-s",))):
        argv = args_of(c)
        grace = pod_spec(dep).get("terminationGracePeriodSeconds", 30)
        pre = (c.get("lifecycle") or {}).get("preStop")
        pre_s = 0.0
        if pre:
            if "sleep" in pre:
                pre_s = float(pre["sleep"]["seconds"])
            else:
                cmd = " ".join((pre.get("exec") or {}).get("command", []))
                m = re.search(r"\bsleep\s+([0-9.]+)", cmd)
                r.check(bool(m), f"{name}: {dep['metadata']['name']} preStop has a bounded duration", cmd)
                pre_s = float(m.group(1)) if m else 0.0
        parts = []
        for f in flags:
            v = flag_value(argv, f)
            r.check(v is not None, f"{name}: {dep['metadata']['name']} sets {f} explicitly")
            parts.append(float(v or 0))
        total = pre_s + sum(parts)
        r.check(grace > total, f"{name}: {dep['metadata']['name']} terminationGracePeriodSeconds {grace} > "
                f"preStop {pre_s:g} + {' + '.join(f'{f} {p:g}' for f, p in zip(flags, parts))} = {total:g}")

    # Tenants from a Secret, mounted as a file.
    tpath = flag_value(rargv, "--tenants")
    mounts = [m for m in rc.get("volumeMounts", []) if tpath and tpath.startswith(m["mountPath"].rstrip("/") + "/")]
    vols = {v["name"]: v for v in pod_spec(router).get("volumes", [])}
    secret = None
    if mounts and "secret" in vols.get(mounts[0]["name"], {}):
        sname = vols[mounts[0]["name"]]["secret"]["secretName"]
        secret = next((d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == sname
                       and ns_of(d) == ns_of(router)), None)
    key = os.path.basename(tpath or "")
    r.check(secret is not None and key in secret.get("data", {}),
            f"{name}: router --tenants {tpath} is key {key} of a Secret in the render")
    if secret is not None and key in secret.get("data", {}):
        import base64
        try:
            t = json.loads(base64.b64decode(secret["data"][key]))
            r.check(isinstance(t.get("tenants"), list) and all(x.get("keys") for x in t["tenants"]),
                    f"{name}: the tenants file is a list of tenants with keys")
        except ValueError as e:
            r.check(False, f"{name}: the tenants file is JSON", str(e))

    # NetworkPolicy: only routers reach the workers' ZeroMQ port; metrics only from Prometheus.
    def port_in(rule_ports, port_name, port_num):
        return not rule_ports or any(p.get("port") in (port_name, port_num) for p in rule_ports)
    zmq_name = next((k for k, v in wports.items() if isinstance(k, str) and v == zmq_port), None)
    met_name = next((k for k, v in wports.items() if isinstance(k, str) and v == metrics_port), None)
    nps = [n for n in docs if n["kind"] == "NetworkPolicy" and ns_of(n) == wns
           and selects(n["spec"]["podSelector"], pod_labels(worker)) and "Ingress" in n["spec"].get("policyTypes", ["Ingress"])]
    r.check(bool(nps), f"{name}: a NetworkPolicy selects the worker pods (ingress)")
    zmq_peers, met_peers = [], []
    for n in nps:
        for rule in n["spec"].get("ingress", []):
            peers = rule.get("from")
            if peers is None:
                peers = [{"any": True}]
            if port_in(rule.get("ports"), zmq_name, zmq_port):
                zmq_peers += peers
            if port_in(rule.get("ports"), met_name, metrics_port):
                met_peers += peers
    router_only = bool(zmq_peers) and all(set(p) == {"podSelector"} and selects(p["podSelector"], pod_labels(router))
                                          for p in zmq_peers)
    r.check(router_only, f"{name}: only router pods may reach the workers' ZeroMQ port {zmq_port}", str(zmq_peers))
    r.check(bool(met_peers) and all("namespaceSelector" in p or selects(p.get("podSelector"), pod_labels(router))
                                    for p in met_peers),
            f"{name}: the workers' metrics port is open to Prometheus (another namespace)", str(met_peers))
    for d in by_role.get("redis", []):
        rnps = [n for n in docs if n["kind"] == "NetworkPolicy" and selects(n["spec"]["podSelector"], pod_labels(d))]
        peers = [p for n in rnps for rule in n["spec"].get("ingress", []) for p in (rule.get("from") or [{"any": True}])]
        r.check(bool(peers) and all(set(p) == {"podSelector"} and selects(p["podSelector"], pod_labels(router))
                                    for p in peers), f"{name}: only router pods may reach Redis")

    # Disruption budgets.
    for b in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        targets = [d for d in deps if ns_of(d) == ns_of(b) and selects(b["spec"]["selector"], pod_labels(d))]
        r.check(len(targets) == 1, f"{name}: PodDisruptionBudget {b['metadata']['name']} selects one Deployment")
        for t in targets:
            # Replicas as the Deployment says, or, under KEDA (which owns them), its minimum.
            scalers = [so for so in docs if so["kind"] == "ScaledObject" and ns_of(so) == ns_of(t)
                       and so["spec"]["scaleTargetRef"]["name"] == t["metadata"]["name"]]
            reps = t["spec"].get("replicas", scalers[0]["spec"].get("minReplicaCount", 0) if scalers else 1)
            ok = ("maxUnavailable" in b["spec"] and int(b["spec"]["maxUnavailable"]) >= 1) or \
                 ("minAvailable" in b["spec"] and int(b["spec"]["minAvailable"]) < reps)
            r.check(ok, f"{name}: PodDisruptionBudget {b['metadata']['name']} lets a drain evict a pod")
    for want in (router, worker):
        r.check(any(selects(b["spec"]["selector"], pod_labels(want)) for b in docs if b["kind"] == "PodDisruptionBudget"),
                f"{name}: {want['metadata']['name']} has a PodDisruptionBudget")

    # Resources, security.
    for dep in deps:
        ps = pod_spec(dep)
        r.check(ps.get("securityContext", {}).get("runAsNonRoot") is True,
                f"{name}: {dep['metadata']['name']} runs as non-root")
        for c in ps["containers"] + ps.get("initContainers", []):
            req = (c.get("resources") or {}).get("requests", {})
            r.check("cpu" in req and "memory" in req, f"{name}: {dep['metadata']['name']}/{c['name']} requests cpu and memory")
            r.check((c.get("securityContext") or {}).get("allowPrivilegeEscalation") is False,
                    f"{name}: {dep['metadata']['name']}/{c['name']} cannot escalate privileges")
            # Images (tags, digests, the registry.invalid placeholders): tests/deploy/test_image_pins.py.
    # QoS as the kubelet computes it: Guaranteed when every container, init containers included,
    # limits cpu and memory to exactly what it requests. The worker's resources claim it (its
    # memory is sized to the KV budget: it must never be the first evicted).
    def guaranteed(ps):
        for c in ps["containers"] + ps.get("initContainers", []):
            res = c.get("resources") or {}
            lim, req = res.get("limits", {}), res.get("requests", {})
            for k in ("cpu", "memory"):
                if k not in lim or (k in req and req[k] != lim[k]):
                    return False
        return True
    r.check(guaranteed(pod_spec(worker)), f"{name}: the worker pod is Guaranteed QoS (init container included)")
    for dep in deps:
        sel = pod_spec(dep).get("nodeSelector") or {}
        if role(dep) in ("router", "worker"):
            r.check(sel.get("kubernetes.io/arch") == "amd64",
                    f"{name}: {dep['metadata']['name']} runs on amd64 nodes only (its binaries are x86-64)", str(sel))
    res = wc.get("resources") or {}
    gpu = (flag_value(wargv, "--device") or "cpu").startswith("cuda")
    limits, requests = res.get("limits", {}), res.get("requests", {})
    if gpu:
        r.check(str(limits.get("nvidia.com/gpu")) == "1" and str(requests.get("nvidia.com/gpu", 1)) == "1",
                f"{name}: CUDA worker has nvidia.com/gpu: 1")
        r.check("cuda" in wc.get("image", ""), f"{name}: CUDA worker runs the CUDA image", wc.get("image"))
    else:
        r.check("nvidia.com/gpu" not in limits, f"{name}: CPU worker requests no GPU")
    model_path = flag_value(wargv, "--model") or ""
    local = os.path.join(ROOT, "models", os.path.basename(model_path))
    model_bytes = os.path.getsize(local) if os.path.exists(local) else 0
    kv_mb = flag_value(wargv, "--kv-memory-mb")
    need = model_bytes + (1 << 30 if gpu else (int(kv_mb) * MIB if kv_mb else 0) + 512 * MIB)
    mem = quantity_bytes(requests.get("memory", 0))
    r.check(mem >= need and quantity_bytes(limits.get("memory", 0)) >= mem,
            f"{name}: worker memory request {mem / MIB:.0f} MiB >= "
            + ("model + 1 GiB for the CUDA runtime" if gpu else f"KV {kv_mb} MiB + model + 512 MiB")
            + f" = {need / MIB:.0f} MiB" + ("" if model_bytes else " (model file not here: counted as 0)"))
    threads = flag_value(wargv, "--threads")
    r.check(threads is not None and quantity_cpu(requests.get("cpu", 0)) >= int(threads),
            f"{name}: worker cpu request >= --threads ({threads})")
    model_id = os.path.basename(model_path)[:-5] if model_path.endswith(".gguf") else os.path.basename(model_path)
    r.check(pod_labels(worker).get("switchyard.dev/model") == model_id,
            f"{name}: worker pod label switchyard.dev/model is the served model ({model_id})")

    model_source(r, name, docs, worker)

    # Autoscaling (when the KEDA component is in).
    for so in (d for d in docs if d["kind"] == "ScaledObject"):
        ref = so["spec"]["scaleTargetRef"]
        r.check(ref.get("kind", "Deployment") == "Deployment" and ref["name"] == worker["metadata"]["name"]
                and ns_of(so) == wns, f"{name}: ScaledObject scales the worker Deployment")
        r.check(so["spec"].get("minReplicaCount", 0) >= 1 and "idleReplicaCount" not in so["spec"],
                f"{name}: ScaledObject keeps at least one worker")
        r.check("replicas" not in worker["spec"], f"{name}: the autoscaled worker Deployment sets no replicas")
        max_running = int(flag_value(wargv, "--max-running") or 32)
        for t in so["spec"]["triggers"]:
            md = t["metadata"]
            r.check(float(md.get("threshold", 0)) == max_running * 3 // 4,
                    f"{name}: trigger threshold {md.get('threshold')} = 3/4 of the workers' --max-running {max_running}")
            q = md.get("query", "")
            r.check(f'namespace="{wns}"' in q and f'model="{model_id}"' in q,
                    f"{name}: trigger query is for namespace {wns} and model {model_id}")
    for sm in (d for d in docs if d["kind"] == "ServiceMonitor"):
        sel = sm["spec"]["selector"]
        ss = [s for s in svcs if ns_of(s) == ns_of(sm) and selects(sel, s["metadata"].get("labels", {}))]
        r.check(len(ss) == 1, f"{name}: ServiceMonitor {sm['metadata']['name']} selects one Service by its labels")
        for s in ss:
            names = {p.get("name") for p in s["spec"]["ports"]}
            for e in sm["spec"]["endpoints"]:
                r.check(e.get("port") in names, f"{name}: ServiceMonitor {sm['metadata']['name']} port {e.get('port')} "
                        f"is a port of Service {s['metadata']['name']}")
                for rl in e.get("relabelings", []):
                    for src in rl.get("sourceLabels", []):
                        m = re.fullmatch(r"__meta_kubernetes_pod_label_(\w+)", src)
                        if m:
                            pods = [d for d in deps if selects(s["spec"]["selector"], pod_labels(d))]
                            have = {re.sub(r"[^a-zA-Z0-9_]", "_", k) for d in pods for k in pod_labels(d)}
                            r.check(m.group(1) in have, f"{name}: relabeling source {src} is a pod label")


def env_of(container, docs):
    """A container's environment as literal values: its `env` values and the ConfigMaps it takes
    with envFrom (from the rendered `docs`)."""
    env = {}
    for src in container.get("envFrom") or []:
        ref = (src.get("configMapRef") or {}).get("name")
        cm = next((d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == ref), None)
        env.update((cm or {}).get("data") or {})
    env.update({e["name"]: e["value"] for e in container.get("env") or [] if "value" in e})
    return env


def mount_of(container, path):
    """The volume mount of `container` that holds `path` (the deepest one)."""
    mounts = [m for m in container.get("volumeMounts") or []
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    return max(mounts, key=lambda m: len(m["mountPath"])) if mounts else None


def model_source(r, name, docs, worker):
    """The model the worker's --model names comes from a volume it mounts read-only: the models claim
    (ReadOnlyMany, no storage class: the operator's choice), an image volume, or an emptyDir an init
    container fills with that file. With the claim (the default), the worker has no init container
    at all: nothing reaches the network at a pod start."""
    ps = pod_spec(worker)
    wc = ps["containers"][0]
    model = flag_value(args_of(wc), "--model") or ""
    m = mount_of(wc, model)
    r.check(m is not None and m.get("readOnly") is True,
            f"{name}: the worker mounts the volume that holds --model {model} read-only", str(m))
    if m is None:
        return
    vol = next((v for v in ps.get("volumes", []) if v["name"] == m["name"]), {})
    inits = ps.get("initContainers", [])
    if "persistentVolumeClaim" in vol:
        pvc = vol["persistentVolumeClaim"]
        claim = next((d for d in docs if d["kind"] == "PersistentVolumeClaim" and ns_of(d) == ns_of(worker)
                      and d["metadata"]["name"] == pvc["claimName"]), None)
        r.check(claim is not None, f"{name}: the models claim {pvc['claimName']} is in the worker's namespace")
        if claim:
            r.check(claim["spec"].get("accessModes") == ["ReadOnlyMany"],
                    f"{name}: the models claim is ReadOnlyMany", str(claim["spec"].get("accessModes")))
            r.check("storageClassName" not in claim["spec"],
                    f"{name}: the models claim leaves the storage class to the operator (the cluster's default)")
        r.check(pvc.get("readOnly") is True, f"{name}: the models claim is attached read-only")
        r.check(not inits, f"{name}: the worker with the models claim has no init container (nothing fetched at a pod start)",
                str([c["name"] for c in inits]))
    elif "image" in vol:
        ref = vol["image"].get("reference", "")
        r.check(bool(ref) and vol["image"].get("pullPolicy") in ("IfNotPresent", "Never"),
                f"{name}: the model comes from the image volume {ref}, pulled once per node")
        r.check(not inits, f"{name}: the worker with the image volume has no init container",
                str([c["name"] for c in inits]))
    else:
        fillers = [c for c in inits if env_of(c, docs).get("MODEL_FILE") == model and
                   any(x["name"] == m["name"] and not x.get("readOnly") for x in c.get("volumeMounts") or [])]
        r.check("emptyDir" in vol and len(fillers) == 1,
                f"{name}: an init container writes --model {model} onto the pod's emptyDir", str(vol))
    if name.startswith("overlays/"):
        r.check("persistentVolumeClaim" in vol, f"{name}: the shipped overlay reads the model from the models claim")


def loader(r, kv, worker_docs):
    """deploy/k8s/model-loader: renders; validates; one Job, which mounts the models claim of the
    overlays writable (the only pod that does), runs as the workers' user and group, and writes the
    file the workers' --model names."""
    try:
        docs = render(LOADER)
    except RuntimeError as e:
        r.check(False, f"{LOADER}: renders", str(e))
        return
    r.check(True, f"{LOADER}: renders ({len(docs)} resources)")
    validate_core(r, LOADER, docs, kv)
    jobs = [d for d in docs if d["kind"] == "Job"]
    r.check(len(jobs) == 1 and all("namespace" not in d["metadata"] for d in docs),
            f"{LOADER}: one Job, no namespace (applied with the overlay's, -n)")
    if not jobs or not worker_docs:
        return
    worker = next(d for d in worker_docs if d["kind"] == "Deployment" and role(d) == "worker")
    claim = next(d for d in worker_docs if d["kind"] == "PersistentVolumeClaim")
    js = jobs[0]["spec"]["template"]["spec"]
    c = js["containers"][0]
    env = env_of(c, docs)
    model = flag_value(args_of(pod_spec(worker)["containers"][0]), "--model")
    r.check(env.get("MODEL_FILE") == model, f"{LOADER}: the Job writes the file the workers load ({model})",
            str(env.get("MODEL_FILE")))
    m = mount_of(c, model)
    vol = next((v for v in js.get("volumes", []) if m and v["name"] == m["name"]), {})
    r.check(m is not None and not m.get("readOnly") and
            (vol.get("persistentVolumeClaim") or {}).get("claimName") == claim["metadata"]["name"]
            and not vol["persistentVolumeClaim"].get("readOnly"),
            f"{LOADER}: the Job mounts the models claim {claim['metadata']['name']} writable", str(vol))
    wsc, jsc = pod_spec(worker).get("securityContext", {}), js.get("securityContext", {})
    r.check(jsc.get("runAsNonRoot") is True and all(jsc.get(k) == wsc.get(k) for k in ("runAsUser", "runAsGroup")),
            f"{LOADER}: the Job runs as the workers' user and group, non-root")
    r.check(js.get("restartPolicy") in ("Never", "OnFailure") and jobs[0]["spec"].get("backoffLimit", 6) <= 6,
            f"{LOADER}: the Job gives up after a few failures")
    req = (c.get("resources") or {}).get("requests", {})
    r.check("cpu" in req and "memory" in req and (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is False,
            f"{LOADER}: the Job's container requests cpu and memory and cannot escalate privileges")


def main():
    parse_args()
    need_modules("yaml", "jsonschema", "referencing", "kubernetes_validate")
    tool("kubectl")
    kv = tool("kubernetes-validate")
    import kubernetes_validate.utils as kvu
    shipped = kvu.all_versions()
    missing = [v for v in K8S_VERSIONS if v not in shipped]
    if missing:
        skip(f"kubernetes-validate {kvu.__dict__.get('__version__', '')} lacks Kubernetes {missing}")
    validators = crd_validators()
    r = Report()
    rendered = {}
    for k in KUSTOMIZATIONS:
        try:
            docs = rendered[k] = render(k)
        except RuntimeError as e:
            r.check(False, f"{k}: renders", str(e))
            continue
        r.check(True, f"{k}: renders ({len(docs)} resources)")
        core = [d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)]
        validate_core(r, k, core, kv)
        validate_crds(r, k, [d for d in docs if d["apiVersion"].startswith(CRD_GROUPS)], validators)
        semantic(r, k, docs)
    loader(r, kv, rendered.get("overlays/cpu"))
    r.close()


if __name__ == "__main__":
    main()
