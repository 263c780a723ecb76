"""The trainer's optimizer: Adam, each variable updated by TensorFlow's fused kernel.

Keras' `Adam.update_step` builds about ten elementwise ops per variable (two moment updates, a square root, a
division, the assignments), each one pass over memory. `FusedAdam` runs the same update as one
`ResourceApplyAdam` kernel per variable: the same formula in the same order (``m += (g - m)(1 - beta_1)``,
``v += (g^2 - v)(1 - beta_2)``, ``w -= lr sqrt(1 - beta_2^t) / (1 - beta_1^t) m / (sqrt(v) + epsilon)``), the
same slot variables (checkpoints of either load in the other). One difference: an embedding's gradient
(IndexedSlices) is summed per row before the update, where Keras' Adam squares a repeated row's pieces apart
for its second moment. Measured in a mixed_bfloat16 training step on a
2-core AMX Xeon: docs/profile-train-step-amx-2026-12-02.md.
"""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="nmt")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose per-variable update is TensorFlow's fused `ResourceApplyAdam` (TF backend).

    AMSGrad keeps Keras' update (the fused kernel has no AMSGrad). Named "adam" as Keras' Adam is, so its
    variables keep their paths.
    """

    def __init__(self, *args, name="adam", **kwargs):
        super().__init__(*args, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),  # IndexedSlices (embeddings) densified
        )


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable (inside a strategy's update: this replica's copy)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


def adam(train, learning_rate) -> keras.optimizers.Adam:
    """`FusedAdam` with the `train:` section's betas, epsilon and EMA (`train.ema_decay`), on `learning_rate`."""
    return FusedAdam(
        learning_rate=learning_rate,
        beta_1=train.beta_1,
        beta_2=train.beta_2,
        epsilon=train.epsilon,
        use_ema=train.ema_decay > 0,
        ema_momentum=train.ema_decay if train.ema_decay > 0 else 0.99,
    )
