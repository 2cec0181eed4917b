"""deploy/k8s/make-secrets.py, the secrets an operator makes before the first `kubectl apply -k`:
  * without them no overlay renders, and the error names the missing generated file;
  * it writes every file the base's secretGenerator reads, secret files mode 0600, and keeps
    existing files (a second run changes nothing) unless --force;
  * its CURVE pairs are X25519 key pairs exactly as libsodium computes them, in libzmq's Z85
    (the worker's keygen format; deploy/manifest-smoke starts a worker and router on them);
  * no generated key is one the router or worker refuses as published.

    .venv/bin/python tests/deploy/test_make_secrets.py      (ctest: deploy/make-secrets)"""
import ctypes
import ctypes.util
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import K8S, ROOT, Report, need_modules, parse_args, render, tool  # noqa: E402

SCRIPT = os.path.join(K8S, "make-secrets.py")


def main():
    a = parse_args()
    need_modules("yaml")
    tool("kubectl")
    r = Report()
    spec = importlib.util.spec_from_file_location("make_secrets", SCRIPT)
    ms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ms)

    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "k8s")
        shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("generated-secrets"))
        try:
            render("overlays/cpu", tree=tree)
            r.check(False, "without generated secrets the overlay does not render")
        except RuntimeError as e:
            r.check("generated-secrets" in str(e), "without generated secrets the overlay does not render, "
                    "and the error names the missing generated file", str(e)[-200:])
        out = subprocess.run([sys.executable, os.path.join(tree, "make-secrets.py")], capture_output=True, text=True)
        r.check(out.returncode == 0, "make-secrets.py runs", out.stderr)
        gen = os.path.join(tree, "base", "generated-secrets")
        files = ["tenants.json", "link-keys/worker.key", "link-keys/worker.pub", "link-keys/router.key",
                 "link-keys/routers.pub", "cache-mac.key", "redis-password"]
        r.check(all(os.path.exists(os.path.join(gen, f)) for f in files), "it writes every file the base reads")
        for f in ("tenants.json", "link-keys/worker.key", "link-keys/router.key", "cache-mac.key", "redis-password"):
            mode = os.stat(os.path.join(gen, f)).st_mode & 0o777
            r.check(mode == 0o600, f"{f} is readable by its owner only", oct(mode))
        before = {f: open(os.path.join(gen, f)).read() for f in files}
        subprocess.run([sys.executable, os.path.join(tree, "make-secrets.py")], capture_output=True, text=True)
        r.check(before == {f: open(os.path.join(gen, f)).read() for f in files}, "a second run keeps every file")
        docs = render("overlays/cpu", tree=tree)
        secrets = {d["metadata"]["name"].rsplit("-", 1)[0] for d in docs if d["kind"] == "Secret"}
        r.check({"switchyard-tenants", "switchyard-link-keys", "switchyard-cache-mac", "switchyard-redis"} <= secrets,
                "the overlay renders with the four Secrets", str(sorted(secrets)))
        keys = [k for t in json.loads(before["tenants.json"])["tenants"] for k in t["keys"]]
        r.check(len(keys) == len(set(keys)) >= 2 and all(k.startswith("sk-") and len(k) >= 40 for k in keys),
                "the tenants have distinct, long, fresh API keys")

        # The CURVE pairs, against libsodium and libzmq.
        sodium = ctypes.util.find_library("sodium")
        zmq = ctypes.util.find_library("zmq")
        if sodium and zmq:
            lib, z = ctypes.CDLL(sodium), ctypes.CDLL(zmq)
            z.zmq_z85_decode.restype = ctypes.c_void_p
            ok = True
            for name in ("worker", "router"):
                sec = before[f"link-keys/{name}.key"].strip()
                pub = before["link-keys/worker.pub" if name == "worker" else "link-keys/routers.pub"].strip()
                raw = ctypes.create_string_buffer(32)
                ok &= z.zmq_z85_decode(raw, sec.encode()) is not None
                want = ctypes.create_string_buffer(32)
                ok &= lib.crypto_scalarmult_base(want, raw.raw) == 0
                ok &= ms.z85(want.raw) == pub and len(sec) == len(pub) == 40
            r.check(ok, "the CURVE pairs are X25519 key pairs as libsodium computes them, in libzmq's Z85")
        else:
            r.check(False, "libsodium and libzmq are loadable (Debian: libsodium23, libzmq5)")
        if os.access(a.worker, os.X_OK):
            # The worker's own keygen writes the same format: derive its public key both ways.
            kg = os.path.join(tmp, "kg")
            subprocess.run([a.worker, "keygen", "--out", kg], check=True, capture_output=True)
            ksec, kpub = open(kg + ".key").read().strip(), open(kg + ".pub").read().strip()
            raw = ctypes.create_string_buffer(32)
            ctypes.CDLL(zmq).zmq_z85_decode(raw, ksec.encode())
            r.check(ms.z85(ms.x25519_base(raw.raw)) == kpub, "make-secrets.py derives keygen's public key from its secret")
    r.close()


if __name__ == "__main__":
    main()
