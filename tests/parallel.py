"""`make test`'s two pytest-xdist workers (`-p tests.parallel -n 2 --dist loadgroup`): how the tests are split.

Each test file runs whole on one worker, so its module- and session-scoped fixtures (in-process training runs, CLI
runs of train.py, exports) are made once, as in a single process. tests/faults/ runs whole on one worker: its
session fixture starts, at the first fault test, the background training scenarios of every selected fault test
(tests/faults/conftest.py), which must happen once. The suite also runs as one process (`python -m pytest`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FAULTS = TESTS / "faults"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(items) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve()
        group = "faults" if FAULTS in path.parents else path.relative_to(TESTS.parent).as_posix()
        item.add_marker(pytest.mark.xdist_group(group))
