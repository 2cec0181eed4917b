"""The flags the images and the Kubernetes manifests pass exist in the binaries this build made.

Flags come from each Dockerfile's ENTRYPOINT + CMD (deploy/docker/) and from the router and worker
containers of every kustomization under deploy/k8s (rendered with `kubectl kustomize`). A flag
exists when the binary accepts it; whether its usage text (`--help`) lists it is reported too, but
cannot decide alone (the worker's usage text mixes its subcommands). common/cli_args.hpp refuses
an unknown option with "unknown option --NAME" before doing anything else, so
`switchyard-router --help --NAME V` (prints the usage and exits) and
`switchyard-worker serve --NAME V --model <missing file>` (stops at the model) tell without
starting a server. Both are asked at test time: a flag that lands in the binaries later makes
this pass then.

    .venv/bin/python tests/deploy/test_flags.py --router build/router/switchyard-router \
        --worker build/worker/switchyard-worker           (ctest: deploy/entrypoint-flags)"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import (KUSTOMIZATIONS, Report, args_of, need_modules, parse_args, render,
                           skip)  # noqa: E402
from test_images import DOCKER, IMAGES, exec_form, parse_dockerfile  # noqa: E402

MISSING_MODEL = "/nonexistent/switchyard-flag-probe.gguf"


def flags_with_values(argv):
    """[(--flag, value or None)] in order; `--flag=value` split."""
    out = []
    for i, a in enumerate(argv):
        if not a.startswith("--"):
            continue
        if "=" in a:
            name, value = a.split("=", 1)
            out.append((name, value))
        else:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out.append((a, nxt if nxt is not None and not nxt.startswith("--") else None))
    return out


def usage(binary, kind):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    return out.stdout + out.stderr


def accepted(binary, kind, flag, value):
    """(accepted, what the binary said) by the probe described above."""
    argv = [flag] + ([value] if value is not None else [])
    if kind == "router":
        cmd = [binary, "--help"] + argv
    else:
        cmd = [binary, "serve"] + argv + ["--model", MISSING_MODEL]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return False, "the probe did not stop within 60 s"
    said = (out.stdout + out.stderr).strip().splitlines()
    unknown = f"unknown option {flag.split('=')[0]}"
    return not any(unknown in l for l in said), (said[-1] if said else f"exit {out.returncode}")


def main():
    a = parse_args()
    binaries = {"router": a.router, "worker": a.worker}
    for b in binaries.values():
        if not os.access(b, os.X_OK):
            skip(f"{b} is not built")
    need_modules("yaml")

    # (binary kind, flag) → [(where, value)]
    uses = {}
    for image, (kind, _) in IMAGES.items():
        runtime = parse_dockerfile(os.path.join(DOCKER, image))[-1]
        argv = (exec_form(runtime, "ENTRYPOINT") or [])[1:] + (exec_form(runtime, "CMD") or [])
        for flag, value in flags_with_values(argv):
            uses.setdefault((kind, flag), []).append((f"deploy/docker/{image}", value))
    for k in KUSTOMIZATIONS:
        for d in render(k):
            if d["kind"] != "Deployment":
                continue
            for c in d["spec"]["template"]["spec"]["containers"]:
                image = c.get("image", "")
                kind = "router" if "switchyard/router" in image else "worker" if "switchyard/worker" in image else None
                if kind:
                    for flag, value in flags_with_values(args_of(c)):
                        uses.setdefault((kind, flag), []).append((f"deploy/k8s/{k}", value))

    r = Report()
    texts = {kind: usage(b, kind) for kind, b in binaries.items()}
    for (kind, flag), where in sorted(uses.items()):
        places = sorted({w for w, _ in where})
        label = f"switchyard-{kind} {flag} (used in {', '.join(places)})"
        listed = bool(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", texts[kind]))
        ok, said = accepted(binaries[kind], kind, flag, where[0][1])
        r.check(ok, f"{label}: " + ("accepted" if ok else "missing") +
                (" (in the usage text)" if listed else " (not in the usage text)"), said)
    print("flags expected: " + "; ".join(
        f"switchyard-{k} " + " ".join(sorted(f for kk, f in uses if kk == k)) for k in ("router", "worker")))
    r.close()


if __name__ == "__main__":
    main()
