"""A pytest plugin (`PYTHONPATH=THIS_DIR pytest -p stallwatch ...`): each test's call time and teardown time, and a
faulthandler stack dump every 8 s of a teardown, into $STALL_DIR/stall-<worker>.log."""

import faulthandler
import os
import time

import pytest

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_LOG = open(os.path.join(os.environ.get("STALL_DIR", "."), f"stall-{_WORKER}.log"), "a", buffering=1)  # noqa: SIM115


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    start = time.time()
    faulthandler.dump_traceback_later(8, repeat=True, file=_LOG)
    yield
    faulthandler.cancel_dump_traceback_later()
    after = nextitem.nodeid if nextitem else None
    _LOG.write(
        f"{time.strftime('%H:%M:%S')} {_WORKER} teardown {time.time() - start:.1f}s {item.nodeid} next={after}\n"
    )


def pytest_runtest_logreport(report):
    if report.when == "call":
        _LOG.write(f"{time.strftime('%H:%M:%S')} {_WORKER} call {report.duration:.1f}s {report.nodeid}\n")
