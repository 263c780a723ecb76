"""The run directory deleted under a running training: it stops with a message that says so, exit code 3.

TensorFlow would recreate checkpoints/ and train on into the void: the trainer checks config.yaml before each
checkpoint. Whatever the deletion breaks first (the next checkpoint, a metrics line of the evaluation every 3 steps),
train.py names the cause, without a traceback.
"""

from __future__ import annotations

import shutil

import pytest

from tests.faults.helpers import start_train, wait_for_checkpoint


def remove(path) -> None:
    """Deletes `path`, again if the running training wrote into it meanwhile."""
    while path.exists():
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow  # make test keeps the other fault tests; make test-all runs this one
def test_removed_run_directory_stops_training_with_exit_code_3(fault_config, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_train(
        fault_config, run_dir, "train.max_steps=100000", "train.eval_every=3", log_path=tmp_path / "train.log"
    )
    wait_for_checkpoint(run_dir, 5, proc)
    remove(run_dir)
    code = proc.wait(waiting_for="to notice its run directory was removed")
    log = proc.stderr()
    assert code == 3, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith(f"train.py: {run_dir} was removed while training (config.yaml is gone): "), last
