"""Integration modules cannot pass by not running (docs/testing.md, "A test cannot pass by not
running"). A module whose every test skipped (the model not downloaded, redis-server not installed,
a module-level skip) ran nothing: the run then exits 77, which ctest shows as Skipped
(SKIP_RETURN_CODE 77, tests/CMakeLists.txt), instead of 0; with CI set it fails, since CI promises
every prerequisite. ctest runs pytest with -rs, so the reasons are printed.

A single test that skips among others that ran is held to the same rule: with CI set its skip is a
failure, naming the reason, unless the test is marked `may_skip` — a limit of the machine that no
setup script can lift (a descriptor ceiling), said in the marker's reason.

A test that hangs says where: one still running after SY_TEST_HANG_S seconds (default 150) prints,
to the stderr pytest started with (ctest keeps it when its timeout kills the run, unlike pytest's
own buffered output), every Python thread's stack and, for each process the tests started, the
state and kernel wait channel of each of its threads; again every SY_TEST_HANG_S seconds."""
import collections
import faulthandler
import os
import threading
import time

import pytest

from support import SKIPPED_EXIT, in_ci
from worker_client import alive_spawned, describe_process, end_spawned

_outcomes = collections.defaultdict(collections.Counter)  # module -> {"passed"/"failed"/"skipped": n}
_stderr = None  # a copy of the stderr pytest started with, taken before any test's capture
HANG_S = float(os.environ.get("SY_TEST_HANG_S", "150"))


def pytest_configure(config):
    global _stderr
    config.addinivalue_line("markers", "may_skip(reason): the test may skip under CI too, for this machine limit")
    _stderr = os.dup(2)


def _report_hang(nodeid, t0, done):
    while not done.wait(HANG_S):
        os.write(_stderr, f"\n=== {nodeid} still running after {time.time() - t0:.0f} s; Python threads:\n".encode())
        faulthandler.dump_traceback(file=_stderr, all_threads=True)
        for pid, cmd in alive_spawned():
            os.write(_stderr, f"--- process {pid}: {cmd}\n{describe_process(pid)}\n".encode())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    done = threading.Event()
    watch = threading.Thread(target=_report_hang, args=(item.nodeid, time.time(), done), daemon=True)
    watch.start()
    try:
        yield
    finally:
        done.set()
        watch.join()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and not hasattr(rep, "wasxfail") and in_ci() and item.get_closest_marker("may_skip") is None:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped under CI, which promises every prerequisite: {reason}"


def _module(nodeid):
    return nodeid.split("::")[0]


def pytest_collectreport(report):
    if report.skipped:  # a module-level pytest.skip()
        _outcomes[_module(report.nodeid)]["skipped"] += 1
    elif report.failed:
        _outcomes[_module(report.nodeid)]["failed"] += 1


def pytest_runtest_logreport(report):
    counts = _outcomes[_module(report.nodeid)]
    if report.skipped:
        counts["skipped"] += 1
    elif report.failed:
        counts["failed"] += 1
    elif report.when == "call":
        counts["passed"] += 1


def pytest_sessionfinish(session, exitstatus):
    # Processes the tests started (worker_client.spawn) end with the session, whatever its outcome:
    # a fixture skipped by a failure must not leave servers behind for whatever runs next.
    left = end_spawned()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if left and reporter:
        reporter.write_line(f"ended {len(left)} process(es) the tests left running: " + "; ".join(left), yellow=True)
    skipped_all = sorted(m for m, c in _outcomes.items() if c["skipped"] and not c["passed"] and not c["failed"])
    if not skipped_all or exitstatus not in (0, 5):
        return
    ci = in_ci()
    for m in skipped_all:
        line = f"{m}: every test skipped" + (" under CI: a prerequisite is missing" if ci else "")
        if reporter:
            reporter.write_line(line, red=ci, yellow=not ci)
    if ci:
        session.exitstatus = 1
    elif all(not c["passed"] and not c["failed"] for c in _outcomes.values()):
        session.exitstatus = SKIPPED_EXIT  # nothing ran at all
