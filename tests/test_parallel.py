"""tests/parallel.py really keeps each test file, and tests/faults/ as a whole, on one xdist worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.parallel import FIRST, run_order, work_unit

ROOT = Path(__file__).resolve().parents[1]

TEST_FILE = """
import json, os
import pytest

@pytest.mark.parametrize("i", range(6))
def test_records_its_worker(i, request):
    with open(os.environ["WORKERS_LOG"], "a") as log:
        log.write(json.dumps([request.node.nodeid, os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
"""


def test_work_units():
    assert work_unit("tests/faults/test_kill_resume.py::test_x[a]") == "tests/faults/"
    assert work_unit("tests/nmt/test_distribute.py::test_y") == "tests/nmt/test_distribute.py"
    assert work_unit("tests/test_e2e.py::TestClass::test_z") == "tests/test_e2e.py"


def test_the_longest_units_go_first_then_the_others_by_their_number_of_tests():
    nodeids = [
        "tests/data/test_x.py::test_1",
        "tests/faults/test_kill_resume.py::test_k",
        "tests/nmt/test_many.py::test_1",
        "tests/nmt/test_many.py::test_2",
        "tests/nmt/test_distribute.py::test_d",
        "tests/faults/test_graceful_stop.py::test_g",
    ]
    assert FIRST[:2] == ("tests/faults/", "tests/nmt/test_distribute.py")
    assert all((ROOT / unit).exists() for unit in FIRST), [u for u in FIRST if not (ROOT / u).exists()]
    assert run_order(nodeids) == [
        "tests/faults/test_kill_resume.py::test_k",  # the order within a unit stays
        "tests/faults/test_graceful_stop.py::test_g",
        "tests/nmt/test_distribute.py::test_d",
        "tests/nmt/test_many.py::test_1",
        "tests/nmt/test_many.py::test_2",
        "tests/data/test_x.py::test_1",
    ]


def test_two_workers_run_each_file_whole_and_the_faults_folder_whole(tmp_path):
    """Regression: `--dist loadgroup` with xdist_group marks spread every file over both workers under pytest 9."""
    files = ["tests/faults/test_one.py", "tests/faults/test_two.py", "tests/test_a.py", "tests/test_b.py"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(TEST_FILE, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    log = tmp_path / "workers.jsonl"
    env = dict(os.environ, WORKERS_LOG=str(log), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.parallel", "-n", "2", "--dist", "loadfile",
         "--import-mode=importlib", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert len(ran) == 6 * len(files)
    workers_of = {}
    for nodeid, worker in ran:
        workers_of.setdefault(work_unit(nodeid), set()).add(worker)
    assert sorted(workers_of) == ["tests/faults/", "tests/test_a.py", "tests/test_b.py"]
    assert all(len(workers) == 1 for workers in workers_of.values()), workers_of
    assert set.union(*workers_of.values()) == {"gw0", "gw1"}  # and the work is shared
