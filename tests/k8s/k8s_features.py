"""What the binaries under test can do, for behaviours that are landing while this suite exists.

Flags are probed in the usage text. Behaviours without a flag (NXDOMAIN retiring workers, IPv4-only
lookups, the per-model active-requests metric) are observed by the scenario itself; when the old
behaviour is seen, the scenario reports `pending(...)`: an xfail naming what it waits for, or a
failure when SY_K8S_STRICT=1 (set it once everything has landed, so that a regression fails)."""
import functools
import os
import subprocess

import pytest

STRICT = os.environ.get("SY_K8S_STRICT", "") not in ("", "0")


@functools.lru_cache(maxsize=None)
def usage(binary):
    """The binary's usage text (router: --help on stdout; worker: no command, on stderr)."""
    args = [binary, "--help"] if binary.endswith("router") else [binary]
    p = subprocess.run(args, capture_output=True, text=True, timeout=30)
    return p.stdout + p.stderr


def has_flag(binary, flag):
    return flag in usage(binary)


def pending(what):
    """The binary still shows the behaviour before `what` landed."""
    if STRICT:
        pytest.fail(f"{what} (SY_K8S_STRICT=1: every pending behaviour must have landed)")
    pytest.xfail(f"waiting for: {what}")


def require_flag(binary, flag, what):
    if not has_flag(binary, flag):
        pending(f"{what} ({os.path.basename(binary)} has no {flag} in its usage text)")
