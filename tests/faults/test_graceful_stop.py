"""SIGTERM / SIGINT mid-training: finish the step, save a checkpoint, exit 0; the same command resumes there.

Uses the session's `interrupted_run` chain (conftest): after a SIGKILL, the resumed process is stopped by SIGTERM,
the next resumed one by SIGINT (each signal on its own process, at a random step), and a last run finishes. The
final weights must still be bit-identical to those of the uninterrupted reference run: a stop checkpoint, taken
between the periodic ones, is as complete as they are (test_kill_resume.py compares the whole training state).

"Finishes the current step" is checked in steps, not seconds: the "received SIGx during step N" line names the step
the signal interrupted, and the run must stop after it (or after the next one: a signal that arrives between the
loop's stop check and the next step's start is named with the step before).
"""

from __future__ import annotations

import re

import pytest

from tests.faults.helpers import MAX_STEPS, assert_bit_identical, final_weights, latest_step

NEXT = {"SIGTERM": "SIGINT", "SIGINT": "finish"}


def interrupted_step(stderr: str, name: str) -> int:
    """The step train.py's "received SIGx during step N" log line names."""
    match = re.search(rf"WARNING nmt\.train: received {name} during step (\d+): finishing it", stderr)
    assert match, f"no 'received {name} during step N' log line:\n{stderr[-2000:]}"
    return int(match.group(1))


def logged_steps(run_dir, pid: int) -> dict[int, float]:
    """{step: wall time} of the train/loss TensorBoard events written by process `pid`."""
    import tensorflow as tf

    steps = {}
    for path in (run_dir / "tensorboard" / "train").glob(f"events.out.tfevents.*.{pid}.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            if any(value.tag == "loss" for value in event.summary.value):
                steps[event.step] = event.wall_time
    return steps


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_with_a_checkpoint_and_the_next_run_resumes(name, interrupted_run):
    run_dir, stages = interrupted_run.result()
    stage = stages[name]
    assert stage.returncode == 0, stage.stderr[-3000:]
    assert f"received {name} during step " in stage.stderr
    assert f"saved checkpoint {run_dir / 'checkpoints' / f'ckpt-{stage.step}'}" in stage.stderr
    last = stage.stderr.strip().splitlines()[-1]
    assert last == (
        f"train.py: stopped by {name} at step {stage.step}; checkpoint saved, rerun the same command to resume"
    )
    assert "Traceback" not in stage.stderr
    assert stage.waited_for <= stage.step < MAX_STEPS
    assert f"resuming {run_dir} from step {stage.step}" in stages[NEXT[name]].stderr

    # It stopped at the step the signal interrupted, not later.
    steps = logged_steps(run_dir, stage.pid)
    assert steps and max(steps) == stage.step, (sorted(steps)[-5:], stage.step)  # the stop step is logged too
    interrupted = interrupted_step(stage.stderr, name)
    assert stage.waited_for <= interrupted and 0 <= stage.step - interrupted <= 1, (interrupted, stage.step)


def test_run_resumed_after_stops_finishes_like_an_uninterrupted_one(interrupted_run, reference_run):
    run_dir, stages = interrupted_run.result()
    finish = stages["finish"]
    assert finish.returncode == 0, finish.stderr[-3000:]
    *_, finished, outputs, next_command = finish.stderr.strip().splitlines()
    assert finished.startswith(f"train.py: finished at step {MAX_STEPS}: ")
    assert outputs.startswith(f"train.py: final weights {run_dir / 'final'}; ") and "metrics " in outputs
    assert next_command.startswith(f"train.py: next: python evaluate.py --model-dir {run_dir} --split test")
    assert latest_step(run_dir) == MAX_STEPS
    assert_bit_identical(final_weights(run_dir), final_weights(reference_run.result()), "final weights")
