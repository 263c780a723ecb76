"""transformer.multi_head.MultiHeadAttention against keras.layers.MultiHeadAttention and a NumPy per-head reference."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from transformer.attention import causal_mask, local_mask
from transformer.multi_head import MultiHeadAttention

D_MODEL, HEADS = 32, 4
DEPTH = D_MODEL // HEADS


def make_inputs(seed, batch=2, lq=5, lk=7):
    rng = np.random.default_rng(seed)
    query = rng.normal(size=(batch, lq, D_MODEL)).astype(np.float32)
    memory = rng.normal(size=(batch, lk, D_MODEL)).astype(np.float32)
    return rng, query, memory


def keras_twin(layer, query, memory):
    """A keras.layers.MultiHeadAttention holding `layer`'s weights, reshaped to its (d_model, heads, depth) layout."""
    twin = keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=DEPTH)
    twin(query, memory, memory)
    for ours, theirs in (
        (layer.wq, twin._query_dense),
        (layer.wk, twin._key_dense),
        (layer.wv, twin._value_dense),
    ):
        theirs.kernel.assign(tf.reshape(ours.kernel, (D_MODEL, HEADS, DEPTH)))
        theirs.bias.assign(tf.reshape(ours.bias, (HEADS, DEPTH)))
    twin._output_dense.kernel.assign(tf.reshape(layer.wo.kernel, (HEADS, DEPTH, D_MODEL)))
    twin._output_dense.bias.assign(layer.wo.bias)
    return twin


def copy_weights(source, target, query, memory):
    target(query, memory, memory)
    target.set_weights(source.get_weights())
    return target


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("self_attention", [False, True])
def test_matches_keras_multi_head_attention(use_mask, self_attention):
    rng, query, memory = make_inputs(0)
    if self_attention:
        memory = query
    layer = MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS)
    layer(query, memory, memory)
    twin = keras_twin(layer, query, memory)
    mask = random_mask(rng, (2, query.shape[1], memory.shape[1])) if use_mask else None

    output, weights = layer(query, memory, memory, mask=None if mask is None else mask[:, None])
    expected, expected_weights = twin(
        query, memory, memory, attention_mask=mask, return_attention_scores=True
    )

    assert weights.shape == (2, HEADS, query.shape[1], memory.shape[1])
    assert np.abs(output.numpy() - expected.numpy()).max() < 1e-5
    assert np.abs(weights.numpy() - expected_weights.numpy()).max() < 1e-5
    if mask is not None:  # a rank-3 (B, Lq, Lk) mask, as Keras takes it, means the same
        np.testing.assert_array_equal(layer(query, memory, memory, mask=mask)[0].numpy(), output.numpy())


def random_mask(rng, shape):
    mask = rng.random(shape) > 0.3
    mask[..., 0] = True  # Keras gives fully masked rows uniform weights: keep one key per row
    return mask


def test_projection_layout_and_head_columns():
    _, query, memory = make_inputs(1)
    layer = MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS)
    _, weights = layer(query, memory, memory)
    for name in ("wq", "wk", "wv", "wo"):
        dense = getattr(layer, name)
        assert isinstance(dense, keras.layers.Dense) and dense.name == name
        assert dense.kernel.shape == (D_MODEL, D_MODEL) and dense.bias.shape == (D_MODEL,)
    # NumPy, head by head: head h uses columns h*depth:(h+1)*depth of wq / wk.
    wq, bq = layer.wq.kernel.numpy(), layer.wq.bias.numpy()
    wk, bk = layer.wk.kernel.numpy(), layer.wk.bias.numpy()
    for h in range(HEADS):
        cols = slice(h * DEPTH, (h + 1) * DEPTH)
        q = query @ wq[:, cols] + bq[cols]
        k = memory @ wk[:, cols] + bk[cols]
        logits = q @ k.transpose(0, 2, 1) / np.sqrt(DEPTH)
        expected = np.exp(logits - logits.max(-1, keepdims=True))
        expected /= expected.sum(-1, keepdims=True)
        np.testing.assert_allclose(weights.numpy()[:, h], expected, atol=1e-5)


@pytest.mark.parametrize("share_qkv, num_variables", [("none", 8), ("qk", 6), ("all", 4)])
def test_share_qkv_and_config_round_trip(share_qkv, num_variables):
    _, query, _ = make_inputs(2)
    layer = MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS, share_qkv=share_qkv, dropout=0.1, scale=0.5)
    layer(query, query, query)
    assert len(layer.trainable_variables) == num_variables
    assert (layer.wk is layer.wq) == (share_qkv in ("qk", "all"))
    assert (layer.wv is layer.wq) == (share_qkv == "all")
    config = layer.get_config()
    for key in ("d_model", "num_heads", "dropout", "share_qkv", "attention", "chunk_size", "window", "scale"):
        assert key in config
    clone = MultiHeadAttention.from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(restored, MultiHeadAttention) and restored.share_qkv == share_qkv


@pytest.mark.parametrize("attention", ["chunked", "local"])
def test_memory_efficient_variants_match_full(attention):
    rng, query, _ = make_inputs(3, lq=9)
    mask = tf.constant(rng.random((2, 1, 1, 9)) > 0.3)
    full = MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS)
    full(query, query, query)
    variant = copy_weights(
        full,
        MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS, attention=attention, chunk_size=4, window=2),
        query,
        query,
    )
    full_mask = mask if attention == "chunked" else tf.logical_and(mask, local_mask(9, 2))
    expected, _ = full(query, query, query, mask=full_mask)
    output, weights = variant(query, query, query, mask=mask)
    assert weights is None
    np.testing.assert_allclose(output.numpy(), expected.numpy(), atol=1e-5)


def test_kv_cache_incremental_equals_full_causal():
    _, x, _ = make_inputs(4, lq=6)
    layer = MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS)
    expected, _ = layer(x, x, x, mask=causal_mask(6))
    cache = layer.init_cache(2, 8)
    outputs = []
    for i in range(6):
        token = x[:, i : i + 1]
        output, weights, cache = layer(token, token, token, cache=cache, cache_index=tf.constant(i))
        assert cache["k"].shape == (2, HEADS, 8, DEPTH) and weights.shape == (2, HEADS, 1, 8)
        assert (weights.numpy()[..., i + 1 :] == 0).all()
        outputs.append(output)
    np.testing.assert_allclose(tf.concat(outputs, axis=1).numpy(), expected.numpy(), atol=1e-5)
    # Two tokens at once from position 4 give the same outputs as one at a time.
    cache2 = layer.init_cache(2, 8)
    _, _, cache2 = layer(x[:, :4], x[:, :4], x[:, :4], cache=cache2, cache_index=tf.constant(0))
    output, _, _ = layer(x[:, 4:], x[:, 4:], x[:, 4:], cache=cache2, cache_index=tf.constant(4))
    np.testing.assert_allclose(output.numpy(), expected.numpy()[:, 4:], atol=1e-5)


def test_growing_cache_equals_full_causal():
    """A cache holding just the filled prefix (appended to, attended whole) == causal attention over the sequence."""
    _, x, _ = make_inputs(4, lq=6)
    layer = MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS)
    expected, _ = layer(x, x, x, mask=causal_mask(6))
    cache = layer.init_cache(2, 0)
    for i in range(6):
        token = x[:, i : i + 1]
        output, weights, cache = layer(
            token, token, token, cache=cache, cache_index=tf.constant(i), growing=True
        )
        assert cache["k"].shape == (2, HEADS, i + 1, DEPTH) and weights.shape == (2, HEADS, 1, i + 1)
        np.testing.assert_allclose(output.numpy(), expected.numpy()[:, i : i + 1], atol=1e-5)
    # One row at a time vs all rows at once: the same values up to float32 rounding (the matmul kernel may block
    # them differently on some CPUs: 6e-7 apart on an AVX2 EPYC).
    np.testing.assert_allclose(cache["v"].numpy(), layer.project(layer.wv, x).numpy(), rtol=1e-5, atol=1e-6)
    # Several new positions at once are masked causally among themselves.
    _, _, prefix = layer(
        x[:, :2], x[:, :2], x[:, :2], cache=layer.init_cache(2, 0), cache_index=0, growing=True
    )
    output, _, _ = layer(x[:, 2:], x[:, 2:], x[:, 2:], cache=prefix, cache_index=tf.constant(2), growing=True)
    np.testing.assert_allclose(output.numpy(), expected.numpy()[:, 2:], atol=1e-5)


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize(("n", "index"), [(1, 3), (1, 0), (2, 3)])
def test_cache_write_is_exact(jit_compile, n, index):
    cache = {"k": tf.random.normal((2, HEADS, 5, DEPTH)), "v": tf.random.normal((2, HEADS, 5, DEPTH))}
    new_k, new_v = tf.random.normal((2, HEADS, n, DEPTH)), tf.random.normal((2, HEADS, n, DEPTH))
    write = tf.function(MultiHeadAttention.update_cache, jit_compile=jit_compile)
    updated = write(cache, new_k, new_v, tf.constant(index))
    for name, new in (("k", new_k), ("v", new_v)):
        expected = cache[name].numpy().copy()
        expected[:, :, index : index + n] = new.numpy()
        np.testing.assert_array_equal(updated[name].numpy(), expected)


def test_precomputed_cross_attention_equals_call():
    rng, query, memory = make_inputs(5)
    layer = MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS)
    mask = tf.constant(rng.random((2, 1, 1, 7)) > 0.3)
    expected, expected_weights = layer(query, memory, memory, mask=mask)
    key_value = layer.project_key_value(memory)
    assert key_value["k"].shape == (2, HEADS, 7, DEPTH)
    output, weights = layer.attend_key_value(query, key_value, mask=mask)
    np.testing.assert_allclose(output.numpy(), expected.numpy(), atol=1e-6)
    np.testing.assert_allclose(weights.numpy(), expected_weights.numpy(), atol=1e-6)


def test_grouped_rows_attend_to_their_own_entry():
    """3 query rows per memory entry (a beam of 3), one query each: == attention against a tiled memory."""
    rng, _, memory = make_inputs(7)
    query = rng.normal(size=(6, 1, D_MODEL)).astype(np.float32)
    layer = MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS)
    mask = tf.constant(rng.random((2, 1, 1, 7)) > 0.3)
    tiled_memory, tiled_mask = np.repeat(memory, 3, axis=0), tf.repeat(mask, 3, axis=0)
    expected, _ = layer(query, tiled_memory, tiled_memory, mask=tiled_mask)
    output, weights = layer.attend_key_value(query, layer.project_key_value(memory), mask=mask)
    assert output.shape == (6, 1, D_MODEL) and weights.shape == (2, HEADS, 3, 7)
    np.testing.assert_allclose(output.numpy(), expected.numpy(), atol=1e-5)


def test_mixed_float16_fully_masked_row_is_finite():
    keras.mixed_precision.set_global_policy("mixed_float16")
    _, query, memory = make_inputs(6)
    layer = MultiHeadAttention(d_model=D_MODEL, num_heads=HEADS)
    mask = np.ones((2, 1, 5, 7), bool)
    mask[0] = False
    output, weights = layer(query * 50, memory * 50, memory * 50, mask=mask)
    assert output.dtype == tf.float16
    assert np.isfinite(output.numpy()).all() and np.isfinite(weights.numpy()).all()
    assert (weights.numpy()[0] == 0).all()


def test_invalid_arguments():
    with pytest.raises(ValueError):
        MultiHeadAttention(d_model=30, num_heads=4)
    with pytest.raises(ValueError):
        MultiHeadAttention(d_model=32, num_heads=4, share_qkv="kv")
    with pytest.raises(ValueError):
        MultiHeadAttention(d_model=32, num_heads=4, attention="sparse")
    with pytest.raises(ValueError):
        MultiHeadAttention(d_model=32, num_heads=4, attention="chunked", mask_fill=-1e9)
