"""pytest -p stallgdb: on a teardown longer than 6 s, gdb native stacks of every thread (every 10 s) into
$STALL_DIR/gdb-<worker>-<n>.log, and call/teardown times into stall-<worker>.log."""

import os
import subprocess
import threading
import time

import pytest

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_DIR = os.environ.get("STALL_DIR", ".")
_LOG = open(os.path.join(_DIR, f"stall-{_WORKER}.log"), "a", buffering=1)  # noqa: SIM115
_N = [0]


def _dumper(stop: threading.Event):
    if stop.wait(6):
        return
    while not stop.is_set():
        _N[0] += 1
        path = os.path.join(_DIR, f"gdb-{_WORKER}-{_N[0]}.log")
        with open(path, "w") as out:
            subprocess.Popen(
                ["gdb", "-p", str(os.getpid()), "-batch", "-ex", "thread apply all bt 40"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        _LOG.write(f"{time.strftime('%H:%M:%S')} gdb dump {path}\n")
        if stop.wait(10):
            return


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    start = time.time()
    stop = threading.Event()
    threading.Thread(target=_dumper, args=(stop,), daemon=True).start()
    yield
    stop.set()
    after = nextitem.nodeid if nextitem else None
    _LOG.write(
        f"{time.strftime('%H:%M:%S')} {_WORKER} teardown {time.time() - start:.1f}s {item.nodeid} next={after}\n"
    )


def pytest_runtest_logreport(report):
    if report.when == "call":
        _LOG.write(f"{time.strftime('%H:%M:%S')} {_WORKER} call {report.duration:.1f}s {report.nodeid}\n")
