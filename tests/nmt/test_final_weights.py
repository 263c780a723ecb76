"""Checkpoint averaging for DIR/final: the mean of the checkpoints, kept only when it does not raise the loss."""

import logging
import types

import keras
import numpy as np
import tensorflow as tf

from nmt.final_weights import AveragingSnapshots, average_checkpoints, average_if_better, window_steps


def _model_and_checkpoints(tmp_path, values):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    paths = []
    for i, value in enumerate(values):
        for weight in model.weights:
            weight.assign(np.full(weight.shape, value, np.float32))
        paths.append(
            tf.train.Checkpoint(model=model).save(str(tmp_path / f"ckpt{i}"))
        )  # as CheckpointManager
    return model, paths


def test_average_is_the_mean_of_the_checkpoints(tmp_path):
    model, paths = _model_and_checkpoints(tmp_path, [1.0, 2.0, 6.0])
    average_checkpoints(model, paths)
    for weight in model.weights:
        np.testing.assert_array_equal(weight.numpy(), np.full(weight.shape, 3.0, np.float32))


def test_average_kept_only_when_the_loss_does_not_rise(tmp_path, caplog):
    model, paths = _model_and_checkpoints(tmp_path, [1.0, 2.0, 6.0])  # the model holds 6.0 (the last)

    def distance_to(target):
        return lambda: float(np.mean([np.abs(w.numpy() - target).mean() for w in model.weights]))

    assert average_if_better(model, paths, distance_to(3.0))  # the mean (3.0) is better: kept
    np.testing.assert_array_equal(model.weights[0].numpy(), np.full(model.weights[0].shape, 3.0))

    for weight in model.weights:
        weight.assign(np.full(weight.shape, 6.0, np.float32))
    assert not average_if_better(model, paths, distance_to(6.0))  # worse: the last weights come back exactly
    for weight in model.weights:
        np.testing.assert_array_equal(weight.numpy(), np.full(weight.shape, 6.0, np.float32))
    with caplog.at_level(logging.INFO, logger="nmt.train"):
        caplog.clear()
        assert not average_if_better(model, paths, distance_to(6.0), current="EMA")  # named in the log
    assert (
        caplog.records[-1]
        .getMessage()
        .startswith("final weights: EMA; the average of 3 checkpoints had a higher validation loss")
    )


# ----------------------------------------------------------------------------------------------------------------
# The averaging window: train.average_last snapshots over the last train.average_fraction of the planned steps


def test_window_steps_spread_over_the_last_fraction():
    # The fast machine: 8,806 steps, the last 15%, 4 checkpoints: 330 steps apart, the last at the end.
    assert window_steps(8806, 0.15, 4) == (7816, 330)
    first, spacing = window_steps(2368, 0.15, 4)  # the slow machine
    assert (first, spacing) == (2368 - 3 * 89, 89)
    assert window_steps(10, 0.1, 4) == (7, 1)  # never closer than one step


def window_config(count: int, fraction: float):
    return types.SimpleNamespace(average_last=count, average_fraction=fraction)


def snapshot_steps(snapshots) -> list[int]:
    return [int(path.rsplit("-", 1)[1]) for path in snapshots.manager.checkpoints]


def test_snapshots_at_the_window_steps_and_the_last_weights_averaged(tmp_path):
    model, _ = _model_and_checkpoints(tmp_path, [0.0])
    snapshots = AveragingSnapshots(model, tmp_path / "average", window_config(4, 0.3))
    total = 40  # window_steps(40, 0.3, 4) == (31, 3)
    for step in range(1, total + 6):  # the run goes 5 steps past its plan (a time budget allowed more)
        for weight in model.weights:
            weight.assign(np.full(weight.shape, step, np.float32))  # the weights tell the step
        snapshots.save_if_due(step, total)
        if step == total:
            assert snapshot_steps(snapshots) == [31, 34, 37, 40]
    assert snapshot_steps(snapshots) == [34, 37, 40, 43]  # the last 4 kept, still 3 apart past the plan
    # The run ends at step 45, between two snapshots: its last weights join the average, the oldest one leaves.
    paths = snapshots.final_paths(45, checkpoints=["ckpt-45"])
    assert paths == snapshots.manager.checkpoints and snapshot_steps(snapshots) == [37, 40, 43, 45]
    average_checkpoints(model, paths)
    for weight in model.weights:
        np.testing.assert_array_equal(
            weight.numpy(), np.full(weight.shape, (37 + 40 + 43 + 45) / 4, np.float32)
        )
    # Ending on a snapshot step saves nothing more.
    assert snapshot_steps(snapshots) == [37, 40, 43, 45]
    snapshots.final_paths(45, checkpoints=[])
    assert snapshot_steps(snapshots) == [37, 40, 43, 45]


def test_without_a_window_the_last_training_checkpoints(tmp_path):
    model, _ = _model_and_checkpoints(tmp_path, [0.0])
    checkpoints = [f"ckpt-{step}" for step in (10, 20, 30, 40)]
    legacy = AveragingSnapshots(model, tmp_path / "legacy", window_config(3, 0.0))  # average_fraction off
    assert legacy.final_paths(40, checkpoints) == checkpoints[-3:]
    early = AveragingSnapshots(model, tmp_path / "early", window_config(3, 0.2))
    for step in range(1, 31):
        early.save_if_due(step, 100)  # the window starts at step 87: the run ended before it
    assert early.final_paths(30, checkpoints) == checkpoints[-3:]
    assert (
        AveragingSnapshots(model, tmp_path / "off", window_config(1, 0.2)).final_paths(40, checkpoints) == []
    )


def test_a_resume_drops_the_snapshots_of_lost_steps_and_the_window_goes_on(tmp_path):
    """Killed at step 39 after its last checkpoint at 35: the snapshots of 37 were written by lost training."""
    model, _ = _model_and_checkpoints(tmp_path, [0.0])
    snapshots = AveragingSnapshots(model, tmp_path / "average", window_config(4, 0.3))
    for step in range(28, 39):
        snapshots.save_if_due(step, 40)
    assert snapshot_steps(snapshots) == [31, 34, 37]
    # The resumed process: a new AveragingSnapshots on the directory; this run's plan is 46 steps, (37, 3).
    resumed = AveragingSnapshots(model, tmp_path / "average", window_config(4, 0.3))
    assert resumed.roll_back(35) == [37]
    assert snapshot_steps(resumed) == [31, 34]
    assert not list((tmp_path / "average").glob("ckpt-37.*"))  # its files went too
    for step in range(36, 47):
        for weight in model.weights:
            weight.assign(np.full(weight.shape, step, np.float32))
        resumed.save_if_due(step, 46)
    # The manager reopened after the drop still deletes the oldest (the timestamps were kept): the last 4.
    assert snapshot_steps(resumed) == [37, 40, 43, 46]
    assert sorted(int(p.name[5:-6]) for p in (tmp_path / "average").glob("ckpt-*.index")) == [37, 40, 43, 46]
    assert resumed.roll_back(46) == []


def test_snapshots_of_an_earlier_window_are_not_averaged_after_a_re_plan(tmp_path):
    """A plan of 100 steps (window (86, 7)) re-planned to 200 (window (174, 13)) after two snapshots: the old
    window's are dropped at once; a stop at 180 averages the new window's snapshot and the last weights only."""
    model, _ = _model_and_checkpoints(tmp_path, [0.0])
    snapshots = AveragingSnapshots(model, tmp_path / "average", window_config(3, 0.2))
    for step in range(80, 95):
        snapshots.save_if_due(step, 100)
    assert snapshot_steps(snapshots) == [86, 93]
    for step in range(95, 151):
        snapshots.save_if_due(step, 200)
    assert snapshot_steps(snapshots) == [] and not list((tmp_path / "average").glob("ckpt-*.index"))
    # stopped at 150 (early stopping, a time budget spent), before the new window: the training checkpoints
    assert snapshots.final_paths(150, checkpoints=["ckpt-140", "ckpt-150"]) == ["ckpt-140", "ckpt-150"]
    for step in range(151, 181):
        snapshots.save_if_due(step, 200)
    assert snapshot_steps(snapshots) == [174]
    assert [int(p.name[5:-6]) for p in (tmp_path / "average").glob("ckpt-*.index")] == [174]
    assert [p.rsplit("-", 1)[1] for p in snapshots.final_paths(180, checkpoints=[])] == ["174", "180"]
