"""SIGKILL mid-training, then the same command again: the run ends exactly where an uninterrupted one does.

The kill lands at a random step (a seeded draw of which checkpoint to wait for, plus a random delay, so it may hit
between checkpoints or during a checkpoint write). The killed process keeps no state but what is on disk, so this
checks that the checkpoint holds everything the next steps depend on: weights, Adam moments, the step, the
data-iterator position and the dropout RNG (`model.dropout` is 0.1 here).

Seed 7 is the first stage of the session's `interrupted_run` chain (conftest: SIGKILL, then SIGTERM and SIGINT on
the resumed runs, then a run to the end), which saves two training processes; seed 8 is a standalone kill and
resume, marked slow for the suite's CPU budget.
"""

from __future__ import annotations

import random
import signal

import pytest

from tests.faults.conftest import (
    MAX_STEPS,
    final_weights,
    interrupt,
    max_abs_diff,
    train,
    training_state,
)


def assert_same_as_reference(run_dir, reference_run):
    reference = reference_run.result()
    assert max_abs_diff(final_weights(run_dir), final_weights(reference)) <= 1e-6
    # Not only the weights: the Adam moments and the step of the last checkpoint agree too.
    assert max_abs_diff(training_state(run_dir), training_state(reference)) <= 1e-6


def test_sigkill_then_resume_equals_uninterrupted_run(interrupted_run, reference_run):
    run_dir, stages = interrupted_run.result()
    killed, resumed = stages["SIGKILL"], stages["SIGTERM"]  # the next process is the resumed one
    assert killed.returncode == -signal.SIGKILL
    assert 0 < killed.waited_for <= killed.step < MAX_STEPS
    assert (
        f"resuming {run_dir} from step {killed.step}" in resumed.stderr
    )  # despite the dead process' lock file
    assert stages["finish"].returncode == 0, stages["finish"].stderr[-3000:]
    assert_same_as_reference(run_dir, reference_run)


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted_run_second_seed(fault_config, reference_run, tmp_path):
    run_dir = tmp_path / "run"
    killed = interrupt(fault_config, run_dir, signal.SIGKILL, random.Random(8), tmp_path / "killed.log")
    assert killed.returncode == -signal.SIGKILL
    assert 0 < killed.step < MAX_STEPS
    done = train(fault_config, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming {run_dir} from step {killed.step}" in done.stderr
    assert f"finished at step {MAX_STEPS}" in done.stderr
    assert_same_as_reference(run_dir, reference_run)
