"""The Python tests' one support module (docs/testing.md, "Test support"): the CI rule for a
missing prerequisite, waiting for a condition, and the model prerequisite. tests/integration,
tests/k8s and tests/bench import it (the last two put tests/integration on sys.path).

The CI rule: a missing prerequisite is a visible skip (pytest's skip; exit 77 for a script),
and a failure when CI is set, since CI promises every prerequisite."""
import os
import sys
import time

try:
    import pytest
except ImportError:  # a script run outside pytest (tests/bench) uses skip_script alone
    pytest = None

from worker_client import MODEL

SKIPPED_EXIT = 77
MODEL_MISSING = "model not downloaded (deploy/setup.sh)"


def in_ci():
    """Whether CI is set (not empty, "0" or "false")."""
    return os.environ.get("CI", "") not in ("", "0", "false")


def skip_test(reason):
    """Inside a test: skips it, or fails it under CI."""
    if in_ci():
        pytest.fail(f"prerequisite missing under CI: {reason}")
    pytest.skip(reason)


def skip_module(reason):
    """At a module's top level: skips the whole module, or fails its collection under CI."""
    if in_ci():
        raise RuntimeError(f"prerequisite missing under CI: {reason}")
    pytest.skip(reason, allow_module_level=True)


def skip_script(reason):
    """In a script run outside pytest: exits 77 (ctest's Skipped), or 1 under CI."""
    if in_ci():
        print(f"FAIL (CI is set, a skip is a failure): {reason}")
        sys.exit(1)
    print(f"SKIP: {reason}")
    sys.exit(SKIPPED_EXIT)


def model_present():
    return os.path.exists(MODEL)


def require_model():
    """At a module's top level: the model file, or skip_module."""
    if not model_present():
        skip_module(f"{MODEL_MISSING}: {MODEL}")


# A module's or a test's mark for the model prerequisite (conftest.py makes the skip a failure under CI).
needs_model = pytest.mark.skipif(not model_present(), reason=MODEL_MISSING) if pytest else None


def poll(cond, timeout=5.0, every=0.05):
    """`cond()`'s first true value within `timeout` seconds, else its value after them (no failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(every)
    return cond()


def wait_for(what, cond, timeout=30.0, every=0.1):
    """Polls `cond` until it returns something true (returned) or `timeout` passes (AssertionError
    naming `what`)."""
    v = poll(cond, timeout, every)
    if not v:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return v
