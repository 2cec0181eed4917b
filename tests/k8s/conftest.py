"""Session set-up for the multi-host suite: environment checks (exit 77 where network namespaces
cannot be made, a failure instead when CI is set), a time budget per test, clean-up on SIGTERM,
and the `k8s` fixture that builds one test's cluster and tears it down whatever happens."""
import os
import re
import shutil
import signal
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "deploy"))

from k8s_net import netns_available, sweep_stale  # noqa: E402
from support import SKIPPED_EXIT as SKIP, in_ci  # noqa: E402


def _environment_problem():
    """(exit code, reason) when the suite cannot run here, else None."""
    ok, why = netns_available()
    if not ok:
        if in_ci():
            return 1, f"CI is set and the multi-host suite cannot run: {why}"
        return SKIP, f"skipped: {why}"
    from cluster import ROUTER
    from worker_client import MODEL, WORKER
    missing = [p for p in (ROUTER, WORKER, MODEL) if not os.path.exists(p)]
    if missing:
        return 1, f"missing {', '.join(missing)} (build the project; deploy/setup.sh fetches the model)"
    if shutil.which("dnsmasq") is None:
        return 1, "no dnsmasq on PATH: install the Debian package dnsmasq-base (deploy/setup.sh)"
    return None


def pytest_sessionstart(session):
    if session.config.option.collectonly:
        return
    problem = _environment_problem()
    if problem:
        code, reason = problem
        sys.stderr.write(f"tests/k8s: {reason}\n")
        pytest.exit(reason, returncode=code)
    _drop_old_logs()
    swept = sweep_stale()
    if swept:
        sys.stderr.write(f"tests/k8s: removed what killed earlier runs left: {', '.join(swept)}\n")
    # ctest's timeout (or anyone) sending SIGTERM: unwind through the fixtures' clean-up.
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def pytest_configure(config):
    config.addinivalue_line("markers", "budget(seconds): the test's own time limit (setup and call)")


class BudgetExceeded(AssertionError):
    pass


def _on_alarm(signum, frame):
    raise BudgetExceeded("the test ran past its time budget")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    m = item.get_closest_marker("budget")
    seconds = m.args[0] if m else 120
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    signal.setitimer(signal.ITIMER_REAL, 0)  # clean-up is never interrupted (its waits are bounded)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def _logs_root():
    """<build>/k8s-logs/run-<pid>/: this run's logs (runs of the suite may overlap; each keeps its own)."""
    from worker_client import BUILD
    return os.path.join(BUILD, "k8s-logs", f"run-{os.getpid()}")


def _drop_old_logs():
    """Removes the logs of earlier runs whose process has ended (a live run's are left alone)."""
    parent = os.path.dirname(_logs_root())
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        try:
            pid = int(name.removeprefix("run-"))
            os.kill(pid, 0)
            continue  # still running
        except ValueError:
            pass
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


@pytest.fixture
def k8s(request):
    """k8s(**options) -> Cluster (one per test), closed at the end of the test. Its logs (each pod's
    output, dnsmasq's queries) stay in <build>/k8s-logs/run-<pid>/<test>/ until a later run."""
    from k8s_cluster import Cluster
    made = []
    logdir = os.path.join(_logs_root(), re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name))
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)

    def make(**kw):
        c = Cluster(logdir, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        failed = any(getattr(request.node, "rep_" + w, None) is not None and getattr(request.node, "rep_" + w).failed
                     for w in ("setup", "call"))
        if failed:
            print(c.report())
            print(f"logs: {logdir}")
        c.close()
