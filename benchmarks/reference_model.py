"""A reference encoder-decoder Transformer made only of stock Keras layers, to put our model's speed in context.

It has the size and shape of `transformer.model.Transformer` with ``norm="post"``: the same embeddings (scaled by
``sqrt(d_model)``, sinusoidal positions, shared between source and target when asked), Post-LN encoder and decoder
layers, and the same output projection (the transposed target embedding, or a ``Dense`` with bias). Only the
building blocks differ: ``keras.layers.MultiHeadAttention`` (masks given as Keras ``value_mask`` and
``use_causal_mask``), ``keras.layers.LayerNormalization`` and ``keras.layers.Dense``, all under the global dtype
policy, with no custom kernels.

Parameter count: equal to ours for ``norm="post"``. Keras' attention kernels are ``(d_model, heads, depth)`` instead
of ``(d_model, d_model)``, the same number of weights and biases. Differences only for settings the reference does
not model: ``norm="pre"`` (ours has two extra final LayerNorms, ``4 * d_model`` parameters) and ``share_qkv``
(ours has fewer projections). See `parameter_difference`.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from transformer.positional import positional_encoding
from transformer.vocab import PAD_ID


class _PostLNBlock(keras.layers.Layer):
    """``x = LN(x + dropout(attention(x, memory)))`` for each attention, then ``LN(x + dropout(FFN(x)))``."""

    def __init__(self, *, d_model, num_heads, d_ff, dropout, cross, **kwargs):
        super().__init__(**kwargs)
        depth = d_model // num_heads
        self.self_attention = keras.layers.MultiHeadAttention(num_heads, depth, name="self_attention")
        self.self_norm = keras.layers.LayerNormalization(epsilon=1e-6, name="self_norm")
        self.cross = cross
        if cross:
            self.cross_attention = keras.layers.MultiHeadAttention(num_heads, depth, name="cross_attention")
            self.cross_norm = keras.layers.LayerNormalization(epsilon=1e-6, name="cross_norm")
        self.hidden = keras.layers.Dense(d_ff, activation="relu", name="hidden")
        self.output_dense = keras.layers.Dense(d_model, name="output")
        self.ffn_norm = keras.layers.LayerNormalization(epsilon=1e-6, name="ffn_norm")
        self.dropout = keras.layers.Dropout(dropout)

    def call(self, x, mask, memory=None, memory_mask=None, causal=False, training=False):
        h = self.self_attention(x, x, value_mask=mask, use_causal_mask=causal, training=training)
        x = self.self_norm(x + self.dropout(h, training=training))
        if self.cross:
            h = self.cross_attention(x, memory, value_mask=memory_mask, training=training)
            x = self.cross_norm(x + self.dropout(h, training=training))
        h = self.output_dense(self.dropout(self.hidden(x), training=training))
        return self.ffn_norm(x + self.dropout(h, training=training))


class ReferenceTransformer(keras.Model):
    """Post-LN encoder-decoder from stock Keras layers; called like `Transformer`, returns float32 logits.

    Args:
        source_vocab_size, target_vocab_size, d_model, num_heads, d_ff, num_layers, dropout, share_embeddings,
        tie_output, max_length: as in `transformer.model.Transformer`.

    Call arguments:
        inputs: ``{"source": int32 (B, S), "target_in": int32 (B, T)}``; ``PAD_ID`` marks padding.

    Returns:
        logits ``(B, T, target_vocab_size)`` float32.
    """

    def __init__(
        self,
        *,
        source_vocab_size,
        target_vocab_size,
        d_model=256,
        num_heads=4,
        d_ff=1024,
        num_layers=3,
        dropout=0.1,
        share_embeddings=True,
        tie_output=True,
        max_length=512,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.tie_output = tie_output
        init = keras.initializers.RandomNormal(stddev=d_model**-0.5)
        self.source_embedding = keras.layers.Embedding(
            source_vocab_size, d_model, embeddings_initializer=init
        )
        self.target_embedding = (
            self.source_embedding
            if share_embeddings
            else keras.layers.Embedding(target_vocab_size, d_model, embeddings_initializer=init)
        )
        self.positions = tf.constant(positional_encoding(max_length, d_model))  # (max_length, d_model)
        self.embedding_dropout = keras.layers.Dropout(dropout)
        block = dict(d_model=d_model, num_heads=num_heads, d_ff=d_ff, dropout=dropout)
        self.encoder_blocks = [
            _PostLNBlock(cross=False, name=f"encoder_{i}", **block) for i in range(num_layers)
        ]
        self.decoder_blocks = [
            _PostLNBlock(cross=True, name=f"decoder_{i}", **block) for i in range(num_layers)
        ]
        if not tie_output:
            self.output_projection = keras.layers.Dense(
                target_vocab_size, dtype="float32", name="output_projection"
            )

    def _embed(self, layer, ids, training):
        x = layer(ids)  # (batch, len, d_model)
        x = x * tf.cast(math.sqrt(self.d_model), x.dtype) + tf.cast(
            self.positions[: tf.shape(ids)[1]], x.dtype
        )
        return self.embedding_dropout(x, training=training)

    def call(self, inputs, training=False):
        source, target_in = inputs["source"], inputs["target_in"]
        source_mask, target_mask = source != PAD_ID, target_in != PAD_ID  # (B, S), (B, T)
        memory = self._embed(self.source_embedding, source, training)
        for block in self.encoder_blocks:
            memory = block(memory, source_mask, training=training)
        x = self._embed(self.target_embedding, target_in, training)
        for block in self.decoder_blocks:
            x = block(x, target_mask, memory, source_mask, causal=True, training=training)
        if not self.tie_output:
            return tf.cast(self.output_projection(tf.cast(x, tf.float32)), tf.float32)
        embeddings = tf.cast(self.target_embedding.embeddings, x.dtype)  # (V, d_model)
        flat = tf.reshape(x, [-1, self.d_model])  # (batch * len, d_model)
        logits = tf.matmul(flat, embeddings, transpose_b=True)  # (batch * len, V)
        shape = tf.concat([tf.shape(x)[:-1], tf.shape(embeddings)[:1]], axis=0)
        return tf.cast(tf.reshape(logits, shape), tf.float32)


def build_reference_model(model_config, source_vocab_size, target_vocab_size) -> ReferenceTransformer:
    """The reference twin of ``build_model(model_config, ...)``, built (called once on a dummy batch)."""
    model = ReferenceTransformer(
        source_vocab_size=source_vocab_size,
        target_vocab_size=target_vocab_size,
        d_model=model_config.d_model,
        num_heads=model_config.num_heads,
        d_ff=model_config.d_ff,
        num_layers=model_config.num_layers,
        dropout=model_config.dropout,
        share_embeddings=model_config.share_embeddings,
        tie_output=model_config.tie_output,
        max_length=model_config.max_length,
    )
    dummy = tf.ones((1, 2), tf.int32)
    model({"source": dummy, "target_in": dummy}, training=False)
    return model


def parameter_difference(model_config) -> int:
    """Expected ``ours - reference`` trainable parameters (0 for the Post-LN, unshared-projection default)."""
    d, layers = model_config.d_model, model_config.num_layers
    difference = 4 * d if model_config.norm == "pre" else 0  # encoder_norm and decoder_norm: gamma and beta
    # Self-attention projections that are the `wq` layer itself (encoder and decoder self-attention).
    shared = {"none": 0, "qk": 1, "all": 2}[model_config.share_qkv]
    return difference - shared * 2 * layers * (d * d + d)


def unmodelled_settings(model_config) -> list[str]:
    """`--set` style descriptions of the settings of `model_config` that change our model's computation and that the
    reference does not have (empty: a like-for-like comparison; `norm` and `share_qkv` are modelled, up to
    `parameter_difference`). The train rows refuse them: their ratio would compare unlike models, and their FLOP
    counts (`benchmarks.flops`, `benchmarks.matmul_bound`) assume full attention."""
    c = model_config
    found = []
    if c.attention != "full":
        found.append(f"model.attention={c.attention} (the reference and the FLOP counts use full attention)")
    if c.attention_dropout > 0:
        found.append(
            f"model.attention_dropout={c.attention_dropout} (the reference has no attention dropout)"
        )
    if c.ffn_dropout is not None and c.ffn_dropout != c.dropout:
        found.append(f"model.ffn_dropout={c.ffn_dropout} (the reference's is model.dropout={c.dropout})")
    if not c.residual:
        found.append("model.residual=false (the reference has residual connections)")
    return found
