"""The bias kernels (nmt/kernels/bias.cc: the bias add with its ReLU, and their gradients; heads.cc: the bias add
with the attention's head split, and its gradient) against TensorFlow's BiasAdd, Relu, ReluGrad and transpose and
float64 NumPy, and `transformer.attention_ops.flat_dense` and `dense_heads` on them (inside `fused`) against Keras'
Dense on TensorFlow's ops."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from transformer.attention_ops import dense_heads, flat_dense
from transformer.kernels import fused


def _as_float(t):
    return tf.cast(t, tf.float32).numpy()


def _same_bits(a, b):
    """Bit for bit, a NaN matching any NaN (its sign and payload are not part of the contract)."""
    bits = tf.uint16 if a.dtype != tf.float32 else tf.uint32
    same = tf.bitcast(a, bits).numpy() == tf.bitcast(b, bits).numpy()
    return np.all(same | (np.isnan(_as_float(a)) & np.isnan(_as_float(b))))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(130, 7), (64, 1024), (1, 5), (0, 8)])
def test_bias_add_kernel_is_tensorflow_bias_add_and_relu_bit_for_bit(ops, dtype, shape):
    rng = np.random.default_rng(sum(shape) + 1)
    x, bias = rng.normal(size=shape), rng.normal(size=shape[1])
    if shape[0] > 1:
        # NaN, -0 + 0, a sum that cancels to 0, a product 0 with a negative bias, a tie to round
        x[0, :5] = [np.nan, -0.0, 1.5, 0.0, 1.0 + 2**-8]
        bias[:5] = [1.0, 0.0, -1.5, -2.0, 2**-9]
    x, bias = tf.constant(x, dtype), tf.constant(bias, dtype)
    added = ops.nmt_bias_add(x, bias)
    assert added.dtype == x.dtype and added.shape == x.shape
    assert _same_bits(added, tf.nn.bias_add(x, bias))
    assert _same_bits(ops.nmt_bias_add(x, bias, relu=True), tf.nn.relu(tf.nn.bias_add(x, bias)))


def test_bias_add_kernel_names_a_shape_mismatch(ops):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="shape|Dimension|bias"):
        ops.nmt_bias_add(tf.ones([4, 8]), tf.ones([7]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(130, 7), (64, 1024), (1, 5), (0, 8)])
def test_bias_gradient_kernels_match_relu_grad_bit_for_bit_and_float64_sums(ops, dtype, shape):
    rng = np.random.default_rng(sum(shape))
    dy = rng.normal(size=shape)
    y = np.maximum(rng.normal(size=shape), 0.0)  # a ReLU's output: zeros and positives
    if shape[0] > 1:
        dy[0, :3] = [-1.5, np.nan, 2.0][: shape[1]]
        y[0, :3] = [0.0, 0.0, 1.0][: shape[1]]  # -0 for a negative dy where y is 0, NaN kept
    dy, y = tf.constant(dy, dtype), tf.constant(y, dtype)
    dx, d_bias = ops.nmt_relu_bias_grad(dy, y)
    assert dx.dtype == dy.dtype and d_bias.dtype == tf.float32 and d_bias.shape == (shape[1],)
    assert _same_bits(dx, tf.raw_ops.ReluGrad(gradients=dy, features=y))
    want = _as_float(dx).astype(np.float64).sum(0)
    np.testing.assert_allclose(d_bias.numpy(), want, rtol=1e-5, atol=1e-5)
    plain = ops.nmt_bias_grad(dy).numpy()
    np.testing.assert_allclose(plain, _as_float(dy).astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    # fixed blocks summed in order: the same bits on every call
    assert ops.nmt_bias_grad(dy).numpy().tobytes() == plain.tobytes()


def test_relu_bias_gradient_kernel_names_a_shape_mismatch(ops):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="shape|Dimension"):
        ops.nmt_relu_bias_grad(tf.ones([4, 8]), tf.ones([4, 7]))


def _dense_and_gradients(dense, x, dy, library, eager=False):
    """y, dx and the gradients of the kernel and bias; and the traced graph. ``eager``: the values eagerly, op by op
    (the matmul's product rounded before its bias is added: no grappler fusing them), as the kernels compute."""

    def f(x):
        with fused(library), tf.GradientTape() as tape:
            tape.watch(x)
            y = flat_dense(dense, x)
        return [y, *tape.gradient(y, [x, *dense.trainable_variables], output_gradients=dy)]

    traced = tf.function(f)
    return (f(x) if eager else traced(x)), traced.get_concrete_function(x).graph


@pytest.mark.parametrize("activation", ["relu", None])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_flat_dense_on_the_kernels_is_keras_dense_on_tensorflow_ops(ops, activation, policy):
    """Keras' Dense run eagerly, op by op: same forward bits and the same input and kernel gradients (the same
    ops); the bias gradient the float64 sum of the output gradient (through the ReLU) to float32 rounding.
    TensorFlow's BiasAddGrad sums bfloat16 with bfloat16 rounding on the way (6% off here under mixed_bfloat16): it
    is compared at that precision only. Traced, grappler fuses Keras' bias into the matmul (one rounding of the sum
    in bfloat16, two on the kernels): the same to one rounding."""
    dense = keras.layers.Dense(24, activation=activation, dtype=policy)
    dense.build((None, 10))
    rng = np.random.default_rng(4)
    dense.bias.assign(rng.normal(size=24).astype(np.float32))
    x = tf.constant(rng.normal(size=(3, 5, 10)), dense.compute_dtype)
    dy = tf.constant(rng.normal(size=(15, 24)), dense.compute_dtype)
    got, graph = _dense_and_gradients(dense, x, dy, ops)
    want, plain_graph = _dense_and_gradients(dense, x, dy, None, eager=True)
    traced, _ = _dense_and_gradients(dense, x, dy, None)
    rounding = 2**-7 if policy == "mixed_bfloat16" else 1e-6
    np.testing.assert_allclose(_as_float(got[0]), _as_float(traced[0]), rtol=rounding, atol=rounding)
    ops_used = {op.type for op in graph.get_operations()}
    assert {"NmtBiasAdd", "NmtReluBiasGrad" if activation else "NmtBiasGrad"} <= ops_used
    assert not any(op.type.startswith("Nmt") for op in plain_graph.get_operations())
    for a, b in zip(got[:3], want[:3]):  # y, dx, d kernel
        assert a.dtype == b.dtype and _same_bits(a, b)
    through = _as_float(dy).astype(np.float64) * ((_as_float(got[0]) > 0) if activation else 1.0)
    np.testing.assert_allclose(got[3].numpy(), through.sum(0), rtol=1e-5, atol=1e-5)
    tolerance = 0.1 if policy == "mixed_bfloat16" else 1e-5
    np.testing.assert_allclose(want[3].numpy(), through.sum(0), rtol=tolerance, atol=tolerance)


def test_flat_dense_keeps_keras_call_for_other_activations_and_without_a_bias(ops):
    for dense in (keras.layers.Dense(4, activation="gelu"), keras.layers.Dense(4, use_bias=False)):
        dense.build((None, 3))
        _, graph = _dense_and_gradients(dense, tf.ones([2, 3]), tf.ones([2, 4]), ops)
        assert not any(op.type.startswith("Nmt") for op in graph.get_operations())


def _split(x, heads):
    """TensorFlow's head split: (B, L, D) -> (B, heads, L, D / heads)."""
    batch, length, units = x.shape
    return tf.transpose(tf.reshape(x, [batch, length, heads, units // heads]), [0, 2, 1, 3])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    ("shape", "heads"), [((3, 5, 12), 4), ((2, 1, 8), 2), ((1, 70, 6), 1), ((0, 4, 8), 2)]
)
def test_head_split_kernels_are_bias_add_and_transpose_bit_for_bit(ops, dtype, shape, heads):
    rng = np.random.default_rng(sum(shape) + heads)
    x = tf.constant(rng.normal(size=shape), dtype)
    bias = tf.constant(rng.normal(size=shape[-1]), dtype)
    y = ops.nmt_bias_add_heads(x, bias, heads=heads)
    want = _split(tf.nn.bias_add(x, bias), heads)
    assert y.dtype == x.dtype and y.shape == want.shape and _same_bits(y, want)
    dy = tf.constant(rng.normal(size=want.shape), dtype)
    dx, d_bias = ops.nmt_heads_bias_grad(dy)
    back = tf.reshape(tf.transpose(dy, [0, 2, 1, 3]), shape)  # the transpose's gradient
    assert dx.dtype == dy.dtype and dx.shape == shape and _same_bits(dx, back)
    assert d_bias.dtype == tf.float32
    want_bias = _as_float(back).astype(np.float64).reshape(-1, shape[-1]).sum(0)
    np.testing.assert_allclose(d_bias.numpy(), want_bias, rtol=1e-5, atol=1e-5)


def test_head_split_kernel_names_units_that_do_not_split(ops):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="multiple of heads|divisible"):
        ops.nmt_bias_add_heads(tf.ones([2, 3, 10]), tf.ones([10]), heads=4)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_dense_heads_on_the_kernels_is_the_tensorflow_projection_and_split(ops, policy):
    """As `flat_dense` above, for an attention projection split into heads: the same forward bits and input and
    kernel gradients as TensorFlow's ops run one by one, the bias gradient the float64 sum."""
    dense = keras.layers.Dense(12, dtype=policy)
    dense.build((None, 10))
    rng = np.random.default_rng(6)
    dense.bias.assign(rng.normal(size=12).astype(np.float32))
    x = tf.constant(rng.normal(size=(3, 5, 10)), dense.compute_dtype)
    dy = tf.constant(rng.normal(size=(3, 4, 5, 3)), dense.compute_dtype)

    def run(library, eager=False):
        def f(x):
            with fused(library), tf.GradientTape() as tape:
                tape.watch(x)
                y = dense_heads(dense, x, 4)
            return [y, *tape.gradient(y, [x, *dense.trainable_variables], output_gradients=dy)]

        traced = tf.function(f)
        return (f(x) if eager else traced(x)), traced.get_concrete_function(x).graph

    got, graph = run(ops)
    want, plain_graph = run(None, eager=True)
    assert {"NmtBiasAddHeads", "NmtHeadsBiasGrad"} <= {op.type for op in graph.get_operations()}
    assert not any(op.type.startswith("Nmt") for op in plain_graph.get_operations())
    for a, b in zip(got[:3], want[:3]):  # y, dx, d kernel
        assert a.dtype == b.dtype and a.shape == b.shape and _same_bits(a, b)
    through = _as_float(dy).astype(np.float64).transpose(0, 2, 1, 3).reshape(-1, 12)
    np.testing.assert_allclose(got[3].numpy(), through.sum(0), rtol=1e-5, atol=1e-5)
