"""The attention's masked-softmax kernels (nmt/kernels/masked_softmax.cc) inside `scaled_dot_product_attention`:
against float64 NumPy (float32) and the TensorFlow path (bfloat16), with padding and causal masks, a fully masked
row, gradients; when the attention uses them."""

import numpy as np
import pytest
import tensorflow as tf

from transformer.attention import scaled_dot_product_attention
from transformer.kernels import fused


def _masks(batch, queries, keys, causal):
    """A padding mask (B, 1, 1, Lk), sentence 1 all padding (its rows fully masked), or padding and causal."""
    lengths = np.array([keys, 0, keys - 3][:batch])
    padding = np.arange(keys)[None, :] < lengths[:, None]  # (B, Lk)
    if not causal:
        return padding[:, None, None, :]
    return padding[:, None, None, :] & np.tril(np.ones((queries, keys), bool))[None, None]


def _attention(q, k, v, mask, dy, library, **kwargs):
    @tf.function
    def f(q, k, v):
        with fused(library), tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out, weights = scaled_dot_product_attention(q, k, v, tf.constant(mask), training=True, **kwargs)
        return [out, weights, *tape.gradient(out, [q, k, v], output_gradients=dy)]

    return f(q, k, v), f.get_concrete_function(q, k, v).graph


def _numpy_attention(q, k, v, mask, dy, scale=None):
    """Float64 output, weights and gradients of softmax(q k^T * scale) v over the allowed keys (scale: 1 / sqrt(d)
    by default)."""
    q, k, v, dy = (x.astype(np.float64) for x in (q, k, v, dy))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    z = q @ k.swapaxes(-1, -2) * scale
    mask = np.broadcast_to(mask, z.shape)
    top = np.where(mask, z, -np.inf).max(-1, keepdims=True)
    e = np.where(mask, np.exp(np.where(mask, z - np.where(np.isfinite(top), top, 0.0), 0.0)), 0.0)
    w = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    dw = dy @ v.swapaxes(-1, -2)
    dz = w * (dw - (dw * w).sum(-1, keepdims=True))
    dq = dz @ k * scale
    dk = dz.swapaxes(-1, -2) @ q * scale
    return [w @ v, w, dq, dk, w.swapaxes(-1, -2) @ dy]


# scale: the default 1 / sqrt(8), and a given one (both applied inside the kernel)
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_attention_on_the_masked_softmax_kernels_matches_numpy_and_the_tensorflow_path(
    ops, dtype, causal, scale
):
    rng = np.random.default_rng(7)
    batch, heads, length, depth = 3, 2, 9, 8
    q, k, v, dy = (rng.normal(0.0, 2.0, size=(batch, heads, length, depth)) for _ in range(4))
    mask = _masks(batch, length, length, causal)
    args = [tf.constant(x, dtype) for x in (q, k, v)]
    got, graph = _attention(*args, mask, tf.constant(dy, dtype), ops, scale=scale)
    assert {"NmtMaskedSoftmax", "NmtMaskedSoftmaxGrad"} <= {op.type for op in graph.get_operations()}
    weights = got[1].numpy().astype(np.float32)
    full = np.broadcast_to(mask, weights.shape)
    assert np.all(weights[~full] == 0.0) and np.all(weights[1] == 0.0)  # masked, and the all-padding sentence
    assert np.all(got[2].numpy()[1] == 0) and np.all(got[3].numpy()[1] == 0)
    if dtype == "float32":
        inputs = [tf.cast(x, tf.float32).numpy() for x in args]
        for a, b in zip(got, _numpy_attention(*inputs, mask, dy, scale)):
            np.testing.assert_allclose(a.numpy(), b, rtol=1e-4, atol=1e-5)
    else:  # the TensorFlow path on the same bfloat16 inputs: one rounding of float32 values apart
        want, _ = _attention(*args, mask, tf.constant(dy, dtype), None, scale=scale)
        for a, b in zip(got, want):
            a, b = tf.cast(a, tf.float32).numpy(), tf.cast(b, tf.float32).numpy()
            np.testing.assert_allclose(a, b, rtol=2**-6, atol=2**-6 * np.abs(b).max())


def test_the_kernel_scales_the_scores_except_in_float16(ops):
    """The scale moves into the softmax kernel (no multiply of the queries either way); float16 keeps the queries
    scaled before the product, as on the TensorFlow path, where unscaled scores could overflow."""
    mask = _masks(2, 4, 4, causal=False)
    for dtype, kernel_scale in (("bfloat16", 0.25), ("float32", 0.25), ("float16", 1.0)):
        q = tf.ones([2, 2, 4, 16], dtype)
        (_, graph) = _attention(q, q, q, mask, tf.ones([2, 2, 4, 16], dtype), ops)
        kernels = [op for op in graph.get_operations() if op.type.startswith("NmtMaskedSoftmax")]
        assert len(kernels) == 2 and all(op.get_attr("scale") == kernel_scale for op in kernels), dtype
        assert any(op.type == "Mul" for op in graph.get_operations()) == (dtype == "float16"), dtype


def test_other_attention_settings_keep_the_tensorflow_path(ops):
    """Dropout on the weights, a logit cap, the legacy additive fill or no mask: TensorFlow's softmax."""
    q = tf.ones([2, 2, 4, 8])
    mask = _masks(2, 4, 4, causal=False)
    for kwargs, given in (
        ({"dropout_rate": 0.1, "seed": tf.constant([1, 2])}, mask),
        ({"soft_cap": 5.0}, mask),
        ({"mask_fill": -1e9}, mask),
        ({}, None),
    ):

        @tf.function
        def f(q, given=given, kwargs=kwargs):
            with fused(ops):
                return scaled_dot_product_attention(q, q, q, given, training=True, **kwargs)

        traced = {op.type for op in f.get_concrete_function(q).graph.get_operations()}
        assert "NmtMaskedSoftmax" not in traced, kwargs  # (the weights' dropout runs on the dropout kernel)


def test_masked_softmax_kernel_names_a_mask_it_cannot_broadcast(ops):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"mask must be \(B or 1, 1, Lq or 1, Lk\)"):
        ops.nmt_masked_softmax(tf.ones([2, 2, 4, 5]), tf.ones([2, 1, 3, 5], tf.bool))
