"""Layer normalisation over the last axis, computed in float32 (float64 for a float64 input) with a hand-written
gradient.

The math is Keras' ``LayerNormalization`` (Ba et al., 2016): ``y = (x - mean) / sqrt(var + epsilon) * gamma +
beta``, statistics over the last axis, in float32 for any narrower input; the output has the input's dtype.
What differs is the cost of training it. Keras computes ``x * inv + (beta - mean * inv)`` with ``inv = gamma /
sqrt(var + epsilon)``, and autodiff of that (through the moments, the broadcasts and their reductions) makes about
twenty passes over the ``(rows, d)`` activations per backward pass. The gradient written out,

    dx = (g - mean(g) - xhat * mean(g * xhat)) / sqrt(var + epsilon),   g = dy * gamma,
    dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy,

makes about a dozen. The casts from and to a bfloat16 / float16 input sit inside the function, so the layer
takes and returns the input's dtype (Keras would cast the input to the layer's float32 first).

Within `transformer.kernels.fused()` (the training step enters it on CPU without XLA), a layer called with
``training=True`` runs the same math as two C++ kernels instead (`fused_layer_normalization`: one pass over the rows
forward, one backward) when they are built.
"""

import keras
import tensorflow as tf

from transformer import kernels


def fused_layer_normalization(x, gamma, beta, epsilon, ops):
    """`layer_normalization` through the kernel library ``ops`` (`transformer.kernels.active(x.dtype)`): ``x`` float32,
    bfloat16 or float16."""
    x = tf.convert_to_tensor(x)

    @tf.custom_gradient
    def normalized(x, gamma, beta):
        rows = tf.reshape(x, [-1, tf.shape(x)[-1]])
        y, mean, inv_std = ops.nmt_layer_norm(rows, gamma, beta, epsilon=epsilon)

        def grad(dy):
            with tf.name_scope("layer_norm_grad"):
                dy = tf.reshape(tf.cast(dy, x.dtype), tf.shape(rows))
                dx, d_gamma, d_beta = ops.nmt_layer_norm_grad(dy, rows, mean, inv_std, gamma)
                return tf.reshape(dx, tf.shape(x)), d_gamma, d_beta

        return tf.reshape(y, tf.shape(x)), grad

    return normalized(x, tf.convert_to_tensor(gamma, tf.float32), tf.convert_to_tensor(beta, tf.float32))


def layer_normalization(x, gamma, beta, epsilon):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last axis of ``x`` (any float dtype; the math in
    float32, or float64 for a float64 ``x`` as Keras does; the result in ``x.dtype``), differentiable in ``x``,
    ``gamma`` and ``beta`` (float32, ``(d,)``)."""
    x = tf.convert_to_tensor(x)
    dtype = x.dtype
    math = tf.float64 if dtype == tf.float64 else tf.float32

    @tf.custom_gradient
    def normalized(x, gamma, beta):
        gamma, beta = tf.cast(gamma, math), tf.cast(beta, math)
        # (R, d) rows: no copy when x is in `math` already
        rows = tf.reshape(tf.cast(x, math), [-1, tf.shape(x)[-1]])
        centered = rows - tf.reduce_mean(rows, axis=-1, keepdims=True)
        # (R, 1)
        inv_std = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True) + epsilon)
        x_hat = centered * inv_std
        y = tf.reshape(tf.cast(x_hat * gamma + beta, dtype), tf.shape(x))

        def grad(dy):
            # TensorFlow builds the gradient outside the layer's name scope: name it (graphs, profiles)
            with tf.name_scope("layer_norm_grad"):
                dy = tf.reshape(tf.cast(dy, math), tf.shape(x_hat))
                g = dy * gamma
                dx = (
                    g
                    - tf.reduce_mean(g, axis=-1, keepdims=True)
                    - x_hat * tf.reduce_mean(g * x_hat, axis=-1, keepdims=True)
                ) * inv_std
                d_gamma = tf.cast(tf.reduce_sum(dy * x_hat, axis=0), tf.float32)
                d_beta = tf.cast(tf.reduce_sum(dy, axis=0), tf.float32)
                return tf.reshape(tf.cast(dx, dtype), tf.shape(x)), d_gamma, d_beta

        return y, grad

    # Variables are read here, outside the function: its gradient flows to them through the reads.
    return normalized(x, tf.convert_to_tensor(gamma, tf.float32), tf.convert_to_tensor(beta, tf.float32))


@keras.saving.register_keras_serializable(package="transformer")
class LayerNorm(keras.layers.LayerNormalization):
    """``keras.layers.LayerNormalization`` over the last axis with `layer_normalization`'s gradient: the same
    variables (``gamma``, ``beta``, float32) and config, an input of any float dtype, an output of the input's."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.axis not in (-1, [-1]) or not self.center or not self.scale or self.rms_scaling:
            raise ValueError(
                "LayerNorm normalises the last axis with both gamma and beta, without rms_scaling"
            )
        # The input keeps its dtype (Keras would cast it to float32 first): the function casts inside.
        self._convert_input_args = False

    def compute_output_spec(self, inputs):
        # the output keeps the input's dtype (Keras' layer would declare its own float32)
        return keras.KerasTensor(inputs.shape, dtype=inputs.dtype)

    def call(self, inputs, training=None):
        inputs = tf.convert_to_tensor(inputs)
        if training is True:
            ops = kernels.active(inputs.dtype)
            if ops is not None:
                return fused_layer_normalization(inputs, self.gamma, self.beta, self.epsilon, ops)
        return layer_normalization(inputs, self.gamma, self.beta, self.epsilon)
