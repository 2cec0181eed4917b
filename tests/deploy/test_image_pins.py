"""Image pinning (docs/operations.md, "Pinning images"), in every kustomization an operator may
apply (and the model loader):
  * every container image (init containers included) and image volume names a tag other than
    `latest`, or a digest;
  * Switchyard's own images are the registry.invalid placeholders (the operator builds and pushes
    them, so their digests exist only in the operator's registry);
  * every third-party image either carries a digest or is listed "to pin" in the docs' table, and
    every image that table lists is one the manifests run (no stale rows);
  * examples/cpu-pinned pins every image by digest as NAME:TAG@sha256:<64 hex>, so the form the
    overlays document renders and validates (deploy/k8s-manifests validates it like the others).

    .venv/bin/python tests/deploy/test_image_pins.py      (ctest: deploy/image-pins)"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import KUSTOMIZATIONS, LOADER, ROOT, Report, need_modules, parse_args, render, tool  # noqa: E402

DOC = os.path.join(ROOT, "docs", "operations.md")
PINNED = "examples/cpu-pinned"
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
OURS = "switchyard/"


def images(docs):
    """(where, image) of every container, init container and image volume of the rendered pods."""
    out = []
    for d in docs:
        spec = (((d.get("spec") or {}).get("template") or {}).get("spec")) or {}
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            out.append((f"{d['metadata']['name']}/{c['name']}", c.get("image", "")))
        for v in spec.get("volumes", []):
            if "image" in v:
                out.append((f"{d['metadata']['name']}/volume {v['name']}", v["image"].get("reference", "")))
    return out


def to_pin():
    """The images docs/operations.md lists "to pin": the backquoted first cell of each row of the
    table under "### Pinning images" whose last cell says so."""
    with open(DOC) as f:
        text = f.read()
    m = re.search(r"^### Pinning images\n(.*?)(?=^#)", text, re.M | re.S)
    if not m:
        return None
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in m.group(1).splitlines() if line.startswith("| `")]
    return {re.sub(r"`", "", r[0]) for r in rows if "to pin" in r[-1]}


def main():
    parse_args()
    need_modules("yaml")
    tool("kubectl")
    r = Report()
    listed = to_pin()
    r.check(listed is not None, "docs/operations.md has the \"### Pinning images\" table")
    listed = listed or set()
    used = set()
    for k in KUSTOMIZATIONS + [LOADER]:
        for where, img in images(render(k)):
            name = f"{k}: {where}"
            tag = re.search(r":([\w.-]+)(@sha256:[0-9a-f]{64})?$", img.split("/")[-1])
            r.check(bool(DIGEST.search(img)) or (tag is not None and tag.group(1) != "latest"),
                    f"{name}: {img} names a tag other than latest, or a digest")
            if OURS in img:
                r.check(img.startswith("registry.invalid/switchyard/"),
                        f"{name}: {img} is the registry.invalid placeholder until the operator's registry")
                continue
            used.add(img)
            r.check(bool(DIGEST.search(img)) or img in listed,
                    f"{name}: third-party {img} is pinned by digest or listed to pin in docs/operations.md",
                    f"listed: {sorted(listed)}")
        if k == PINNED:
            for where, img in images(render(k)):
                r.check(re.search(r":[\w.-]+@sha256:[0-9a-f]{64}$", img) is not None,
                        f"{k}: {where}: {img} is NAME:TAG@sha256:DIGEST")
    r.check(bool(listed) and listed <= used, "every image docs/operations.md lists to pin is one the manifests run",
            f"stale: {sorted(listed - used)}")
    r.close()


if __name__ == "__main__":
    main()
