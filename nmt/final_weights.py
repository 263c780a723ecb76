"""The weights a finished run keeps in DIR/final: checkpoint averaging, kept only when it helps."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import tensorflow as tf

log = logging.getLogger("nmt.train")


def average_checkpoints(model, paths: list[str]) -> None:
    """Sets the model's weights to their mean over the checkpoints in `paths` (each holding `model`)."""
    total = None
    for path in paths:
        tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
        values = [np.asarray(w.numpy(), dtype=np.float64) for w in model.weights]
        total = values if total is None else [t + v for t, v in zip(total, values)]
    for weight, summed in zip(model.weights, total):
        weight.assign((summed / len(paths)).astype(weight.dtype))


def average_if_better(model, paths: list[str], loss_fn: Callable[[], float]) -> bool:
    """Averages `paths` into `model` if that does not raise `loss_fn()` (validation loss); else keeps the weights.

    Returns whether the average was kept.
    """
    last_weights = [w.numpy() for w in model.weights]
    last_loss = loss_fn()
    average_checkpoints(model, paths)
    average_loss = loss_fn()
    if average_loss <= last_loss:
        log.info(
            "final weights: average of %d checkpoints (%s ... %s), validation loss %.4f (last %.4f)",
            len(paths), paths[0], paths[-1], average_loss, last_loss,
        )  # fmt: skip
        return True
    for weight, value in zip(model.weights, last_weights):
        weight.assign(value)
    log.info(
        "final weights: last weights; the average of %d checkpoints had a higher validation loss (%.4f > %.4f)",
        len(paths), average_loss, last_loss,
    )  # fmt: skip
    return False
