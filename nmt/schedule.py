"""The learning-rate schedule of "Attention Is All You Need", parameterised by its peak."""

from __future__ import annotations

import keras
import tensorflow as tf


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
