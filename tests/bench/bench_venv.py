"""The bench-only virtual environment: the field's load generators installed from PyPI, pinned, in
the build folder (never in .venv, never committed). aiperf installs without torch and brings
transformers and matplotlib (the report's plots); guidellm 0.3.1 (no torch, but ~600 MB with
transformers) lives in a venv of its own that only tests/bench/report.py --guidellm creates.

`ensure(build, name, packages)` returns the venv's bin folder, creating or updating the venv when
its pinned requirement list changed. When PyPI cannot be reached it raises Unreachable (callers
turn that into a visible skip, exit 77, or a failure when CI is set)."""
import os
import subprocess
import sys
import urllib.error
import urllib.request

AIPERF = ["aiperf==0.13.0"]
GUIDELLM = ["guidellm==0.3.1"]


class Unreachable(RuntimeError):
    pass


def index_url():
    """The index pip would use (PIP_INDEX_URL, else PyPI)."""
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + "/"


def reachable(package, timeout=10):
    """Whether the package index answers for `package` (one small GET, bounded in time)."""
    try:
        with urllib.request.urlopen(index_url() + package + "/", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def ensure(build, name, packages, timeout_s=900):
    """bin/ of BUILD/NAME, a venv holding exactly `packages` (pip requirement strings)."""
    venv = os.path.join(build, name)
    bin_dir = os.path.join(venv, "bin")
    marker = os.path.join(venv, "switchyard-requirements.txt")
    wanted = "\n".join(sorted(packages)) + "\n"
    if os.path.exists(marker) and open(marker).read() == wanted:
        return bin_dir
    first = packages[0].split("==")[0]
    if not reachable(first):
        raise Unreachable(f"the package index {index_url()} is not reachable (needed for {' '.join(packages)})")
    if not os.path.exists(os.path.join(bin_dir, "python")):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    print(f"installing {' '.join(packages)} into {venv} (once) ...", flush=True)
    subprocess.run([os.path.join(bin_dir, "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *packages], check=True, timeout=timeout_s)
    with open(marker, "w") as f:
        f.write(wanted)
    return bin_dir


if __name__ == "__main__":
    # tests/run.sh: `bench_venv.py BUILD` installs the aiperf venv in the background while the
    # build compiles (pip waits on the network and the disk, the compiler on the CPUs); a failure
    # here is only logged: bench/aiperf_smoke tries again and reports it.
    try:
        ensure(sys.argv[1], "bench-venv", AIPERF)
    except (Unreachable, subprocess.SubprocessError, OSError) as e:
        print(f"bench venv not prepared ahead: {e}", file=sys.stderr)
