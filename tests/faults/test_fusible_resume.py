"""`train.xla: fusible`: SIGTERM mid-training, then the same command again, ends bit-identical to an uninterrupted run.

A resumed process starts with no XLA compilations: under TensorFlow's lazy compilation its first steps would run a
cluster's unfused fallback where the uninterrupted run ran the fused kernels (other rounding), and which shapes ever
get compiled would depend on the process' history ("megamorphic" clusters). `nmt.xla` turns lazy compilation off,
so every process fuses every step the same way. This checks it across processes, which an in-process test cannot:
there the compilation cache outlives the TrainStep.
"""

from __future__ import annotations

import random
import signal

import pytest

from tests.faults.conftest import InBackground, interrupt
from tests.faults.helpers import (
    MAX_STEPS,
    assert_bit_identical,
    fault_tree,
    final_weights,
    train,
    training_state,
)
from tests.faults.helpers import write_config as write_yaml


@pytest.fixture(scope="module")
def fusible_config(corpus, tmp_path_factory):
    tree = fault_tree(corpus)
    tree["train"]["xla"] = "fusible"
    return write_yaml(tmp_path_factory.mktemp("fusible") / "fusible.yaml", tree)


@pytest.mark.slow
def test_sigterm_then_resume_under_fusible_equals_the_uninterrupted_run(fusible_config, tmp_path):
    reference = InBackground(lambda: train(fusible_config, tmp_path / "reference"))
    run_dir = tmp_path / "run"
    stopped = interrupt(fusible_config, run_dir, signal.SIGTERM, random.Random(3), tmp_path / "stopped.log")
    assert stopped.returncode == 0 and 0 < stopped.step < MAX_STEPS, stopped.stderr[-3000:]
    assert "fusible ops only" in stopped.stderr  # the setting is on
    done = train(fusible_config, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming {run_dir} from step {stopped.step}" in done.stderr
    assert reference.result().returncode == 0
    assert_bit_identical(final_weights(run_dir), final_weights(tmp_path / "reference"), "final weights")
    assert_bit_identical(training_state(run_dir), training_state(tmp_path / "reference"), "last checkpoint")
