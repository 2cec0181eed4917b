"""One namespace, one model label (docs/operations.md, "One namespace, one model label"): an
overlay's `namespace:` is the only place the namespace is written, and the worker pod's
switchyard.dev/model label the only place its model is named for Kubernetes and Prometheus.
  * only the overlays (overlays/*) set `namespace:`; the base and the kustomizations that add the
    components do not (a namespace set there would not reach the KEDA query);
  * a copy of deploy/k8s whose overlays set another namespace renders every kustomization with
    every namespaced object in it, the Namespace object named so, the routers' --workers-dns name
    resolving to it (downward API), every namespace matcher of the KEDA query naming it, and no
    namespace reference to the old one left anywhere in the output;
  * another model label in that copy is the worker Deployment's own label too (kube-state-metrics
    exports it: the autoscaling rules map a Deployment to its model by it) and every model matcher
    of the query.

    .venv/bin/python tests/deploy/test_namespace.py      (ctest: deploy/k8s-namespace)"""
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import (KUSTOMIZATIONS, Report, args_of, expand, flag_value, k8s_tree,  # noqa: E402
                           need_modules, parse_args, render, tool)

OLD = "switchyard"
NEW = "sy-moved-ns"
NEW_MODEL = "Llama-3.2-1B-Instruct-Q4_K_M"
# Kinds that are not namespaced (everything else the overlays render is).
CLUSTER_KINDS = {"Namespace"}


def old_references(text, old):
    """Places in rendered YAML that name namespace `old`: a metadata or matcher `namespace`, a
    Service DNS name in it, a namespaceSelector on its name label."""
    pats = [rf"\bnamespace:\s*['\"]?{old}['\"]?\s*$", rf"namespace\s*=~?\s*\\?\"{old}\\?\"",
            rf"\.{old}\.svc\b", rf"kubernetes\.io/metadata\.name:\s*['\"]?{old}['\"]?\s*$"]
    return [m.group(0).strip() for p in pats for m in re.finditer(p, text, re.M)]


def kustomization(tree, k):
    import yaml
    with open(os.path.join(tree, k, "kustomization.yaml")) as f:
        return yaml.safe_load(f)


def moved_tree(tmp):
    """A copy of k8s_tree() whose overlays set namespace NEW and whose worker serves NEW_MODEL (its
    label), edited as an operator would (kubectl has no `kustomize edit`: the YAML is rewritten)."""
    import yaml
    tree = os.path.join(tmp, "k8s")
    shutil.copytree(k8s_tree(), tree)
    for ov in sorted(os.listdir(os.path.join(tree, "overlays"))):
        path = os.path.join(tree, "overlays", ov, "kustomization.yaml")
        with open(path) as f:
            k = yaml.safe_load(f)
        k["namespace"] = NEW
        with open(path, "w") as f:
            yaml.safe_dump(k, f, sort_keys=False)
    path = os.path.join(tree, "base", "worker.yaml")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(re.sub(r"(switchyard\.dev/model:) \S+", rf"\1 {NEW_MODEL}", text))
    return tree


def main():
    parse_args()
    need_modules("yaml")
    import yaml
    tool("kubectl")
    r = Report()
    tree = k8s_tree()

    r.check("namespace" not in kustomization(tree, "base"), "the base sets no namespace (the overlay does)")
    for k in KUSTOMIZATIONS:
        kz = kustomization(tree, k)
        if k.startswith("overlays/"):
            r.check(kz.get("namespace") == OLD, f"{k}: sets the namespace ({OLD})", str(kz.get("namespace")))
        else:
            r.check("namespace" not in kz, f"{k}: sets no namespace (its overlay does: the components copy it)",
                    str(kz.get("namespace")))
        text = yaml.safe_dump_all(render(k))
        r.check(bool(old_references(text, OLD)), f"{k}: the shipped render names namespace {OLD} "
                "(the pattern of old references finds it)")

    with tempfile.TemporaryDirectory() as tmp:
        moved = moved_tree(tmp)
        for k in KUSTOMIZATIONS:
            docs = render(k, moved)
            text = yaml.safe_dump_all(docs)
            left = old_references(text, OLD)
            r.check(not left, f"{k}: with namespace {NEW} in the overlay, nothing names namespace {OLD}",
                    "; ".join(sorted(set(left))))
            wrong = [f"{d['kind']}/{d['metadata']['name']}: {d['metadata'].get('namespace')}" for d in docs
                     if d["kind"] not in CLUSTER_KINDS and d["metadata"].get("namespace") != NEW]
            r.check(not wrong, f"{k}: every namespaced object is in {NEW}", "; ".join(wrong))
            nss = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
            r.check(nss == [NEW], f"{k}: the Namespace object is {NEW}", str(nss))
            router = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "switchyard-router")
            c = router["spec"]["template"]["spec"]["containers"][0]
            dns = expand(flag_value(args_of(c), "--workers-dns") or "", c,
                         dict(router["spec"]["template"]["metadata"], namespace=router["metadata"].get("namespace")))
            r.check(dns == f"switchyard-worker.{NEW}.svc.cluster.local:5555",
                    f"{k}: the routers' --workers-dns resolves to the workers' Service in {NEW}", dns)
            worker = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "switchyard-worker")
            labels = (worker["metadata"].get("labels", {}).get("switchyard.dev/model"),
                      worker["spec"]["template"]["metadata"]["labels"].get("switchyard.dev/model"))
            r.check(labels == (NEW_MODEL, NEW_MODEL),
                    f"{k}: the worker Deployment and its pods carry the new model label ({NEW_MODEL})", str(labels))
            for so in (d for d in docs if d["kind"] == "ScaledObject"):
                q = so["spec"]["triggers"][0]["metadata"]["query"]
                namespaces = re.findall(r'namespace="([^"]*)"', q)
                models = re.findall(r'model="([^"]*)"', q)
                deployments = re.findall(r'deployment="([^"]*)"', q)
                r.check(len(namespaces) == 4 and set(namespaces) == {NEW},
                        f"{k}: every namespace matcher of the KEDA query names {NEW}", str(namespaces))
                r.check(len(models) == 2 and set(models) == {NEW_MODEL},
                        f"{k}: every model matcher of the KEDA query names {NEW_MODEL}", str(models))
                r.check(len(deployments) == 2 and set(deployments) == {so["spec"]["scaleTargetRef"]["name"]},
                        f"{k}: the KEDA query's Deployment is the one it scales", str(deployments))
    r.close()


if __name__ == "__main__":
    main()
