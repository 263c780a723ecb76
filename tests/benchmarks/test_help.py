"""The benchmark modules' --help: printed before TensorFlow is imported (it was preceded by its start-up noise)."""

import subprocess
import sys

import pytest

from benchmarks.worktree import ROOT

SCRIPT = """
import sys
from benchmarks import {module}
try:
    {module}.main(["--help"])
except SystemExit as done:
    print("exit", done.code, "tensorflow" in sys.modules)
"""


@pytest.mark.parametrize("module", ["prepared_speed", "train_profile"])
def test_help_without_tensorflow(module):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(module=module)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--config" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "exit 0 False"
