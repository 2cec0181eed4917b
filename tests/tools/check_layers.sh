#!/usr/bin/env bash
# Fails when an include points up (docs/architecture.md, "Layers"): every source file under
# router/, worker/, cache/, common/ and kernels/ belongs to a layer (its folder), and may include
# only its own layer and the layers below it. The order is declared here, top first; a source file
# in a folder not declared fails too, so that a new folder is placed in the order on purpose.
# Reads only the tracked (or new, not ignored) sources; no build needed. Exit 77 (ctest: skipped)
# without git or python3, 1 with CI set. ctest: style/layers.
cd "$(dirname "$0")/../.." || exit 1
. tests/tools/skip_lib.sh
command -v python3 >/dev/null || skip layers "no python3"
git rev-parse --git-dir >/dev/null 2>&1 || skip layers "not a git checkout"

read -r -d '' prog <<'PY'
import os, re, sys

# Each part's layers, top first ("" is the part's own folder). A file may include its own layer
# and any layer after it in its part's list.
layers = {
    "router": ["", "http", "dispatch", "openai", "fleet", "tracing", "base"],
    "worker": ["cli", "service", "engine", "model"],
    "cache": [""],
    "common": ["tokenizer", "structured", "wire", ""],
    "kernels": ["cuda", "cpu"],
}
# The parts each part may include besides itself (all of their layers).
below = {
    "router": {"cache", "common"},
    "worker": {"kernels", "common"},
    "cache": {"common"},
    "kernels": {"common"},
    "common": set(),
}
exts = (".hpp", ".cpp", ".h", ".cu", ".cuh")
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    """(part, layer) of a repository path, or None outside the parts."""
    parts = path.split("/")
    if parts[0] not in layers:
        return None
    return parts[0], (parts[1] if len(parts) > 2 else "")


problems = []
files = sorted({f for f in sys.stdin.read().split("\0") if f.endswith(exts) and os.path.isfile(f)})
checked = 0
for path in files:
    at = layer_of(path)
    if at is None:
        continue
    part, layer = at
    if layer not in layers[part]:
        problems.append("%s: folder %s/%s is not in the layer order (tests/tools/check_layers.sh)"
                        % (path, part, layer or "."))
        continue
    checked += 1
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            m = include.match(line)
            if not m:
                continue
            to = layer_of(m.group(1))
            if to is None:
                continue  # a system or third-party header, or a path relative to the file
            to_part, to_layer = to
            if to_part != part:
                if to_part not in below[part]:
                    problems.append("%s:%d: includes %s: %s may include only %s" % (
                        path, i, m.group(1), part, ", ".join(sorted(below[part])) or "itself"))
                continue
            if to_layer not in layers[part]:
                problems.append("%s:%d: includes %s, in no declared layer" % (path, i, m.group(1)))
            elif layers[part].index(to_layer) < layers[part].index(layer):
                problems.append("%s:%d: includes %s: %s/%s is above %s/%s" % (
                    path, i, m.group(1), part, to_layer, part, layer or "."))

for p in problems:
    print(p)
if problems:
    print("%d include(s) pointing up or out of the layer order; docs/architecture.md, \"Layers\", "
          "says where a type belongs" % len(problems))
    sys.exit(1)
print("layers: %d files, every include points down" % checked)
PY
git ls-files -z --cached --others --exclude-standard | python3 -c "$prog"
