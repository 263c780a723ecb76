"""Inverted dropout with 16-bit random draws, the model's only dropout.

Keras' dropout (`tf.nn.experimental.stateless_dropout`) draws one 32-bit Philox number per element, converts it to a
float of the input's dtype and compares it with the rate. Here one 32-bit draw decides two elements: its two 16-bit
halves are compared with ``round(rate * 65536)``, so the rate is exact to 1/65,536 (0.1 -> 0.100006) and the
mask costs half the random numbers and no float conversion. In a mixed_bfloat16 training step on a 2-core AMX
Xeon, forward and backward of one dropout ran 2.2x faster on ``(2048, 1024)`` and 1.7x on ``(2048, 256)``
(docs/profile-train-step-amx-2026-12-02.md).

The masks are a pure function of the seed: with a ``keras.random.SeedGenerator`` (a variable that checkpoints with
the model) a resumed run draws the masks an uninterrupted one would.

Inside `transformer.kernels.fused()` (the training step on CPU without XLA) the draws, the mask and the multiply
are one C++ kernel pass over the activations instead of four TensorFlow ops: the kernel runs TensorFlow's Philox
generator itself (vectorised) from the key and counter `tf.random.stateless_uniform` would use, so the draws are the
same and the result too, bit for bit (but for the sign of a NaN, which TensorFlow's own bfloat16 multiply keeps in
some positions and not in others). It keeps the mask as bits, which the backward kernel multiplies by. A residual
connection's add (`Dropout.add_to`) runs in the same pass.
"""

import keras
import numpy as np
import tensorflow as tf

from transformer import kernels

LEVELS = 1 << 16  # the resolution of the keep decision: one 16-bit half of a Philox draw per element


def drop_threshold(rate):
    """The 16-bit value under which an element is dropped: ``round(rate * 65536)``, between 1 and 65,535 for a
    rate in (0, 1) (a positive rate never becomes 0, a rate under 1 never drops everything)."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    return min(LEVELS - 1, max(1, round(rate * LEVELS))) if rate > 0.0 else 0


def keep_scale(rate):
    """The factor kept elements are multiplied by: ``1 / P(keep)`` at the quantised rate."""
    return LEVELS / (LEVELS - drop_threshold(rate))


def _seed(seed):
    """An int32 ``[2]`` seed: drawn from a ``keras.random.SeedGenerator`` (advancing it) or taken as given."""
    if isinstance(seed, keras.random.SeedGenerator):
        seed = seed.next()
    seed = tf.convert_to_tensor(seed)
    # Keras keeps the state in int64; stateless ops want int32 (folded as keras.random folds it).
    if seed.dtype != tf.int32:
        seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
    return seed


def random_halves(size, seed):
    """``size`` uint16 values: the 16-bit halves of ``ceil(size / 2)`` Philox draws (low half first)."""
    words = tf.random.stateless_uniform(
        [(size + 1) // 2], _seed(seed), minval=None, maxval=None, dtype=tf.uint32
    )
    halves = tf.reshape(tf.bitcast(words, tf.uint16), [-1])
    return halves[:size]


def dropout(x, rate, seed, residual=None):
    """Inverted dropout of ``x`` (any shape and float dtype), added to ``residual`` when given.

    Args:
        x: the activations.
        rate: float in [0, 1), the probability of dropping an element (quantised to 1/65,536).
        seed: a ``keras.random.SeedGenerator`` (advanced by one draw) or an int32 ``[2]`` seed.
        residual: optional, of ``x``'s shape: the result is ``residual + dropout(x)`` in ``residual``'s dtype (a
            residual connection; one kernel pass with the C++ kernels when the two dtypes are one).

    Returns:
        ``x`` with each element zeroed with probability ``rate`` and the rest scaled by `keep_scale` (plus
        ``residual``).
    """
    threshold = drop_threshold(rate)
    ops = kernels.active(x.dtype) if threshold else None
    if ops is not None:
        # the scale as the TensorFlow path's constant holds it: rounded once, from the double, to x's dtype
        scale = float(np.asarray(keep_scale(rate), x.dtype.as_numpy_dtype))
        # the Philox key and counter `random_halves` draws with (tf.random.stateless_uniform on CPU)
        key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=_seed(seed))
        if residual is not None and residual.dtype == x.dtype:
            return _fused_dropout_add(x, residual, key, counter, threshold, scale, ops)
        y = _fused_dropout(x, key, counter, threshold, scale, ops)
    elif threshold:
        bits = tf.reshape(random_halves(tf.size(x), seed), tf.shape(x))
        mask = tf.where(
            bits >= tf.constant(threshold, tf.uint16),
            tf.constant(keep_scale(rate), x.dtype),
            tf.constant(0.0, x.dtype),
        )
        y = x * mask  # the gradient is ``dy * mask``: the mask does not depend on x
    else:
        y = x
    return y if residual is None else residual + tf.cast(y, residual.dtype)


def _fused_dropout(x, key, counter, threshold, scale, ops):
    """`dropout` by the C++ kernel, which makes `random_halves`' draws from the Philox key and counter itself:
    ``x * (draw >= threshold ? scale : 0)`` in ``x``'s dtype, and the keep decisions as bits (1 per element); the
    gradient ``dy * (kept ? scale : 0)`` from those bits."""

    @tf.custom_gradient
    def dropped(x):
        y, mask = ops.nmt_dropout(x, key, counter, threshold=threshold, scale=scale)

        def grad(dy):
            with tf.name_scope("dropout_grad"):
                return ops.nmt_dropout_grad(tf.cast(dy, x.dtype), mask, scale=scale)

        return y, grad

    return dropped(x)


def _fused_dropout_add(x, residual, key, counter, threshold, scale, ops):
    """``residual + dropout(x)`` by one C++ kernel pass (x and residual of one dtype), the same bits as the
    TensorFlow path's multiply then add; the gradient is ``dy`` for the residual and `_fused_dropout`'s for x."""

    @tf.custom_gradient
    def added(x, residual):
        y, mask = ops.nmt_dropout_add(x, residual, key, counter, threshold=threshold, scale=scale)

        def grad(dy):
            with tf.name_scope("dropout_grad"):
                dy = tf.cast(dy, x.dtype)
                return ops.nmt_dropout_grad(dy, mask, scale=scale), dy

        return y, grad

    return added(x, residual)


@keras.saving.register_keras_serializable(package="transformer")
class Dropout(keras.layers.Dropout):
    """``keras.layers.Dropout`` drawing its masks with `dropout` (same seed generator, same checkpoint layout)."""

    def __init__(self, rate, **kwargs):
        if kwargs.get("noise_shape") is not None:
            raise ValueError("transformer.dropout.Dropout does not support noise_shape")
        drop_threshold(rate)
        super().__init__(rate, **kwargs)

    def set_rate(self, rate):
        """Changes the rate (checked as in the constructor). A compiled function that already traced this layer
        keeps the rate it traced with: trace it again. A layer built with rate 0 has no seed generator (Keras
        makes none), so it cannot be raised above 0: build it with the rate instead."""
        drop_threshold(rate)
        if rate > 0 and getattr(self, "seed_generator", None) is None:
            raise ValueError(
                f"{self.name}: built with dropout 0 (no seed generator), cannot raise it to {rate}"
            )
        self.rate = float(rate)

    def call(self, inputs, training=False):
        if training and self.rate > 0:
            return dropout(inputs, self.rate, self.seed_generator)
        return inputs

    def add_to(self, residual, inputs, training=False):
        """``residual + self(inputs, training)`` in ``residual``'s dtype: a residual connection, whose add the
        C++ kernels do in the dropout's pass. ``inputs`` are cast to the layer's compute dtype, as a call casts
        them."""
        with tf.name_scope(self.name):
            if self.autocast and inputs.dtype.is_floating:
                inputs = tf.cast(inputs, self.compute_dtype)
            if training and self.rate > 0:
                return dropout(inputs, self.rate, self.seed_generator, residual=residual)
            return residual + tf.cast(inputs, residual.dtype)
