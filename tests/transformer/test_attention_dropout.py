"""Attention dropout draws from a checkpointable Keras seed state, so resumed training repeats no masks."""

import numpy as np
import pytest
import tensorflow as tf

from transformer.multi_head import MultiHeadAttention


@pytest.mark.parametrize("attention", ["full", "chunked", "local"])
def test_restoring_the_seed_state_reproduces_the_next_dropout_masks(attention):
    layer = MultiHeadAttention(
        d_model=16, num_heads=2, dropout=0.5, attention=attention, chunk_size=4, window=2
    )
    x = tf.random.normal((2, 8, 16), seed=1)
    first = layer(x, x, x, training=True)[0].numpy()
    state = [layer.seed_generator.state.numpy()]
    second = layer(x, x, x, training=True)[0].numpy()
    assert not np.array_equal(first, second)  # dropout is on and draws new masks each call
    layer.seed_generator.state.assign(state[0])  # what restoring a checkpoint does
    np.testing.assert_array_equal(layer(x, x, x, training=True)[0].numpy(), second)
    np.testing.assert_array_equal(layer(x, x, x, training=False)[0].numpy(), layer(x, x, x)[0].numpy())


def test_seed_state_is_a_model_variable_but_not_a_weight():
    layer = MultiHeadAttention(d_model=16, num_heads=2, dropout=0.1)
    x = tf.zeros((1, 3, 16))
    layer(x, x, x)
    weight_ids = {id(w) for w in layer.weights}
    extra = [
        v for v in layer.variables if id(v) not in weight_ids
    ]  # what the trainer checkpoints as rng_state
    assert [v.path for v in extra] == [layer.seed_generator.state.path]
    assert MultiHeadAttention(d_model=16, num_heads=2).seed_generator is None  # no dropout, no state
