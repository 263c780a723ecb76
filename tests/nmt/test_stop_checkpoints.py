"""A stop's checkpoint off the checkpoint_every grid (SIGTERM after step 10 of a 3-step grid) changes nothing a
finished run keeps: the last `average_last` checkpoints averaged into final/ are the uninterrupted run's (6, 9, 12),
and so are the final weights, bit for bit. Before 2026-12-07 the stop's ckpt-10 joined the kept checkpoints, pushed
ckpt-6 out of them and into nothing, and final/ averaged 9, 10 and 12 (found by a resume review). In-process runs of
a 1+1-layer d_model-16 model; the signal comes from the trainer's clock at the end of step 10 (tests/nmt/
test_budget_runs.StepClock), the trainer's own handler stops after it."""

from __future__ import annotations

import pytest
import tensorflow as tf

from nmt.config import config_from_dict
from nmt.final_weights import load_run_weights
from nmt.run_dir import RunDir
from tests.faults.helpers import assert_bit_identical, final_weights, read_checkpoint
from tests.nmt.test_budget_runs import StepClock, train_in_process
from tests.run_fixture import tiny_config_tree, write_corpus

STEPS, EVERY, STOP = 12, 3, 10


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    tree = tiny_config_tree(write_corpus(tmp_path_factory.mktemp("stop_checkpoints") / "corpus"))
    tree["data"].update(bucket_boundaries=[32], batch_tokens=256)
    tree["model"].update(d_model=16, d_ff=32, dropout=0.1)
    tree["train"] = {
        "max_steps": STEPS,
        "schedule": "linear",
        "warmup_steps": 4,
        "learning_rate": 0.01,
        "checkpoint_every": EVERY,
        "keep_checkpoints": 2,
        "average_last": 3,  # the last 3 training checkpoints (no average_fraction window)
        "eval_every": 0,
        "bleu_every": 0,
        "precision": "float32",
        "xla": False,
    }
    return config_from_dict(tree)


def averaged(run_dir) -> list[int]:
    """The steps of the checkpoints a finished run keeps, the last 3 of them averaged into final/."""
    state = tf.train.get_checkpoint_state(str(run_dir / "checkpoints"))
    return [int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths]


def test_a_stop_off_the_checkpoint_grid_leaves_the_averaged_checkpoints_and_final_weights_alone(
    config, tmp_path
):
    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    trainer, done, log = train_in_process(config, reference, StepClock())
    assert done.status == "done" and "final weights" in log
    _, stop, _ = train_in_process(config, stopped, StepClock(signal_at=STOP))
    assert (stop.status, stop.step) == ("stopped", STOP)
    assert averaged(stopped) == [3, 6, 9, STOP]  # the stop's own checkpoint beside the grid's, to resume from
    _, resumed, _ = train_in_process(config, stopped, StepClock())
    assert (resumed.status, resumed.step) == ("done", STEPS)
    assert (
        averaged(stopped) == averaged(reference) == [6, 9, 12]
    )  # keep_checkpoints 2, at least average_last 3
    assert_bit_identical(
        final_weights(stopped), final_weights(reference), "final weights after a stop at step 10"
    )
    # final/ may hold the last weights (when the average has a higher validation loss): the average itself, made
    # again from each run directory (evaluate.py --weights average), is the same too
    averages = []
    for run in (reference, stopped):
        load_run_weights(trainer.model, RunDir(run), "average", config.train)
        saved = tf.train.Checkpoint(model=trainer.model).save(str(tmp_path / f"{run.name}-average" / "ckpt"))
        averages.append(read_checkpoint(saved))
    assert_bit_identical(averages[1], averages[0], "the average of the last 3 checkpoints")
