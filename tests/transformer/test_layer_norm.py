"""`transformer.layer_norm`: values and gradients against Keras' own LayerNormalization (autodiff) and NumPy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from transformer.layer_norm import LayerNorm, layer_normalization
from transformer.residual import layer_norm, normalize

D = 12


def pair(seed=0):
    """A `LayerNorm` and a stock Keras LayerNormalization with the same random gamma and beta."""
    rng = np.random.default_rng(seed)
    ours = LayerNorm(epsilon=1e-6, dtype="float32")
    reference = keras.layers.LayerNormalization(epsilon=1e-6, dtype="float32")
    ours.build((None, D))
    reference.build((None, D))
    gamma, beta = rng.normal(1.0, 0.5, D).astype(np.float32), rng.normal(0.0, 0.5, D).astype(np.float32)
    for layer in (ours, reference):
        layer.gamma.assign(gamma)
        layer.beta.assign(beta)
    return ours, reference


def inputs(shape, seed=1):
    rng = np.random.default_rng(seed)
    # rows of other means and scales, one with a variance near epsilon (which then matters)
    x = rng.normal(size=shape) * rng.uniform(0.1, 5.0, size=shape[:-1] + (1,)) + rng.normal(
        size=shape[:-1] + (1,)
    )
    x.reshape(-1, shape[-1])[0] = 1e-3 * rng.normal(size=shape[-1])
    return x.astype(np.float32)


def values_and_gradients(layer, x, upstream):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        objective = tf.reduce_sum(tf.cast(y, tf.float64) * upstream)
    dx, d_gamma, d_beta = tape.gradient(objective, [x, layer.gamma, layer.beta])
    return y, dx, d_gamma, d_beta


def test_float32_matches_keras_and_numpy():
    ours, reference = pair()
    x = inputs((3, 5, D))
    upstream = np.random.default_rng(2).normal(size=x.shape).astype(np.float32)
    got = values_and_gradients(ours, x, upstream)
    want = values_and_gradients(reference, x, upstream)
    assert got[0].dtype == tf.float32 and got[1].shape == x.shape
    for name, a, b in zip(("y", "dx", "dgamma", "dbeta"), got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-4, atol=2e-4, err_msg=name)
    # NumPy, float64: the forward formula
    x64 = x.astype(np.float64)
    x_hat = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-6)
    expected = x_hat * ours.gamma.numpy() + ours.beta.numpy()
    np.testing.assert_allclose(got[0].numpy(), expected, rtol=1e-5, atol=1e-5)


def test_gradient_matches_finite_differences():
    """The hand-written gradient against central differences of the forward pass, in float64 NumPy."""
    ours, _ = pair(seed=3)
    # one well-conditioned row for the differences
    x = np.random.default_rng(5).normal(size=(1, D)).astype(np.float32)
    upstream = np.random.default_rng(6).normal(size=x.shape).astype(np.float32)
    _, dx, _, _ = values_and_gradients(ours, x, upstream)
    gamma, beta = ours.gamma.numpy().astype(np.float64), ours.beta.numpy().astype(np.float64)

    def objective(rows):
        x_hat = (rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + 1e-6)
        return float(((x_hat * gamma + beta) * upstream).sum())

    numeric = np.zeros(x.shape)
    for i in range(D):
        step = np.zeros(x.shape)
        step[0, i] = 1e-5
        numeric[0, i] = (objective(x + step) - objective(x - step)) / 2e-5
    np.testing.assert_allclose(dx.numpy(), numeric, rtol=1e-3, atol=1e-3)


def test_bfloat16_input_keeps_its_dtype_and_matches_keras_in_float32():
    ours, reference = pair(seed=7)
    x = tf.cast(inputs((4, 6, D), seed=8), tf.bfloat16)
    # bfloat16 values: the gradient reaches a bfloat16 output as bfloat16, so both layers see the same upstream
    upstream = tf.cast(
        tf.cast(np.random.default_rng(9).normal(size=x.shape), tf.bfloat16), tf.float32
    ).numpy()
    y, dx, d_gamma, d_beta = values_and_gradients(ours, x, upstream)
    assert y.dtype == tf.bfloat16 and dx.dtype == tf.bfloat16
    assert d_gamma.dtype == tf.float32 and d_beta.dtype == tf.float32
    # Keras' layer on the same values in float32, rounded to bfloat16 as ours rounds: at most one bf16 step apart
    want = values_and_gradients(reference, tf.cast(x, tf.float32), upstream)
    rounded = tf.cast(tf.cast(want[0], tf.bfloat16), tf.float32)
    np.testing.assert_allclose(tf.cast(y, tf.float32).numpy(), rounded.numpy(), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(tf.cast(dx, tf.float32).numpy(), want[1].numpy(), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(d_gamma.numpy(), want[2].numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d_beta.numpy(), want[3].numpy(), rtol=1e-4, atol=1e-4)


def test_normalize_in_a_mixed_bfloat16_layer():
    """`normalize` with `layer_norm` under a mixed_bfloat16 policy: float32 variables, the input's dtype out, and
    the values of Keras' layer applied the way the model applied it before (cast to float32, normalise, cast)."""
    norm = layer_norm("n")
    reference = keras.layers.LayerNormalization(epsilon=1e-6, dtype="float32")
    x = tf.cast(inputs((2, 3, D), seed=10), tf.bfloat16)
    y = normalize(norm, x)
    reference.build(x.shape)
    reference.set_weights(norm.get_weights())
    assert norm.gamma.dtype == "float32" and y.dtype == tf.bfloat16
    np.testing.assert_allclose(
        tf.cast(y, tf.float32).numpy(),
        tf.cast(tf.cast(reference(x), tf.bfloat16), tf.float32).numpy(),
        atol=1e-2,
    )


def test_float64_input_is_normalised_in_float64():
    """As Keras' layer: a float64 input is not rounded to float32 on the way."""
    ours, _ = pair(seed=12)
    x = inputs((3, D), seed=13).astype(np.float64) * (1 + 1e-9)
    upstream = np.random.default_rng(14).normal(size=x.shape)
    y, dx, d_gamma, _ = values_and_gradients(ours, x, upstream)
    assert y.dtype == tf.float64 and dx.dtype == tf.float64 and d_gamma.dtype == tf.float32
    gamma, beta = ours.gamma.numpy().astype(np.float64), ours.beta.numpy().astype(np.float64)
    std = np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    x_hat = (x - x.mean(-1, keepdims=True)) / std
    np.testing.assert_allclose(y.numpy(), x_hat * gamma + beta, rtol=1e-12, atol=1e-12)
    g = upstream * gamma
    expected = (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True)) / std
    np.testing.assert_allclose(dx.numpy(), expected, rtol=1e-10, atol=1e-10)


def test_function_under_xla_equals_eager():
    x = tf.constant(inputs((3, D), seed=11))
    gamma, beta = tf.constant(np.linspace(0.5, 1.5, D, dtype=np.float32)), tf.zeros(D)
    compiled = tf.function(lambda x: layer_normalization(x, gamma, beta, 1e-6), jit_compile=True)
    np.testing.assert_allclose(
        compiled(x).numpy(), layer_normalization(x, gamma, beta, 1e-6).numpy(), atol=1e-5
    )


def test_functional_model_declares_the_input_dtype():
    inputs = keras.Input(shape=(3, D), dtype="bfloat16")
    outputs = LayerNorm(epsilon=1e-6, dtype="float32")(inputs)
    assert outputs.dtype == "bfloat16"
    model = keras.Model(inputs, outputs)
    assert model(tf.ones((2, 3, D), tf.bfloat16)).dtype == tf.bfloat16


@pytest.mark.filterwarnings("ignore:You passed `rms_scaling=True`")
def test_config_round_trip_and_refusals():
    layer = LayerNorm(epsilon=1e-3, dtype="float32", name="n")
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(again) is LayerNorm and again.epsilon == 1e-3 and again.name == "n"
    for kwargs in ({"axis": 0}, {"center": False}, {"scale": False}, {"rms_scaling": True}):
        with pytest.raises(ValueError, match="last axis"):
            LayerNorm(**kwargs)
