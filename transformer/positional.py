"""Sinusoidal position encoding and the token + position embedding layer."""

import math

import keras
import numpy as np
import tensorflow as tf

from transformer.dropout import Dropout


def positional_encoding(length, d_model):
    """Sinusoidal position table (Vaswani et al., 2017, section 3.5).

    ``PE[pos, 2i] = sin(pos / 10000^(2i / d_model))``, ``PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))``.

    Args:
        length: python int, number of positions.
        d_model: python int, width.

    Returns:
        float32 NumPy array ``(length, d_model)``.
    """
    positions = np.arange(length, dtype=np.float64)[:, None]  # (length, 1)
    i = np.arange(d_model)[None, :]  # (1, d_model)
    angles = positions / np.power(10000.0, (2 * (i // 2)) / d_model)  # (length, d_model)
    table = np.where(i % 2 == 0, np.sin(angles), np.cos(angles))
    return table.astype(np.float32)


@keras.saving.register_keras_serializable(package="transformer")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """``dropout(embedding(ids) * sqrt(d_model) + PE[start_index : start_index + L])``.

    The embedding matrix is initialised ``N(0, d_model^-0.5)`` so that the scaled embeddings have unit variance
    (it doubles as the output projection when tied). The position table is a constant, not a variable.

    Args:
        vocab_size: int.
        d_model: int.
        max_length: int, number of positions in the table (positions ``0 .. max_length - 1``).
        dropout: float, dropout on the sum (training only).

    Call arguments:
        ids: int ``(B, L)``.
        start_index: python int or scalar int32 tensor, position of ``ids[:, 0]`` (``index`` when decoding one token).
        training: bool.

    Returns:
        ``(B, L, d_model)`` in the compute dtype.
    """

    def __init__(self, *, vocab_size, d_model, max_length=512, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.max_length = max_length
        self.dropout = dropout
        self.token_embedding = keras.layers.Embedding(
            vocab_size,
            d_model,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=d_model**-0.5),
            name="token_embedding",
            dtype=self.dtype_policy,
        )
        self.embedding_dropout = Dropout(dropout, dtype=self.dtype_policy)
        self._table = positional_encoding(max_length, d_model)

    @property
    def embeddings(self):
        """The ``(vocab_size, d_model)`` embedding variable (float32 under mixed precision)."""
        return self.token_embedding.embeddings

    def build(self, ids_shape):
        if not self.token_embedding.built:
            self.token_embedding.build(ids_shape)
        self.built = True

    def set_dropout(self, rate):
        """Changes the embedding dropout (see `Dropout.set_rate`)."""
        self.embedding_dropout.set_rate(rate)
        self.dropout = rate

    def call(self, ids, start_index=0, training=False):
        x = self.token_embedding(ids)  # (batch, len, d_model)
        x = x * tf.cast(math.sqrt(self.d_model), x.dtype)
        if (
            ids.shape[1] is not None
            and isinstance(start_index, int)
            and start_index + ids.shape[1] > self.max_length
        ):
            raise ValueError(
                f"positions up to {start_index + ids.shape[1]} exceed max_length={self.max_length}"
            )
        length = tf.shape(ids)[1]
        if isinstance(start_index, int) and start_index == 0:
            positions = (
                self._table[: ids.shape[1]] if ids.shape[1] is not None else tf.constant(self._table)[:length]
            )
        else:
            positions = tf.slice(tf.constant(self._table), [start_index, 0], [length, self.d_model])
        x = x + tf.cast(positions, x.dtype)[None]
        return self.embedding_dropout(x, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size, d_model=self.d_model, max_length=self.max_length, dropout=self.dropout
        )
        return config
