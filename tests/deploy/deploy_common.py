"""Shared by the deployment checks in tests/deploy/ (ctest label `deploy`).

Each check is a plain script: it prints one line per finding, closes with "N passed, N failed",
and exits 0 (all passed), 1 (a failure) or 77 (a tool or input is missing: a visible skip for
ctest, but a failure when the environment variable CI is set, so CI cannot pass by skipping)."""
import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV_BIN = os.path.join(ROOT, ".venv", "bin")
K8S = os.path.join(ROOT, "deploy", "k8s")
# Every kustomization an operator may apply: the overlays, and the examples that add the optional
# components (ServiceMonitors + PrometheusRule, KEDA ScaledObject, another model source) to them or
# pin its images.
KUSTOMIZATIONS = ["overlays/cpu", "overlays/gpu", "examples/cpu-autoscaled", "examples/gpu-autoscaled",
                  "examples/cpu-pinned", "examples/cpu-model-pypi", "examples/cpu-model-image"]
# The default model source's one-time loader (a Job, applied in the overlay's namespace with -n).
LOADER = "model-loader"


def skip(reason):
    """A missing tool or input: exit 77, or 1 under CI."""
    if os.environ.get("CI"):
        print(f"FAIL: {reason} (CI is set: a skip is a failure; run deploy/setup.sh)")
        sys.exit(1)
    print(f"SKIP: {reason} (deploy/setup.sh installs it)")
    sys.exit(77)


def tool(name):
    """The project's copy in .venv/bin first (deploy/setup.sh), else one on PATH; else skip."""
    p = os.path.join(VENV_BIN, name)
    if os.access(p, os.X_OK):
        return p
    p = shutil.which(name)
    if p:
        return p
    skip(f"{name} is not installed")


def need_modules(*names):
    for n in names:
        try:
            __import__(n)
        except ImportError:
            skip(f"Python module {n} is missing (run the check with .venv/bin/python)")


_tree = None


def k8s_tree():
    """deploy/k8s as an operator has it after `python3 deploy/k8s/make-secrets.py`: a copy (made
    once per run, removed at exit) with freshly generated secrets, so that the checks never need,
    or leave behind, secret files in the source tree."""
    global _tree
    if _tree is None:
        import atexit
        import tempfile
        tmp = tempfile.mkdtemp(prefix="sy-k8s-")
        atexit.register(shutil.rmtree, tmp, True)
        _tree = os.path.join(tmp, "k8s")
        shutil.copytree(K8S, _tree, ignore=shutil.ignore_patterns("generated-secrets"))
        out = subprocess.run([sys.executable, os.path.join(_tree, "make-secrets.py")], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"make-secrets.py: {out.stderr.strip()}")
    return _tree


def secrets_dir():
    """The generated secrets of k8s_tree() (what the overlays' Secrets hold)."""
    return os.path.join(k8s_tree(), "base", "generated-secrets")


def render(kustomization, tree=None):
    """`kubectl kustomize` of a folder under deploy/k8s (in k8s_tree(), unless `tree` is given):
    the list of resources it produces."""
    import yaml
    out = subprocess.run([tool("kubectl"), "kustomize", os.path.join(tree or k8s_tree(), kustomization)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {kustomization}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


class Report:
    """Collects check results; `close()` prints the summary line and exits."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print(f"ok: {what}")
        else:
            self.failed += 1
            print(f"FAIL: {what}" + (f": {detail}" if detail else ""))
        return ok

    def close(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)


def args_of(container):
    """A container's command + args as one list of strings."""
    return [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]


def flag_value(argv, flag):
    """The value of `--flag V` or `--flag=V` (the last one wins, as in common/cli_args.hpp), or None."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return value


def expand(value, container, pod_meta):
    """`value` with each $(VAR) replaced as the kubelet does for args: from the container's env, a
    literal `value` or a downward-API fieldRef (metadata.name, metadata.namespace,
    metadata.labels['KEY']) of the pod `pod_meta` (its metadata); a reference it cannot resolve
    stays as written."""
    import re
    env = {e["name"]: e for e in (container.get("env") or [])}

    def one(m):
        e = env.get(m.group(1))
        if e is None:
            return m.group(0)
        if "value" in e:
            return str(e["value"])
        path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        if path in ("metadata.name", "metadata.namespace"):
            return str(pod_meta.get(path.split(".")[1], m.group(0)))
        label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
        if label:
            return str((pod_meta.get("labels") or {}).get(label.group(1), m.group(0)))
        return m.group(0)
    return re.sub(r"\$\((\w+)\)", one, value)


def parse_args():
    """Every check takes the binaries this build made (tests/CMakeLists.txt passes them to all):
    --router PATH --worker PATH, defaulting to build/."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", default=os.path.join(ROOT, "build", "router", "switchyard-router"))
    ap.add_argument("--worker", default=os.path.join(ROOT, "build", "worker", "switchyard-worker"))
    return ap.parse_args()
