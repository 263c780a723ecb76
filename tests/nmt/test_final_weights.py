"""Checkpoint averaging for DIR/final: the mean of the checkpoints, kept only when it does not raise the loss."""

import keras
import numpy as np
import tensorflow as tf

from nmt.final_weights import average_checkpoints, average_if_better


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


def test_average_kept_only_when_the_loss_does_not_rise(tmp_path):
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
