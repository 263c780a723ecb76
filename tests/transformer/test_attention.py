"""transformer.attention against a NumPy reference and hand-written masks."""

import numpy as np
import pytest
import tensorflow as tf

from transformer.attention import (
    causal_mask,
    chunked_attention,
    local_attention,
    local_mask,
    padding_mask,
    scaled_dot_product_attention,
)

TOLERANCE = {tf.float64: 1e-10, tf.float32: 1e-5, tf.float16: 1e-2, tf.bfloat16: 5e-2}


def reference_attention(q, k, v, mask=None, scale=None, soft_cap=None):
    """float64 NumPy attention; masked weights 0, fully masked rows all 0."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    logits = q @ np.swapaxes(k, -1, -2) * scale
    if soft_cap is not None:
        logits = soft_cap * np.tanh(logits / soft_cap)
    allowed = np.ones(logits.shape, bool) if mask is None else np.broadcast_to(mask, logits.shape)
    logits = np.where(allowed, logits, -np.inf)
    row_max = logits.max(-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    exp = np.where(allowed, np.exp(logits - row_max), 0.0)
    total = exp.sum(-1, keepdims=True)
    weights = np.divide(exp, total, out=np.zeros_like(exp), where=total > 0)
    return weights @ v, weights


def random_qkv(rng, batch, lq, lk, depth, depth_v=None):
    depth_v = depth if depth_v is None else depth_v
    q = rng.normal(size=batch + (lq, depth)).astype(np.float32)
    k = rng.normal(size=batch + (lk, depth)).astype(np.float32)
    v = rng.normal(size=batch + (lk, depth_v)).astype(np.float32)
    return q, k, v


def random_mask(rng, shape, fully_masked_rows=1):
    mask = rng.random(shape) > 0.4
    for _ in range(fully_masked_rows):
        mask[(0,) * (len(shape) - 2) + (rng.integers(shape[-2]),)] = False
    return mask


# -- mask builders -----------------------------------------------------------------------------------------------------


def test_causal_mask_matches_hand_written():
    expected = np.array(
        [
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 1, 1, 0],
            [1, 1, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(causal_mask(4).numpy(), expected)
    np.testing.assert_array_equal(causal_mask(tf.constant(4)).numpy(), expected)
    assert causal_mask(4).dtype == tf.bool


def test_local_mask_matches_hand_written():
    expected = np.array(
        [
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1],
            [0, 0, 0, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(local_mask(5, 1).numpy(), expected)
    np.testing.assert_array_equal(local_mask(tf.constant(5), 1).numpy(), expected)
    np.testing.assert_array_equal(local_mask(3, 0).numpy(), np.eye(3, dtype=bool))


def test_padding_mask_matches_hand_written():
    ids = tf.constant([[5, 6, 0], [7, 0, 0]])
    mask = padding_mask(ids)
    assert mask.shape == (2, 1, 1, 3) and mask.dtype == tf.bool
    np.testing.assert_array_equal(mask.numpy()[:, 0, 0], [[True, True, False], [True, False, False]])
    np.testing.assert_array_equal(
        padding_mask(ids, pad_id=7).numpy()[:, 0, 0], [[True] * 3, [False, True, True]]
    )


# -- scaled dot-product attention ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [tf.float64, tf.float32, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sdpa_matches_numpy_with_random_masks(dtype, seed):
    rng = np.random.default_rng(seed)
    batch = (int(rng.integers(1, 3)), int(rng.integers(1, 4)))
    lq, lk, depth, depth_v = (int(x) for x in rng.integers(1, 9, size=4))
    q, k, v = random_qkv(rng, batch, lq, lk, depth, depth_v)
    mask = random_mask(rng, (batch[0], 1, lq, lk))
    q, k, v = (tf.cast(x, dtype) for x in (q, k, v))

    output, weights = scaled_dot_product_attention(q, k, v, mask)

    assert output.shape == batch + (lq, depth_v) and output.dtype == dtype
    assert weights.shape == batch + (lq, lk)
    out64, w64 = tf.cast(output, tf.float64).numpy(), tf.cast(weights, tf.float64).numpy()
    assert np.isfinite(out64).all() and np.isfinite(w64).all()
    full_mask = np.broadcast_to(mask, w64.shape)
    assert (w64[~full_mask] == 0.0).all(), "masked keys must get weight exactly 0"
    has_key = full_mask.any(-1)
    np.testing.assert_allclose(w64.sum(-1)[has_key], 1.0, atol=TOLERANCE[dtype])
    assert (out64[~has_key] == 0.0).all(), "fully masked rows must give zero output"
    ref_out, ref_w = reference_attention(*(tf.cast(x, tf.float64).numpy() for x in (q, k, v)), mask)
    np.testing.assert_allclose(w64, ref_w, atol=TOLERANCE[dtype])
    np.testing.assert_allclose(out64, ref_out, atol=TOLERANCE[dtype] * 4)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_sdpa_all_rows_masked_is_finite_in_low_precision(dtype):
    rng = np.random.default_rng(3)
    q, k, v = (tf.cast(x * 30.0, dtype) for x in random_qkv(rng, (2, 2), 4, 5, 8))
    output, weights = scaled_dot_product_attention(q, k, v, np.zeros((4, 5), bool))
    assert (tf.cast(weights, tf.float32).numpy() == 0).all()
    assert (tf.cast(output, tf.float32).numpy() == 0).all()


def test_sdpa_broadcast_masks_and_no_mask():
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, (2, 3), 6, 6, 4)
    ids = np.array([[4, 5, 6, 0, 0, 0], [4, 5, 6, 7, 8, 9]])
    mask = tf.logical_and(causal_mask(6), padding_mask(ids))  # (2, 1, 6, 6)
    for m in (None, causal_mask(6), padding_mask(ids), mask):
        output, weights = scaled_dot_product_attention(q, k, v, m)
        ref_out, ref_w = reference_attention(q, k, v, None if m is None else np.asarray(m))
        np.testing.assert_allclose(weights.numpy(), ref_w, atol=1e-6)
        np.testing.assert_allclose(output.numpy(), ref_out, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 1.0 / 8])
def test_sdpa_scale_override(scale):
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(rng, (2,), 3, 4, 8)
    output, weights = scaled_dot_product_attention(q, k, v, scale=scale)
    ref_out, ref_w = reference_attention(q, k, v, scale=scale)
    np.testing.assert_allclose(weights.numpy(), ref_w, atol=1e-6)
    np.testing.assert_allclose(output.numpy(), ref_out, atol=1e-5)


def test_sdpa_soft_cap():
    rng = np.random.default_rng(6)
    q, k, v = random_qkv(rng, (2,), 3, 4, 8)
    mask = random_mask(rng, (2, 3, 4))
    output, weights = scaled_dot_product_attention(q * 10, k, v, mask, soft_cap=2.0)
    ref_out, ref_w = reference_attention(q * 10, k, v, mask, soft_cap=2.0)
    np.testing.assert_allclose(weights.numpy(), ref_w, atol=1e-6)
    np.testing.assert_allclose(output.numpy(), ref_out, atol=1e-5)


def test_legacy_mask_fill_shows_the_classic_bugs():
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(rng, (1,), 3, 4, 8)
    mask = np.array([[True, True, False, False], [True, False, False, False], [False] * 4])
    # float32, -1e9: partially masked rows are fine, but the fully masked row attends uniformly to padding.
    _, weights = scaled_dot_product_attention(q, k, v, mask, mask_fill=-1e9)
    np.testing.assert_allclose(weights.numpy()[0, 2], 0.25, atol=1e-6)
    # float16, -1e9: the fill overflows to -inf and 0 * -inf poisons every row with NaN.
    output, _ = scaled_dot_product_attention(
        *(tf.cast(x, tf.float16) for x in (q, k, v)), mask, mask_fill=-1e9
    )
    assert not np.isfinite(output.numpy()).all()
    # The safe default on the same input.
    output, _ = scaled_dot_product_attention(*(tf.cast(x, tf.float16) for x in (q, k, v)), mask)
    assert np.isfinite(output.numpy()).all()


def test_sdpa_dropout_only_in_training():
    rng = np.random.default_rng(8)
    q, k, v = random_qkv(rng, (2, 2), 5, 5, 4)
    mask = causal_mask(5)
    eval_out, _ = scaled_dot_product_attention(q, k, v, mask, dropout_rate=0.5, training=False)
    ref_out, _ = reference_attention(q, k, v, np.asarray(mask))
    np.testing.assert_allclose(eval_out.numpy(), ref_out, atol=1e-5)
    _, weights = scaled_dot_product_attention(q, k, v, mask, dropout_rate=0.5, training=True)
    assert (weights.numpy()[..., ~np.asarray(mask)] == 0).all()
    assert (weights.numpy() == 0).sum() > (~np.asarray(mask)).sum() * 4  # some allowed weights were dropped


@pytest.mark.parametrize(
    "q_shape, k_shape, v_shape, bad",
    [
        ((2, 5, 8), (2, 6, 4), (2, 6, 8), ("(2, 5, 8)", "(2, 6, 4)")),
        ((2, 5, 8), (2, 6, 8), (2, 7, 8), ("(2, 6, 8)", "(2, 7, 8)")),
    ],
)
def test_sdpa_shape_mismatch_names_both_shapes(q_shape, k_shape, v_shape, bad):
    with pytest.raises(ValueError) as error:
        scaled_dot_product_attention(tf.zeros(q_shape), tf.zeros(k_shape), tf.zeros(v_shape))
    for shape in bad:
        assert shape in str(error.value)


# -- chunked attention -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lq, lk, query_chunk, key_chunk",
    [(8, 8, 4, 4), (7, 11, 3, 4), (5, 3, 2, 8), (1, 9, 4, 2), (10, 10, 64, 64)],
)
@pytest.mark.parametrize("mask_kind", ["none", "padding", "random"])
def test_chunked_equals_full(lq, lk, query_chunk, key_chunk, mask_kind):
    rng = np.random.default_rng(lq * 100 + lk)
    q, k, v = random_qkv(rng, (2, 2), lq, lk, 8, 6)
    if mask_kind == "none":
        mask = None
    elif mask_kind == "padding":
        ids = np.ones((2, lk), np.int32)
        ids[1, max(1, lk // 2) :] = 0
        mask = padding_mask(ids)
    else:
        mask = random_mask(rng, (2, 1, lq, lk))  # includes a fully masked row
    output = chunked_attention(q, k, v, mask, query_chunk=query_chunk, key_chunk=key_chunk)
    ref_out, _ = reference_attention(q, k, v, None if mask is None else np.asarray(mask))
    assert output.shape == (2, 2, lq, 6)
    np.testing.assert_allclose(output.numpy(), ref_out, atol=1e-5)


def test_chunked_with_causal_mask_and_low_precision():
    rng = np.random.default_rng(9)
    q, k, v = random_qkv(rng, (3,), 9, 9, 8)
    mask = causal_mask(9)
    ref_out, _ = reference_attention(q, k, v, np.asarray(mask))
    np.testing.assert_allclose(
        chunked_attention(q, k, v, mask, query_chunk=4, key_chunk=2).numpy(), ref_out, atol=1e-5
    )
    for dtype in (tf.float16, tf.bfloat16):
        output = chunked_attention(*(tf.cast(x, dtype) for x in (q, k, v)), mask, query_chunk=4, key_chunk=2)
        assert output.dtype == dtype
        np.testing.assert_allclose(tf.cast(output, tf.float32).numpy(), ref_out, atol=TOLERANCE[dtype] * 4)


def attention_and_gradients(attention_fn, q, k, v, mask):
    """Output and d(sum(output^2))/d(q, k, v)."""
    q, k, v = (tf.convert_to_tensor(x) for x in (q, k, v))
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        output = attention_fn(q, k, v, mask)
        loss = tf.reduce_sum(tf.square(output))
    return output, tape.gradient(loss, [q, k, v])


def chunked(q, k, v, mask):
    return chunked_attention(q, k, v, mask, query_chunk=3, key_chunk=4)


def full(q, k, v, mask):
    return scaled_dot_product_attention(q, k, v, mask)[0]


def test_chunked_gradients_equal_full_gradients():
    rng = np.random.default_rng(12)
    q, k, v = random_qkv(rng, (2, 2), 7, 10, 6)
    mask = random_mask(rng, (2, 1, 7, 10))
    _, gradients = attention_and_gradients(chunked, q, k, v, mask)
    _, expected = attention_and_gradients(full, q, k, v, mask)
    for got, want in zip(gradients, expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)


def test_chunked_under_xla_and_with_dynamic_shapes():
    rng = np.random.default_rng(10)
    q, k, v = random_qkv(rng, (2, 2), 7, 10, 6)
    key_mask = rng.random((2, 1, 1, 10)) > 0.3
    ref_out, _ = reference_attention(q, k, v, key_mask)
    compiled = tf.function(chunked, jit_compile=True)
    np.testing.assert_allclose(compiled(q, k, v, key_mask).numpy(), ref_out, atol=1e-5)

    mask = random_mask(rng, (2, 1, 7, 10))
    ref_out, _ = reference_attention(q, k, v, mask)

    spec = tf.TensorSpec([None, None, None, 6], tf.float32)
    dynamic = tf.function(
        chunked, input_signature=[spec, spec, spec, tf.TensorSpec([None, None, None, None], tf.bool)]
    )
    np.testing.assert_allclose(dynamic(q, k, v, mask).numpy(), ref_out, atol=1e-5)


@pytest.mark.slow
def test_chunked_gradients_under_xla():
    """The while loops need maximum_iterations to be differentiable under XLA (about 10 s of compilation here)."""
    rng = np.random.default_rng(13)
    q, k, v = random_qkv(rng, (1, 2), 4, 8, 6)
    compiled = tf.function(lambda q, k, v: attention_and_gradients(chunked, q, k, v, None), jit_compile=True)
    _, gradients = compiled(q, k, v)
    _, expected = attention_and_gradients(full, q, k, v, None)
    for got, want in zip(gradients, expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)


# -- local attention -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length, window", [(9, 0), (9, 1), (10, 3), (5, 8), (16, 4)])
@pytest.mark.parametrize("with_padding", [False, True])
def test_local_equals_full_with_local_mask(length, window, with_padding):
    rng = np.random.default_rng(length * 10 + window)
    q, k, v = random_qkv(rng, (2, 2), length, length, 8)
    mask, full_mask = None, local_mask(length, window)
    if with_padding:
        ids = np.ones((2, length), np.int32)
        ids[0, length // 2 :] = 0
        ids[1, :] = 0  # every key padded: all rows fully masked
        mask = padding_mask(ids)
        full_mask = tf.logical_and(full_mask, mask)
    expected, _ = scaled_dot_product_attention(q, k, v, full_mask)
    ref_out, _ = reference_attention(q, k, v, np.asarray(full_mask))
    output = local_attention(q, k, v, window, mask)
    np.testing.assert_allclose(output.numpy(), expected.numpy(), atol=1e-5)
    np.testing.assert_allclose(output.numpy(), ref_out, atol=1e-5)


def test_local_with_query_mask_and_block_size():
    rng = np.random.default_rng(11)
    q, k, v = random_qkv(rng, (2,), 11, 11, 4)
    query_mask = random_mask(rng, (2, 11, 11))
    ref_out, _ = reference_attention(q, k, v, np.logical_and(query_mask, np.asarray(local_mask(11, 2))))
    np.testing.assert_allclose(local_attention(q, k, v, 2, query_mask).numpy(), ref_out, atol=1e-5)

    ref_out, _ = reference_attention(q, k, v, np.asarray(local_mask(11, 2)))
    np.testing.assert_allclose(local_attention(q, k, v, 2, block_size=5).numpy(), ref_out, atol=1e-5)
    with pytest.raises(ValueError):
        local_attention(q, k, v, 3, block_size=2)
