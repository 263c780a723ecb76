"""A pytest plugin (`PYTHONPATH=THIS_DIR pytest -p fixwatch ...`): the time between fixture finalizations in each
teardown, into $STALL_DIR/fixwatch.log."""

import os
import time

import pytest

_LOG = open(os.path.join(os.environ.get("STALL_DIR", "."), "fixwatch.log"), "a", buffering=1)  # noqa: SIM115
_LAST = [time.time()]


def pytest_fixture_post_finalizer(fixturedef, request):
    now = time.time()
    _LOG.write(
        f"{now - _LAST[0]:7.2f}s since last event; finalized {fixturedef.argname} ({fixturedef.scope})\n"
    )
    _LAST[0] = now


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    _LAST[0] = time.time()
    _LOG.write(f"teardown start {item.name}\n")
    yield
    _LOG.write(f"teardown end {time.time() - _LAST[0]:.2f}s after last event\n")
