"""transformer.dropout against a NumPy reference built from the same Philox draws, and its layer's contract."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from transformer.dropout import LEVELS, Dropout, drop_threshold, dropout, keep_scale

SEED = tf.constant([7, 3], tf.int32)


def _numpy_dropout(x, rate, seed):
    """The reference: the same uint32 Philox words, split into little-endian 16-bit halves by NumPy."""
    size = x.size
    words = tf.random.stateless_uniform([(size + 1) // 2], seed, minval=None, maxval=None, dtype=tf.uint32)
    halves = words.numpy().astype("<u4").view("<u2")[:size].reshape(x.shape)
    keep = halves >= round(rate * 65536)
    return np.where(keep, x * (1.0 / (1.0 - round(rate * 65536) / 65536)), 0.0), keep


@pytest.mark.parametrize("shape", [(4, 5, 6), (3, 7), (1,)])  # even and odd sizes (the last half unused)
@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_matches_the_numpy_reference(shape, rate):
    x = np.random.RandomState(0).randn(*shape).astype(np.float32)
    expected, _ = _numpy_dropout(x, rate, SEED)
    np.testing.assert_allclose(dropout(tf.constant(x), rate, SEED).numpy(), expected, rtol=1e-6)


def test_drop_fraction_and_mean_on_a_large_tensor():
    x = np.ones((1000, 1000), np.float32)
    y = dropout(tf.constant(x), 0.1, SEED).numpy()
    dropped = float((y == 0).mean())
    assert abs(dropped - 0.1) < 0.002  # binomial std over 1e6 draws is 0.0003
    assert abs(float(y.mean()) - 1.0) < 0.003  # inverted dropout keeps the expectation


def test_rate_is_quantised_to_one_in_65536():
    assert drop_threshold(0.0) == 0
    assert drop_threshold(0.1) == 6554
    assert drop_threshold(1e-9) == 1  # a positive rate never silently becomes 0
    assert drop_threshold(1 - 1e-9) == LEVELS - 1  # fits 16 bits; one element in 65,536 is kept
    y = dropout(tf.ones((4, 4)), 1 - 1e-9, SEED).numpy()
    assert np.isfinite(y).all()
    assert keep_scale(0.3) == pytest.approx(LEVELS / (LEVELS - 19661))
    with pytest.raises(ValueError, match="dropout rate"):
        drop_threshold(1.0)


def test_gradient_is_the_mask_times_the_upstream_gradient():
    x = tf.constant(np.random.RandomState(1).randn(6, 8).astype(np.float32))
    dy = tf.constant(np.random.RandomState(2).randn(6, 8).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = dropout(x, 0.25, SEED)
    _, keep = _numpy_dropout(x.numpy(), 0.25, SEED)
    np.testing.assert_allclose(
        tape.gradient(y, x, output_gradients=dy).numpy(), dy.numpy() * keep / 0.75, rtol=1e-6
    )


def test_bfloat16_keeps_its_dtype_and_mask():
    x = np.random.RandomState(3).randn(5, 9).astype(np.float32)
    y = dropout(tf.cast(x, tf.bfloat16), 0.1, SEED)
    assert y.dtype == tf.bfloat16
    _, keep = _numpy_dropout(x, 0.1, SEED)
    np.testing.assert_array_equal(y.numpy() != 0, keep)


def test_layer_draws_from_its_seed_generator_and_restores_exactly():
    layer = Dropout(0.5, seed=11)
    x = tf.ones((4, 16))
    state = layer.seed_generator.state.numpy()
    first = layer(x, training=True).numpy()
    second = layer(x, training=True).numpy()
    assert not np.array_equal(first, second)  # a new mask per call
    layer.seed_generator.state.assign(state)  # what restoring a checkpoint does
    np.testing.assert_array_equal(layer(x, training=True).numpy(), first)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    np.testing.assert_array_equal(Dropout(0.0)(x, training=True).numpy(), x.numpy())


def test_layer_is_a_keras_dropout_with_the_same_variables():
    ours, theirs = Dropout(0.1, seed=1), keras.layers.Dropout(0.1, seed=1)
    assert isinstance(ours, keras.layers.Dropout)
    assert [v.shape for v in ours.variables] == [v.shape for v in theirs.variables]  # checkpoints still load
    with pytest.raises(ValueError, match="noise_shape"):
        Dropout(0.1, noise_shape=(1, 4))


def test_inside_a_tf_function_with_unknown_shape():
    fn = tf.function(
        lambda x: dropout(x, 0.2, SEED), input_signature=[tf.TensorSpec([None, None], tf.float32)]
    )
    x = np.random.RandomState(4).randn(3, 5).astype(np.float32)
    np.testing.assert_allclose(fn(tf.constant(x)).numpy(), _numpy_dropout(x, 0.2, SEED)[0], rtol=1e-6)


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_residual_is_added_in_its_dtype_with_the_gradient_passing_to_both(rate):
    x = np.random.RandomState(4).randn(3, 7).astype(np.float32)
    residual = tf.constant(np.random.RandomState(5).randn(3, 7), tf.float64)
    dy = tf.constant(np.random.RandomState(6).randn(3, 7), tf.float64)
    x_tensor = tf.constant(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x_tensor, residual])
        y = dropout(x_tensor, rate, SEED, residual=residual)
    assert y.dtype == tf.float64
    expected, keep = _numpy_dropout(x, rate, SEED) if rate else (x, np.ones_like(x, bool))
    np.testing.assert_allclose(y.numpy(), residual.numpy() + expected.astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(tape.gradient(y, residual, output_gradients=dy).numpy(), dy.numpy())
    scale = 1.0 / (1.0 - round(rate * 65536) / 65536)
    np.testing.assert_allclose(
        tape.gradient(y, x_tensor, output_gradients=dy).numpy(), dy.numpy() * keep * scale, rtol=1e-6
    )


def test_layer_add_to_is_the_residual_plus_its_call():
    layer = Dropout(0.5, seed=12)
    x, residual = tf.ones((4, 16)), tf.fill((4, 16), 2.0)
    state = layer.seed_generator.state.numpy()
    called = layer(x, training=True).numpy()
    layer.seed_generator.state.assign(state)
    np.testing.assert_array_equal(layer.add_to(residual, x, training=True).numpy(), 2.0 + called)
    np.testing.assert_array_equal(layer.add_to(residual, x, training=False).numpy(), 3.0 + np.zeros((4, 16)))
