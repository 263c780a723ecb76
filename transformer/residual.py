"""Residual sublayer connection with Post-LN / Pre-LN placement, shared by the encoder and decoder layers."""

import keras
import tensorflow as tf

NORMS = ("post", "pre")


def layer_norm(name):
    """LayerNormalization (epsilon 1e-6) computed in float32 whatever the global policy."""
    return keras.layers.LayerNormalization(epsilon=1e-6, dtype="float32", name=name)


def normalize(norm_layer, x):
    """Apply a float32 `layer_norm` and cast back to ``x.dtype``."""
    return tf.cast(norm_layer(x), x.dtype)


def residual_sublayer(x, sublayer, *, norm_layer, dropout_layer, norm="post", residual=True, training=False):
    """One sublayer connection.

    - ``norm="post"`` (Vaswani et al., 2017): ``LN(x + dropout(sublayer(x)))``.
    - ``norm="pre"`` (Xiong et al., 2020): ``x + dropout(sublayer(LN(x)))``.
    - ``residual=False`` (ablation) drops the ``x +`` term.

    Args:
        x: ``(B, L, d_model)``.
        sublayer: callable ``h -> (y, extra)`` with ``y`` of ``x``'s shape; ``extra`` (e.g. attention weights or
            a new cache) is passed through.
        norm_layer: a `layer_norm`.
        dropout_layer: a `transformer.dropout.Dropout`.

    Returns:
        ``(y (B, L, d_model), extra)``.
    """
    h = normalize(norm_layer, x) if norm == "pre" else x
    y, extra = sublayer(h)
    y = dropout_layer(y, training=training)
    if residual:
        y = x + tf.cast(y, x.dtype)
    if norm == "post":
        y = normalize(norm_layer, y)
    return y, extra
