"""The trainer's optimizer: Adam, each variable updated by TensorFlow's fused kernel.

Keras' `Adam.update_step` builds about ten elementwise ops per variable (two moment updates, a square root, a
division, the assignments), each one pass over memory. `FusedAdam` runs the same update as one
`ResourceApplyAdam` kernel per variable: the same formula in the same order (``m += (g - m)(1 - beta_1)``,
``v += (g^2 - v)(1 - beta_2)``, ``w -= lr sqrt(1 - beta_2^t) / (1 - beta_1^t) m / (sqrt(v) + epsilon)``), the
same slot variables (checkpoints of either load in the other). One difference: an embedding's gradient
(IndexedSlices) is summed per row before the update, where Keras' Adam squares a repeated row's pieces apart
for its second moment. Measured in a mixed_bfloat16 training step on a
2-core AMX Xeon: docs/profile-train-step-amx-2026-12-02.md.

`FusedAdam.apply_scaled` applies ``grads * factor`` (the training step's normalisation and clipping factor). Given
the C++ kernels (`nmt.kernels.ops()`, on CPU) under the default strategy it runs the multiply and the update of every
variable as one `NmtApplyAdam` op, TensorFlow's arithmetic bit for bit (nmt/kernels/adam.cc): one pass over the
memory and one op instead of ~130 Muls and ~130 `ResourceApplyAdam`s. Otherwise it multiplies and applies as Keras.
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
        self._scaling = _Scaling()

    def fuses(self, trainable_variables) -> bool:
        """Whether `apply_scaled` given the kernels updates `trainable_variables` in one `NmtApplyAdam` op (outside a
        strategy's replica context): Adam's own update (no Keras clipping or accumulation, no AMSGrad) of float32
        variables that no strategy distributes (a distributed variable's update runs per replica: Keras' path)."""
        return not (self._keras_options() or self.amsgrad) and all(
            v.dtype == "float32" and not isinstance(_value(v), tf.distribute.DistributedValues)
            for v in trainable_variables
        )

    def _keras_options(self) -> bool:
        """Whether Keras clips or accumulates the gradients it is given (then they must come scaled)."""
        return bool(
            self.clipnorm or self.clipvalue or self.global_clipnorm or self.gradient_accumulation_steps
        )

    def apply_scaled(self, grads, factor, trainable_variables, kernels=None):
        """`apply([g * factor for g in grads], trainable_variables)`, in one `NmtApplyAdam` op when `kernels` (the
        op library) is given, the optimizer `fuses` the variables and no strategy's replica context is open;
        `factor` a float32 scalar."""
        if self._keras_options():
            # Keras clips (or accumulates) the gradients it is given: give it the scaled ones
            return self.apply([g * factor for g in grads], trainable_variables)
        self._scaling.factor, self._scaling.kernels = factor, kernels
        try:
            return self.apply(grads, trainable_variables)
        finally:
            self._scaling.factor = self._scaling.kernels = None

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        factor, library = self._scaling.factor, self._scaling.kernels
        if factor is None:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        if library is None or tf.distribute.has_strategy() or not self.fuses(trainable_variables):
            grads = [g * factor for g in grads]
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        indices = [self._get_variable_index(v) for v in trainable_variables]
        beta_1, beta_2, step = self._betas_and_step(tf.float32)
        library.nmt_apply_adam(
            var=[_handle(v) for v in trainable_variables],
            m=[_handle(self._momentums[i]) for i in indices],
            v=[_handle(self._velocities[i]) for i in indices],
            grad=[tf.cast(tf.convert_to_tensor(g), tf.float32) for g in grads],
            factor=tf.cast(factor, tf.float32),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, tf.float32),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, tf.float32),
        )

    def _betas_and_step(self, dtype):
        return tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype), tf.cast(self.iterations + 1, dtype)

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        beta_1, beta_2, step = self._betas_and_step(dtype)
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


class _Scaling:
    """`apply_scaled`'s factor and kernels while its `apply` runs (a plain object: no checkpoint dependency)."""

    factor = None
    kernels = None


def _value(variable):
    """The TensorFlow variable of a Keras or TensorFlow variable."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable (inside a strategy's update: this replica's copy)."""
    return _value(variable).handle


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
