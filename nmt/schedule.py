"""Learning-rate schedules: linear warmup, then inverse square root (Vaswani et al.) or a decay to a floor at the
run's planned last step (linear or cosine), and the rule that scales the peak with the global batch.

Every schedule is called with the optimizer's iteration count (`step - 1`: step numbers count from 1), and every
one warms up the same way, `peak * step / warmup_steps`, so the plan of a time budget (`nmt.budget`), decided
during warmup, changes nothing before it is made.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

SCHEDULES = ("inverse_sqrt", "linear", "cosine")
BATCH_SCALING = ("sqrt", "linear", "none")


@keras.saving.register_keras_serializable(package="nmt")
class WarmupInverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak` over `warmup_steps`, then `peak * sqrt(warmup_steps / step)`.

    Equal to Vaswani et al.'s `d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)` with
    `peak = (d_model * warmup_steps)^-0.5`; step counts from 1.
    """

    def __init__(self, peak: float, warmup_steps: int):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warmup = tf.cast(max(self.warmup_steps, 1), tf.float32)
        return self.peak * tf.minimum(step / warmup, tf.math.rsqrt(step / warmup))

    def get_config(self) -> dict:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps}


@keras.saving.register_keras_serializable(package="nmt")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak`, then a linear or cosine decay that reaches `floor * peak` at step `total_steps`.

    The decay runs from step `max(warmup_steps, decided_at)` to `total_steps` and stays at the floor after it.
    `total_steps` and `decided_at` may be variables (the run's plan, `nmt.budget.TrainingPlan`): while
    `total_steps` is 0 (not decided yet) the schedule is the warmup, then the peak. Starting the decay where the
    plan was made (when that is after the warmup) keeps the learning rate continuous.

    Args:
      peak: the learning rate at the end of warmup.
      warmup_steps: steps of linear warmup (0 = none).
      decay: "linear" or "cosine" (cosine: `floor + (1 - floor) * (1 + cos(pi * progress)) / 2`).
      floor: the final learning rate, as a fraction of `peak`.
      total_steps, decided_at: ints or int64 variables.
    """

    def __init__(self, peak: float, warmup_steps: int, decay: str, floor: float, total_steps, decided_at=0):
        if decay not in ("linear", "cosine"):
            raise ValueError(f"decay must be linear or cosine, got {decay!r}")
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.floor = float(floor)
        self.total_steps = total_steps
        self.decided_at = decided_at

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warmup = tf.cast(max(self.warmup_steps, 1), tf.float32)
        total = tf.cast(tf.convert_to_tensor(self.total_steps), tf.float32)
        start = tf.maximum(
            float(self.warmup_steps), tf.cast(tf.convert_to_tensor(self.decided_at), tf.float32)
        )
        progress = tf.clip_by_value((step - start) / tf.maximum(total - start, 1.0), 0.0, 1.0)
        if self.decay == "linear":
            shape = 1.0 - progress
        else:
            shape = 0.5 * (1.0 + tf.cos(math.pi * progress))
        decayed = self.peak * (self.floor + (1.0 - self.floor) * shape)
        after_warmup = tf.where(total > 0, decayed, self.peak)
        return tf.where(step < warmup, self.peak * step / warmup, after_warmup)

    def get_config(self) -> dict:
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "floor": self.floor,
            "total_steps": int(tf.convert_to_tensor(self.total_steps).numpy()),
            "decided_at": int(tf.convert_to_tensor(self.decided_at).numpy()),
        }


def make_schedule(
    kind: str, peak: float, warmup_steps: int, *, floor: float = 0.0, total_steps=0, decided_at=0
) -> keras.optimizers.schedules.LearningRateSchedule:
    """The schedule named by `train.schedule`: inverse_sqrt (no planned end), linear or cosine."""
    if kind == "inverse_sqrt":
        return WarmupInverseSqrt(peak, warmup_steps)
    return WarmupDecay(peak, warmup_steps, kind, floor, total_steps, decided_at)


def scaled_learning_rate(learning_rate: float, global_tokens: int, reference_tokens: int, rule: str) -> float:
    """The peak learning rate for a global batch of `global_tokens`, given one tuned for `reference_tokens`.

    `sqrt`: `learning_rate * sqrt(global / reference)`, the rule for Adam (Malladi et al. 2022, "On the SDEs and
    Scaling Rules for Adaptive Gradient Algorithms"); `linear`: `* global / reference` (Goyal et al. 2017, for
    SGD); `none`: unchanged.
    """
    if rule not in BATCH_SCALING:
        raise ValueError(f"batch scaling must be one of {', '.join(BATCH_SCALING)}, got {rule!r}")
    if rule == "none" or global_tokens == reference_tokens:
        return float(learning_rate)
    ratio = global_tokens / reference_tokens
    return float(learning_rate) * (math.sqrt(ratio) if rule == "sqrt" else ratio)
