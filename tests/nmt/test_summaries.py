"""nmt.summaries.peak_memory_mb: this process's own peak, not a parent's."""

import subprocess
import sys

import numpy as np

from nmt.summaries import peak_memory_mb

CHILD = "from nmt.summaries import peak_memory_mb; print(peak_memory_mb())"


def test_peak_grows_with_a_touched_allocation():
    before = peak_memory_mb()
    block = np.ones(256 * 2**20 // 8)  # 256 MiB, every page written
    assert peak_memory_mb() >= before + 200 or before > 256 + 200  # a peak already above it need not move
    del block


def test_a_child_reports_its_own_peak_not_its_parents():
    block = np.ones(1536 * 2**20 // 8)  # the parent's peak now exceeds 1.5 GiB
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    del block
    assert float(child.stdout.split()[-1]) < 1400  # a child importing TensorFlow stays far below 1.5 GiB
