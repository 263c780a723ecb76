"""FusedAdam against Keras' own Adam: the same variables after several steps, dense and embedding gradients, in a
tf.function, with a schedule and EMA; checkpoints of one load in the other.

An embedding's gradient (IndexedSlices with repeated rows) is summed per row before the update, in both runs:
Keras' Adam squares the slices apart for its second moment (the sum of squares of a row's pieces, not the square
of the row's gradient), so the reference is given the dense sum."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from nmt.optimizer import FusedAdam
from nmt.schedule import WarmupInverseSqrt

STEPS = 6


def _variables():
    rng = np.random.RandomState(0)
    return [
        keras.Variable(rng.randn(5, 3).astype(np.float32), name="kernel"),
        keras.Variable(rng.randn(3).astype(np.float32), name="bias"),
        keras.Variable(rng.randn(7, 3).astype(np.float32), name="embeddings"),
    ]


def _gradients(step):
    rng = np.random.RandomState(100 + step)
    embedding_rows = tf.IndexedSlices(  # what an embedding lookup's gradient is: rows, some repeated
        tf.constant(rng.randn(4, 3).astype(np.float32)), tf.constant([1, 4, 1, 6]), tf.constant([7, 3])
    )
    return [
        tf.constant(rng.randn(5, 3).astype(np.float32)),
        tf.constant(rng.randn(3).astype(np.float32)),
        embedding_rows,
    ]


def _train(optimizer, *, compiled, dense=False):
    variables = _variables()
    optimizer.build(variables)

    def apply(step):
        gradients = _gradients(step)
        optimizer.apply([tf.convert_to_tensor(g) for g in gradients] if dense else gradients, variables)

    for step in range(STEPS):
        (tf.function(apply) if compiled else apply)(step)
    return variables, optimizer


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(learning_rate=0.01),
        dict(learning_rate=0.01, beta_1=0.9, beta_2=0.98, epsilon=1e-9, use_ema=True, ema_momentum=0.9),
    ],
)
def test_same_variables_as_keras_adam(kwargs, compiled):
    ours, our_optimizer = _train(FusedAdam(**kwargs), compiled=compiled)
    reference, keras_optimizer = _train(keras.optimizers.Adam(**kwargs), compiled=compiled, dense=True)
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7, err_msg=a.name)
        assert not np.array_equal(a.numpy(), _variables()[[v.name for v in ours].index(a.name)].numpy())
    if kwargs.get(
        "use_ema"
    ):  # the moving averages too (what finalize_variable_values writes into the weights)
        initial = _variables()
        averages = zip(
            our_optimizer._model_variables_moving_average, keras_optimizer._model_variables_moving_average
        )
        for (a, b), start in zip(averages, initial):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7, err_msg=f"EMA of {a.name}")
            assert not np.array_equal(a.numpy(), start.numpy())


def test_with_a_learning_rate_schedule():
    schedule = WarmupInverseSqrt(0.01, warmup_steps=3)
    ours, optimizer = _train(FusedAdam(learning_rate=schedule), compiled=True)
    reference, _ = _train(
        keras.optimizers.Adam(learning_rate=WarmupInverseSqrt(0.01, warmup_steps=3)),
        compiled=True,
        dense=True,
    )
    assert int(optimizer.iterations.numpy()) == STEPS
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_checkpoints_load_across_the_two_classes(tmp_path):
    ours, optimizer = _train(FusedAdam(learning_rate=0.01), compiled=False)
    assert [v.path for v in optimizer.variables] == [
        v.path
        for v in _train(keras.optimizers.Adam(learning_rate=0.01, name="adam"), compiled=False)[1].variables
    ]
    path = tf.train.Checkpoint(optimizer=optimizer).write(str(tmp_path / "ckpt"))
    fresh = keras.optimizers.Adam(learning_rate=0.01)
    fresh.build(_variables())
    tf.train.Checkpoint(optimizer=fresh).read(path).assert_consumed()
    for a, b in zip(optimizer.variables, fresh.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_repeated_embedding_rows_are_summed_before_the_update():
    ours, _ = _train(FusedAdam(learning_rate=0.01), compiled=False)
    dense, _ = _train(FusedAdam(learning_rate=0.01), compiled=False, dense=True)
    for a, b in zip(ours, dense):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_amsgrad_keeps_the_keras_update():
    ours, _ = _train(FusedAdam(learning_rate=0.01, amsgrad=True), compiled=False)
    reference, _ = _train(keras.optimizers.Adam(learning_rate=0.01, amsgrad=True), compiled=False)
    for a, b in zip(ours, reference):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
