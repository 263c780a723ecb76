"""The weights a finished run keeps in DIR/final: checkpoint averaging, kept only when it helps.

Which checkpoints are averaged: the last `train.average_last` training checkpoints (`checkpoint_every` apart), or,
with `train.average_fraction` and a planned number of steps (`nmt.budget`), `average_last` weight snapshots spread
evenly over the last `average_fraction` of the planned steps (`window_steps`), kept in DIR/checkpoints/average.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from nmt.checkpoints import drop_checkpoints, first_line, restore_errors, restore_model_weights
from nmt.run_dir import CANDIDATES, RunDirError, latest_checkpoint

log = logging.getLogger("nmt.train")


def window_steps(total_steps: int, fraction: float, count: int) -> tuple[int, int]:
    """(first step, spacing) of `count` snapshots over the last `fraction` of `total_steps`, the last at total_steps.

    The window (total_steps * (1 - fraction), total_steps] is cut into `count` equal parts and each part ends in a
    snapshot: spacing = round(fraction * total_steps / count), at least 1. A run that goes on past total_steps (a
    time budget that allowed more steps than planned) keeps taking snapshots `spacing` apart.
    """
    spacing = max(1, round(fraction * total_steps / count))
    return max(total_steps - (count - 1) * spacing, 1), spacing


class AveragingSnapshots:
    """Which checkpoints a run averages into its final weights (`train.average_last`, `train.average_fraction`).

    With a fraction, the model weights at the steps of the averaging window (`window_steps`), the last
    `average_last` kept in `directory`. Resuming reopens the directory: its snapshots are kept, but those of
    steps after the resumed checkpoint (`roll_back`), and those before the window of the plan in force (another
    plan's, after a re-plan or a resume with another plan) go as soon as the plan is known.
    """

    def __init__(self, model, directory, train):
        self.count, self.fraction = train.average_last, train.average_fraction
        self.enabled = self.fraction > 0 and self.count > 1
        self.checkpoint, self.directory = tf.train.Checkpoint(model=model), directory
        self.manager = self._open() if self.enabled else None
        self._planned = None  # the planned steps the snapshots are kept for (`save_if_due`)

    def _open(self) -> tf.train.CheckpointManager:
        return tf.train.CheckpointManager(self.checkpoint, str(self.directory), self.count)

    def roll_back(self, step: int) -> list[int]:
        """On resuming from `step`: removes the snapshots of later steps (lost with their process, they are
        taken again if the resumed run's window has them); returns their steps."""
        if not self.enabled:
            return []
        removed = drop_checkpoints(self.directory, lambda s: s <= step)
        if removed:
            self.manager = self._open()  # reads the directory's state again
        return removed

    def save_if_due(self, step: int, total_steps: int) -> None:
        if not (self.enabled and total_steps):
            return
        first, spacing = window_steps(total_steps, self.fraction, self.count)
        if total_steps != self._planned:  # the first call of this process, or a re-plan
            # Snapshots before this plan's window are another plan's (a re-plan, or a resume with more steps, moved
            # the window later): they are not averaged with this one's, even if the run stops before its window.
            self._planned = total_steps
            if drop_checkpoints(self.directory, lambda s: s >= first):
                self.manager = self._open()
        if step >= first and (step - first) % spacing == 0:
            self.manager.save(checkpoint_number=step)

    def final_paths(self, step: int, checkpoints: list[str]) -> list[str]:
        """The checkpoints to average at the end of a run at `step` ([] for none).

        The window's snapshots and the last weights; without a fraction, or when the run ended before the window
        (no snapshot yet), the last `average_last` of the training `checkpoints` (the last weights among them).
        """
        if self.count < 2:
            return []
        if not (self.enabled and self.manager.checkpoints):
            return list(checkpoints[-self.count :])
        if not self.manager.checkpoints[-1].endswith(f"-{step}"):
            self.manager.save(checkpoint_number=step)
        return list(self.manager.checkpoints)


def average_checkpoints(model, paths: list[str]) -> None:
    """Sets the model's weights to their mean over the checkpoints in `paths` (each holding `model`)."""
    total = None
    for path in paths:
        tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
        values = [np.asarray(w.numpy(), dtype=np.float64) for w in model.weights]
        total = values if total is None else [t + v for t, v in zip(total, values)]
    for weight, summed in zip(model.weights, total):
        weight.assign((summed / len(paths)).astype(weight.dtype))


def average_if_better(
    model, paths: list[str], loss_fn: Callable[[], float], current: str = "last weights"
) -> bool:
    """Averages `paths` into `model` if that does not raise `loss_fn()` (validation loss); else keeps the weights.

    `current` names the model's weights before (the last weights, or the EMA) in the log. Returns whether the
    average was kept.
    """
    last_weights = [w.numpy() for w in model.weights]
    last_loss = loss_fn()
    average_checkpoints(model, paths)
    average_loss = loss_fn()
    if average_loss <= last_loss:
        log.info(
            "final weights: average of %d checkpoints (%s ... %s), validation loss %.4f (%s %.4f)",
            len(paths), paths[0], paths[-1], average_loss, current, last_loss,
        )  # fmt: skip
        return True
    for weight, value in zip(model.weights, last_weights):
        weight.assign(value)
    log.info(
        "final weights: %s; the average of %d checkpoints had a higher validation loss (%.4f > %.4f)",
        current, len(paths), average_loss, last_loss,
    )  # fmt: skip
    return False


# ----------------------------------------------------------------------------------------------------------------
# The weights evaluate/translate/export load (`--weights`): a stored checkpoint, or a candidate made again


def load_run_weights(model, run_dir, which: str, train) -> str:
    """Sets the (built) `model`'s weights to `which` of `run_dir` (an `nmt.run_dir.RunDir`), returns what they are.

    final, best, latest, auto: the checkpoint `RunDir.weights_prefix` names (its prefix is returned). The two
    candidates for final/, whichever it kept, so each can be evaluated on its own:
      average: the mean of the averaging window's snapshots (DIR/checkpoints/average), or without any, of the last
        `train.average_last` training checkpoints (as `AveragingSnapshots.final_paths` takes them);
      ema: the exponential moving average of the weights (`train.ema_decay`) in the latest training checkpoint.
    Raises RunDirError naming the problem (no such candidate in this run, a missing or corrupt checkpoint).
    """
    if which not in CANDIDATES:
        prefix = run_dir.weights_prefix(which)
        restore_model_weights(model, prefix)
        return prefix
    latest = latest_checkpoint(run_dir.checkpoint_dir)
    try:
        if which == "ema":
            return _restore_ema(model, run_dir, latest, train)
        paths = _average_paths(run_dir, train)
        average_checkpoints(model, paths)
    except restore_errors() as err:
        raise RunDirError(f"{run_dir.path}: cannot make the {which} weights: {first_line(err)}") from err
    return f"average of {len(paths)} checkpoints ({paths[0]} ... {paths[-1]})"


def _average_paths(run_dir, train) -> list[str]:
    if train.average_last < 2:
        raise RunDirError(
            f"{run_dir.path}: no average: train.average_last is {train.average_last} (at least 2)"
        )
    for directory in (run_dir.checkpoint_dir / "average", run_dir.checkpoint_dir):
        state = tf.train.get_checkpoint_state(str(directory)) if directory.is_dir() else None
        if state and state.all_model_checkpoint_paths:
            return list(state.all_model_checkpoint_paths)[-train.average_last :]
    raise RunDirError(f"{run_dir.path}: no checkpoints to average in {run_dir.checkpoint_dir}")


def _restore_ema(model, run_dir, latest: str | None, train) -> str:
    from nmt.optimizer import adam

    if train.ema_decay <= 0:
        raise RunDirError(f"{run_dir.path}: no EMA: trained with train.ema_decay 0")
    if not latest:
        raise RunDirError(f"{run_dir.path}: no EMA: no training checkpoint in {run_dir.checkpoint_dir}")
    optimizer = adam(train, lambda: 0.0)  # the learning rate is not used (and its schedule not checkpointed)
    optimizer.build(model.trainable_variables)
    status = tf.train.Checkpoint(model=model, optimizer=optimizer).restore(latest)
    status.expect_partial()
    status.assert_existing_objects_matched()
    optimizer.finalize_variable_values(model.trainable_variables)  # the averages replace the weights
    return f"EMA (decay {train.ema_decay:g}) in {latest}"
