"""SIGKILL mid-training, then the same command again: the run ends bit-identical to an uninterrupted one.

The kill lands at a random step (a seeded draw of which checkpoint to wait for, plus a random delay, so it may hit
between checkpoints or during a checkpoint write). The killed process keeps no state but what is on disk, so this
checks that the checkpoint holds everything the next steps depend on: weights, Adam moments, the step, the loss
scale, the data-iterator position and the dropout RNG (`model.dropout` is 0.1 here).

Equality is exact (np.array_equal), not within a tolerance: both runs execute the same kernels on the same data
in the same order on one machine with the same settings, so every float is reproduced. Checked once outside the
suite (this config, and a 2-layer d_model-128 one with two batch shapes): bit-identical with TF_ENABLE_ONEDNN_OPTS
0 and 1 and with 1 and 2 intra-op threads (TF_NUM_INTRAOP_THREADS), the same setting for both runs. Not covered:
`model.attention_dropout` > 0 (0 here and in every shipped config); its masks draw from a Keras SeedGenerator
that the checkpoint's `rng_state` holds with the others (transformer.multi_head), but no test resumes one.

Seed 7 is the first stage of the session's `interrupted_run` chain (conftest: SIGKILL, then SIGTERM and SIGINT on
the resumed runs, then a run to the end), which saves two training processes; seed 8 is a standalone kill and
resume, marked slow for the suite's CPU budget.
"""

from __future__ import annotations

import random
import signal

import pytest

from tests.faults.conftest import interrupt
from tests.faults.helpers import (
    MAX_STEPS,
    assert_bit_identical,
    final_weights,
    next_batches,
    train,
    training_state,
)


def assert_same_as_reference(run_dir, reference_run):
    reference = reference_run.result()
    assert_bit_identical(final_weights(run_dir), final_weights(reference), "final weights")
    state, expected = training_state(run_dir), training_state(reference)
    assert_bit_identical(state, expected, "last training checkpoint")
    # Not vacuous: the comparison covered the Adam moments, the step, the loss scale and the dropout RNG states.
    assert int(state["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"]) == MAX_STEPS
    for part in ("optimizer/_variables/", "optimizer/_trainable_variables/", "rng_state/", "loss_scale/"):
        assert any(key.startswith(part) for key in state), part
    # The data iterator stands at the same position: a further resume would draw the same batches.
    for batch, reference_batch in zip(next_batches(run_dir), next_batches(reference), strict=True):
        assert_bit_identical(batch, reference_batch, "next training batch")


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
