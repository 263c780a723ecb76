"""transformer.decoding on a real tiny (untrained) Transformer: the cached step functions against full recomputation,
the growing KV cache against the fixed buffer, and `nmt.batch_decoding.decode_batch` compacted against its static
form and XLA. The searches with fake step functions: test_decoding.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from nmt.batch_decoding import decode_batch
from tests.transformer.model_configs import tiny_config
from transformer.decoding import beam_search
from transformer.model import build_model
from transformer.step_fns import cached_decoding, cached_step_fn, full_step_fn
from transformer.vocab import BOS_ID, EOS_ID, PAD_ID


@pytest.fixture(scope="module")
def model():
    """One tiny untrained model (the weights of seed 1234) for the tests below: decoding leaves it as it is."""
    keras.utils.set_random_seed(1234)
    return build_model(tiny_config(d_model=16, num_heads=2, d_ff=32, max_length=16), 32, 32)


def test_real_model_cached_and_full_steps_agree(model):
    source = tf.constant([[5, 9, 12, 7, EOS_ID], [6, 8, EOS_ID, PAD_ID, PAD_ID]])
    max_length = 6
    step_fn, cache = cached_decoding(model, source, max_length)
    cached = beam_search(step_fn, cache, batch_size=2, beam_size=3, max_length=max_length)
    # The whole cache tiled and reordered by the search (the memory part too): the same search, more work.
    whole = model.init_cache(source, model.encode(source), max_length)
    tiled = beam_search(cached_step_fn(model), whole, batch_size=2, beam_size=3, max_length=max_length)
    np.testing.assert_array_equal(cached[0].numpy(), tiled[0].numpy())
    np.testing.assert_allclose(cached[1].numpy(), tiled[1].numpy(), atol=1e-5)
    # In a graph, as the translator runs it (the prefix slice has a dynamic length there); both full-step forms.
    for prefix_only in (False, True):
        full = tf.function(
            lambda prefix_only=prefix_only: beam_search(
                full_step_fn(model, source, prefix_only=prefix_only), None, batch_size=2, beam_size=3,
                max_length=max_length,
            ),
            autograph=False,
        )()  # fmt: skip
        np.testing.assert_array_equal(cached[0].numpy(), full[0].numpy(), err_msg=str(prefix_only))
        np.testing.assert_allclose(cached[1].numpy(), full[1].numpy(), atol=1e-4)
    assert not np.isin(cached[0].numpy(), [BOS_ID]).any()  # the adapters forbid BOS (and PAD before EOS)


def test_growing_cache_equals_fixed_buffer(model):
    """decode_step(growing=True) over the filled prefix == the fixed max_length buffer, and the cache grows."""
    source = tf.constant([[5, 9, 12, 7, EOS_ID], [6, 8, EOS_ID, PAD_ID, PAD_ID]])
    tokens = tf.constant([[BOS_ID, 7, 9, 11, 4], [BOS_ID, 5, 5, 20, 3]])
    memory = model.encode(source)
    fixed, growing = model.init_cache(source, memory, 6), model.init_cache(source, memory, 6, growing=True)
    step = tf.function(model.decode_step, autograph=False, reduce_retracing=True)
    for i in range(5):
        expected, fixed = model.decode_step(tokens[:, i], fixed, i)
        logits, growing = step(tokens[:, i], growing, tf.constant(i), growing=True)
        assert [c["k"].shape for c in growing["self"]] == [(2, 2, i + 1, 8)]
        np.testing.assert_allclose(logits.numpy(), expected.numpy(), atol=1e-5)
    assert step.experimental_get_tracing_count() <= 2  # the empty cache, then any length


@pytest.mark.parametrize("beam", [1, 3])
def test_decode_batch_compacted_equals_static_and_xla(beam, model):
    """decode_batch as the Translator runs it without XLA (growing cache, finished sentences dropped) == its static
    form (fixed buffers, every sentence to the end) == that form under XLA; the limits end sentences at different
    steps (an untrained model rarely emits EOS), 0 included."""
    source = tf.constant(
        [[5, 9, 12, 7, EOS_ID], [6, 8, EOS_ID, 0, 0], [4, EOS_ID, 0, 0, 0], [9, 9, EOS_ID, 0, 0]]
    )
    limits = tf.constant([4, 1, 0, 6], tf.int32)

    def decode(static_shapes, jit_compile=False):
        function = lambda s, lim: decode_batch(  # noqa: E731
            model, s, lim, max_length=8, beam_size=beam, alpha=0.6, static_shapes=static_shapes
        )
        return tf.function(function, autograph=False, jit_compile=jit_compile)(source, limits)

    compacted, static, xla = decode(False), decode(True), decode(True, jit_compile=True)
    lengths = (compacted[0].numpy()[:, 0] != PAD_ID).sum(axis=1)
    np.testing.assert_array_equal(lengths, limits.numpy() + 1)  # each ended at its own limit, EOS included
    for other, atol in ((static, 1e-5), (xla, 1e-4)):
        np.testing.assert_array_equal(compacted[0].numpy(), other[0].numpy())
        np.testing.assert_allclose(compacted[1].numpy(), other[1].numpy(), atol=atol)
