#!/usr/bin/env python3
"""Generates the secrets the Kubernetes base needs, into deploy/k8s/base/generated-secrets/ (kept
out of git): the tenants file with fresh API keys, the worker link's CURVE key pairs, the response
cache's MAC key and Redis's password. The overlays do not render until these files exist, so no
deployment runs on keys published with the project (the router and worker refuse those anyway).

    python3 deploy/k8s/make-secrets.py            # then: kubectl apply -k deploy/k8s/overlays/cpu
    python3 deploy/k8s/make-secrets.py --out DIR  # somewhere else (a sealed-secrets workflow, tests)

Standard library only: the CURVE keys are X25519 pairs (RFC 7748) written in Z85 (ZeroMQ's
RFC 32), as `switchyard-worker keygen` writes them. Existing files are kept unless --force. The
API keys are printed once, for you to hand out; the other secrets are never printed."""
import argparse
import json
import os
import secrets
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "base", "generated-secrets")

_P = 2**255 - 19
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def x25519_base(secret):
    """The X25519 public key of a 32-byte secret: scalar multiplication of u = 9 (RFC 7748, 5)."""
    k = bytearray(secret)
    k[0] &= 248
    k[31] &= 127
    k[31] |= 64
    scalar = int.from_bytes(k, "little")
    x1, x2, z2, x3, z3, swap = 9, 1, 0, 9, 1, 0
    for t in reversed(range(255)):
        bit = (scalar >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % _P, (x2 - z2) % _P
        aa, bb = a * a % _P, b * b % _P
        e = (aa - bb) % _P
        c, d = (x3 + z3) % _P, (x3 - z3) % _P
        da, cb = d * a % _P, c * b % _P
        x3, z3 = (da + cb) ** 2 % _P, x1 * (da - cb) ** 2 % _P
        x2, z2 = aa * bb % _P, e * (aa + 121665 * e) % _P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, _P - 2, _P) % _P).to_bytes(32, "little")


def z85(data):
    """Z85 text of `data` (a multiple of 4 bytes)."""
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        out.append("".join(_Z85[(v // 85**p) % 85] for p in (4, 3, 2, 1, 0)))
    return "".join(out)


def curve_pair():
    """(secret, public) CURVE keys as Z85 text."""
    s = secrets.token_bytes(32)
    return z85(s), z85(x25519_base(s))


def write(path, text, mode, force):
    if os.path.exists(path) and not force:
        print(f"kept {path} (exists; --force replaces it)")
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    print(f"wrote {path}")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder to write (default: deploy/k8s/base/generated-secrets)")
    ap.add_argument("--force", action="store_true", help="replace files that exist")
    args = ap.parse_args()
    out = args.out
    admin, app = "sk-" + secrets.token_hex(24), "sk-" + secrets.token_hex(24)
    tenants = {"tenants": [
        {"name": "ops", "keys": [admin], "admin": True},
        {"name": "webapp", "keys": [app], "requests_per_s": 20, "burst": 40, "tokens_per_min": 2000000,
         "max_concurrent": 64, "priority": {"default": -1, "min": -1, "max": 5}},
    ]}
    if write(os.path.join(out, "tenants.json"), json.dumps(tenants, indent=2) + "\n", 0o600, args.force):
        print(f"  API keys (shown once): ops (admin) {admin}  webapp {app}")
    worker_s, worker_p = curve_pair()
    router_s, router_p = curve_pair()
    links = os.path.join(out, "link-keys")
    if not os.path.exists(os.path.join(links, "worker.key")) or args.force:
        write(os.path.join(links, "worker.key"), worker_s + "\n", 0o600, True)
        write(os.path.join(links, "worker.pub"), worker_p + "\n", 0o644, True)
        write(os.path.join(links, "router.key"), router_s + "\n", 0o600, True)
        write(os.path.join(links, "routers.pub"), router_p + "\n", 0o644, True)
    else:
        print(f"kept {links}/ (exists; --force replaces it)")
    write(os.path.join(out, "cache-mac.key"), secrets.token_hex(32) + "\n", 0o600, args.force)
    write(os.path.join(out, "redis-password"), secrets.token_hex(24), 0o600, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
