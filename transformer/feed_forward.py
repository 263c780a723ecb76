"""Position-wise feed-forward sublayer."""

import keras
import tensorflow as tf

from transformer.attention_ops import flat_dense
from transformer.dropout import Dropout


@keras.saving.register_keras_serializable(package="transformer")
class FeedForward(keras.layers.Layer):
    """``Dense(d_model)(dropout(relu(Dense(d_ff)(x))))`` applied at every position (Vaswani et al., 2017, eq. 2).

    Args:
        d_model: int, input and output width.
        d_ff: int, hidden width.
        dropout: float, dropout on the hidden activations (training only).
        activation: str, hidden activation (default ``"relu"``).

    Call arguments:
        x: ``(B, L, d_model)``.
        training: bool.

    Returns:
        ``(B, L, d_model)``.
    """

    def __init__(self, *, d_model, d_ff, dropout=0.0, activation="relu", **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.d_ff = d_ff
        self.dropout = dropout
        self.activation = activation
        self.hidden = keras.layers.Dense(d_ff, activation=activation, name="hidden", dtype=self.dtype_policy)
        self.hidden_dropout = Dropout(dropout, dtype=self.dtype_policy)
        self.output_dense = keras.layers.Dense(d_model, name="output", dtype=self.dtype_policy)

    def build(self, x_shape):
        self.hidden.build(x_shape)
        self.output_dense.build(tuple(x_shape[:-1]) + (self.d_ff,))
        self.built = True

    def set_dropout(self, rate):
        """Changes the hidden dropout (see `Dropout.set_rate`)."""
        self.hidden_dropout.set_rate(rate)
        self.dropout = rate

    def call(self, x, training=False):
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        hidden = self.hidden_dropout(flat_dense(self.hidden, x), training=training)  # (B * L, d_ff)
        return tf.reshape(flat_dense(self.output_dense, hidden), [batch, length, self.d_model])

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, d_ff=self.d_ff, dropout=self.dropout, activation=self.activation)
        return config
