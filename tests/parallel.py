"""`make test`'s two pytest-xdist workers (`-p tests.parallel -n 2`): how the tests are split.

Each test file runs whole on one worker, so its module- and session-scoped fixtures (in-process training runs, CLI
runs of train.py, exports) are made once, as in a single process. tests/faults/ runs whole on one worker: its
session fixture starts, at the first fault test, the background training scenarios of every selected fault test
(tests/faults/conftest.py), which must happen once. The suite also runs as one process (`python -m pytest`).

The split is a scheduler of its own (xdist's `pytest_xdist_make_scheduler` hook), not `--dist loadgroup` with
`xdist_group` marks: pytest-xdist 3.8 names a test's group by rewriting `item._nodeid`, which pytest 9 no longer
reads (a node's id is `item._id`), so under pytest 9.2 loadgroup silently spread every file over both workers and
built each file's fixtures, and the fault scenarios, once per worker.

The order: the units that take longest go first (`FIRST`, from `--durations` of make test on a 2-core Zen 3,
2026-12-06, docs/make-test-2026-12-06b-avx2/), the rest by their number of tests, as xdist orders them. xdist's
own order (by number of tests) sent the few-test end-to-end files last: the two workers ended up to a minute apart.
tests/faults/ starts first: its background training processes then overlap the other worker's files, and it trains
the shared tiny run (tests/run_fixture) while the other worker runs files that do not need it.
"""

from __future__ import annotations

from collections import Counter

import pytest

FAULTS = "tests/faults/"

FIRST = (  # the longest units first (a longest-first order for two workers), tiny-run users after the others
    FAULTS,
    "tests/nmt/test_distribute.py",
    "tests/nmt/test_budget_runs.py",
    "tests/nmt/test_train_step.py",
    "tests/nmt/test_trainer_interrupted_evaluation.py",
    "tests/benchmarks/test_bench.py",
    "tests/transformer/test_ensemble.py",
    "tests/nmt/test_xla.py",
    "tests/benchmarks/test_attention_memory.py",
    "tests/nmt/test_cluster.py",
    "tests/test_cli_translate.py",
    "tests/test_e2e.py",
    "tests/test_cli_evaluate.py",
    "tests/transformer/test_decoding_model.py",
)


def work_unit(nodeid: str) -> str:
    """The unit one worker runs whole: tests/faults/ as one, every other test file on its own."""
    return FAULTS if nodeid.startswith(FAULTS) else nodeid.split("::", 1)[0]


def run_order(nodeids: list[str]) -> list[str]:
    """The `FIRST` units, then the others by their number of tests (most first); within a unit, the given order."""
    counts = Counter(map(work_unit, nodeids))

    def rank(nodeid):
        unit = work_unit(nodeid)
        return (FIRST.index(unit), 0) if unit in FIRST else (len(FIRST), -counts[unit])

    return sorted(nodeids, key=rank)  # stable


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Every worker collects the same order (xdist checks it): `run_order`. Last, so that conftest reorderings
    inside a unit (tests/faults/conftest.py) stand."""
    position = {nodeid: i for i, nodeid in enumerate(run_order([item.nodeid for item in items]))}
    items.sort(key=lambda item: position[item.nodeid])


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # the work queue follows the collection order above

    class WholeFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WholeFileScheduling(config, log)
