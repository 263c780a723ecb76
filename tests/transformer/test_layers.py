"""Positional encoding, feed-forward, encoder and decoder layers."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from transformer.attention import causal_mask, padding_mask
from transformer.decoder_layer import DecoderLayer
from transformer.encoder_layer import EncoderLayer
from transformer.feed_forward import FeedForward
from transformer.positional import TokenAndPositionEmbedding, positional_encoding
from transformer.residual import normalize

D_MODEL, HEADS, D_FF = 16, 2, 32


def test_positional_encoding_values():
    table = positional_encoding(6, 8)
    assert table.shape == (6, 8) and table.dtype == np.float32
    np.testing.assert_allclose(table[0], [0, 1] * 4, atol=1e-7)
    pos, i = 5, 1  # dims 2i and 2i + 1
    angle = pos / 10000 ** (2 * i / 8)
    np.testing.assert_allclose(table[pos, 2 * i : 2 * i + 2], [math.sin(angle), math.cos(angle)], atol=1e-6)


def test_token_and_position_embedding_with_offset():
    layer = TokenAndPositionEmbedding(vocab_size=20, d_model=D_MODEL, max_length=10)
    ids = tf.constant([[4, 5, 6, 7], [8, 9, 0, 0]])
    x = layer(ids)
    expected = (
        layer.embeddings.numpy()[ids.numpy()] * math.sqrt(D_MODEL) + positional_encoding(10, D_MODEL)[:4]
    )
    np.testing.assert_allclose(x.numpy(), expected, atol=1e-5)
    step = layer(ids[:, 2:3], start_index=tf.constant(2))
    np.testing.assert_allclose(step.numpy(), x.numpy()[:, 2:3], atol=1e-6)
    with pytest.raises(ValueError):
        layer(tf.zeros((1, 11), tf.int32))


def test_feed_forward_matches_numpy():
    layer = FeedForward(d_model=D_MODEL, d_ff=D_FF)
    x = np.random.default_rng(0).normal(size=(2, 3, D_MODEL)).astype(np.float32)
    y = layer(x)
    w1, b1 = layer.hidden.kernel.numpy(), layer.hidden.bias.numpy()
    w2, b2 = layer.output_dense.kernel.numpy(), layer.output_dense.bias.numpy()
    np.testing.assert_allclose(y.numpy(), np.maximum(x @ w1 + b1, 0) @ w2 + b2, atol=1e-5)


def sublayers_reference(x, sublayers, norm, residual):
    """``[(fn, norm_layer), ...]`` composed by hand for the given norm placement and residual flag (the test's
    parameters: never read from the layer under test, which would hide a layer that drops them)."""
    for fn, norm_layer in sublayers:
        if norm == "pre":
            y = fn(normalize(norm_layer, x))
            x = x + y if residual else y
        else:
            y = fn(x)
            x = normalize(norm_layer, x + y if residual else y)
    return x


NORM_RESIDUAL = [("post", True), ("pre", True), ("post", False), ("pre", False)]


@pytest.mark.parametrize("norm, residual", NORM_RESIDUAL)
def test_encoder_layer_norm_placement(norm, residual):
    layer = EncoderLayer(
        d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, dropout=0.0, norm=norm, residual=residual
    )
    assert (layer.norm, layer.residual) == (norm, residual)
    x = tf.random.normal((2, 5, D_MODEL))
    mask = padding_mask(tf.constant([[4, 4, 4, 0, 0], [4, 4, 4, 4, 4]]))
    y = layer(x, mask=mask)
    sublayers = [
        (lambda h: layer.self_attention(h, h, h, mask=mask)[0], layer.self_attention_norm),
        (layer.feed_forward, layer.feed_forward_norm),
    ]
    expected = sublayers_reference(x, sublayers, norm, residual)
    np.testing.assert_allclose(y.numpy(), expected.numpy(), atol=1e-5)
    # LayerNorm output: zero mean per position
    if norm == "post":
        np.testing.assert_allclose(y.numpy().mean(-1), 0.0, atol=1e-5)
    assert layer.self_attention_norm.epsilon == 1e-6


@pytest.mark.parametrize("norm, residual", NORM_RESIDUAL)
def test_decoder_layer_norm_placement(norm, residual):
    layer = DecoderLayer(
        d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, dropout=0.0, norm=norm, residual=residual
    )
    assert (layer.norm, layer.residual) == (norm, residual)
    x = tf.random.normal((2, 5, D_MODEL))
    memory = tf.random.normal((2, 4, D_MODEL))
    self_mask = causal_mask(5)
    memory_mask = padding_mask(tf.constant([[4, 4, 0, 0], [4, 4, 4, 4]]))
    y, _ = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask)
    sublayers = [
        (lambda h: layer.self_attention(h, h, h, mask=self_mask)[0], layer.self_attention_norm),
        (lambda h: layer.cross_attention(h, memory, memory, mask=memory_mask)[0], layer.cross_attention_norm),
        (layer.feed_forward, layer.feed_forward_norm),
    ]
    expected = sublayers_reference(x, sublayers, norm, residual)
    np.testing.assert_allclose(y.numpy(), expected.numpy(), atol=1e-5)


def test_encoder_layer_dropout_only_in_training():
    layer = EncoderLayer(d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, dropout=0.5)
    x = tf.random.normal((2, 5, D_MODEL))
    np.testing.assert_array_equal(layer(x).numpy(), layer(x, training=False).numpy())
    assert not np.allclose(layer(x, training=True).numpy(), layer(x).numpy())


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_layer_incremental_equals_full(norm):
    layer = DecoderLayer(d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, dropout=0.0, norm=norm)
    x = tf.random.normal((2, 6, D_MODEL))
    memory = tf.random.normal((2, 4, D_MODEL))
    memory_mask = padding_mask(tf.constant([[4, 4, 0, 0], [4, 4, 4, 4]]))
    expected, cross_weights = layer(x, memory, self_mask=causal_mask(6), memory_mask=memory_mask)
    assert cross_weights.shape == (2, HEADS, 6, 4)
    assert (cross_weights.numpy()[0, :, :, 2:] == 0).all()
    cache = layer.init_cache(memory, 8)
    steps = []
    for i in range(6):
        y, cache = layer.decode_step(x[:, i : i + 1], cache, tf.constant(i), memory_mask=memory_mask)
        steps.append(y)
    np.testing.assert_allclose(tf.concat(steps, axis=1).numpy(), expected.numpy(), atol=1e-5)


def test_layer_norms_run_in_float32_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    layer = DecoderLayer(d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF)
    x = tf.random.normal((2, 3, D_MODEL))
    y, _ = layer(x, x)
    assert y.dtype == tf.bfloat16
    for norm in (layer.self_attention_norm, layer.cross_attention_norm, layer.feed_forward_norm):
        assert norm.compute_dtype == "float32"


def test_layer_configs_round_trip():
    for layer in (
        EncoderLayer(d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, norm="pre", attention="local", window=3),
        DecoderLayer(d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, residual=False, share_qkv="qk"),
        FeedForward(d_model=D_MODEL, d_ff=D_FF, dropout=0.2),
        TokenAndPositionEmbedding(vocab_size=20, d_model=D_MODEL, max_length=30),
    ):
        config = layer.get_config()
        assert type(layer).from_config(config).get_config() == config
