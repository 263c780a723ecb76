"""`make test`'s two pytest-xdist workers (`-p tests.parallel -n 2`): how the tests are split.

Each test file runs whole on one worker, so its module- and session-scoped fixtures (in-process training runs, CLI
runs of train.py, exports) are made once, as in a single process. tests/faults/ runs whole on one worker: its
session fixture starts, at the first fault test, the background training scenarios of every selected fault test
(tests/faults/conftest.py), which must happen once. The suite also runs as one process (`python -m pytest`).

The split is a scheduler of its own (xdist's `pytest_xdist_make_scheduler` hook), not `--dist loadgroup` with
`xdist_group` marks: pytest-xdist 3.8 names a test's group by rewriting `item._nodeid`, which pytest 9 no longer
reads (a node's id is `item._id`), so under pytest 9.2 loadgroup silently spread every file over both workers and
built each file's fixtures, and the fault scenarios, once per worker.
"""

from __future__ import annotations

FAULTS = "tests/faults/"


def work_unit(nodeid: str) -> str:
    """The unit one worker runs whole: tests/faults/ as one, every other test file on its own."""
    return FAULTS if nodeid.startswith(FAULTS) else nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadFileScheduling

    class WholeFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WholeFileScheduling(config, log)
