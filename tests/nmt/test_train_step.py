"""The optimizer step: token normalisation, accumulation, global clipping, loss scaling and skipped steps."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from nmt.config import ModelConfig
from nmt.losses import smoothed_cross_entropy
from nmt.train_step import INITIAL_LOSS_SCALE, TrainStep
from transformer.model import build_model
from transformer.vocab import PAD_ID

VOCAB = 40


def tiny_model():
    config = ModelConfig(d_model=16, num_heads=2, d_ff=32, num_layers=1, dropout=0.0, max_length=32)
    return build_model(config, VOCAB, VOCAB)


def batch(seed, batch_size=3, length=7, pad_tail=2):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, VOCAB, size=(batch_size, length)).astype(np.int32)
    ids[0, length - pad_tail :] = PAD_ID
    target = rng.integers(4, VOCAB, size=(batch_size, length)).astype(np.int32)
    target[1, length - pad_tail :] = PAD_ID
    return {"source": tf.constant(ids), "target_in": tf.constant(target), "target_out": tf.constant(target)}


def make_step(model, *, clipnorm=0.0, loss_scaling=False, learning_rate=1e-3, jit_compile=False):
    optimizer = keras.optimizers.SGD(learning_rate=learning_rate)
    optimizer.build(model.trainable_variables)
    return TrainStep(
        model=model,
        optimizer=optimizer,
        strategy=tf.distribute.get_strategy(),
        label_smoothing=0.0,
        clipnorm=clipnorm,
        loss_scaling=loss_scaling,
        jit_compile=jit_compile,
        loss_normaliser=64.0,
    )


def reference_gradients(model, batches):
    """Gradients of (summed loss over all batches) / (all non-pad target tokens), straight from GradientTape."""
    with tf.GradientTape() as tape:
        total, tokens = 0.0, 0.0
        for b in batches:
            logits = model({"source": b["source"], "target_in": b["target_in"]}, training=False)
            loss_sum, _, n = smoothed_cross_entropy(logits, b["target_out"])
            total, tokens = total + loss_sum, tokens + n
        loss = total / tokens
    return tape.gradient(loss, model.trainable_variables), float(loss)


def weights(model):
    return [w.numpy().copy() for w in model.trainable_variables]


def test_accumulated_step_equals_one_big_batch_normalised_by_true_tokens():
    model = tiny_model()
    batches = [batch(1), batch(2, batch_size=2, length=5, pad_tail=3)]
    expected_grads, expected_loss = reference_gradients(model, batches)
    before = weights(model)
    step = make_step(model, learning_rate=0.5)
    metrics = step.step(batches)
    assert bool(metrics["applied"])
    np.testing.assert_allclose(float(metrics["loss"]), expected_loss, rtol=1e-5)
    for old, new, grad in zip(before, weights(model), expected_grads):
        np.testing.assert_allclose(new, old - 0.5 * grad.numpy(), atol=1e-6)


def test_clipnorm_is_applied_to_the_global_unscaled_gradient():
    model = tiny_model()
    b = batch(3)
    grads, _ = reference_gradients(model, [b])
    norm = float(tf.linalg.global_norm(grads))
    clip = norm / 4
    before = weights(model)
    metrics = make_step(model, clipnorm=clip, learning_rate=1.0, loss_scaling=True).step([b])
    np.testing.assert_allclose(float(metrics["grad_norm"]), norm, rtol=1e-4)
    update = [old - new for old, new in zip(before, weights(model))]
    np.testing.assert_allclose(float(tf.linalg.global_norm(update)), clip, rtol=1e-4)
    for u, g in zip(update, grads):  # same direction, scaled by clip / norm
        np.testing.assert_allclose(u, g.numpy() * clip / norm, atol=1e-6)


def test_float16_overflow_skips_the_step_and_lowers_the_loss_scale():
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = tiny_model()
    step = make_step(model, loss_scaling=True)
    assert float(step.loss_scale.numpy()) == INITIAL_LOSS_SCALE
    step.loss_scale.assign(3e38)  # any float16 backward pass overflows at this scale
    before = weights(model)
    metrics = step.step([batch(4)])
    assert not bool(metrics["applied"])
    assert float(step.loss_scale.numpy()) == pytest.approx(1.5e38)
    assert int(step.skipped_steps.numpy()) == 1 and int(step.bad_steps.numpy()) == 1
    for old, new in zip(before, weights(model)):
        np.testing.assert_array_equal(old, new)  # weights untouched
    assert int(step.optimizer.iterations.numpy()) == 0
    step.loss_scale.assign(2.0**10)  # a sane scale: the next step applies, finite
    metrics = step.step([batch(4)])
    assert bool(metrics["applied"]) and int(step.bad_steps.numpy()) == 0
    assert all(np.isfinite(w).all() for w in weights(model))


def test_nan_loss_is_skipped_and_counted():
    model = tiny_model()
    step = make_step(model)
    b = batch(5)
    poisoned = dict(b, target_out=b["target_out"])
    before = weights(model)
    # Inject a NaN gradient through the accumulator, as a corrupted batch would produce.
    step.accumulate(poisoned)
    step.accumulators[0].assign(tf.fill(step.accumulators[0].shape, np.nan))
    metrics = step.apply()
    assert not bool(metrics["applied"])
    assert int(step.skipped_steps.numpy()) == 1
    for old, new in zip(before, weights(model)):
        np.testing.assert_array_equal(old, new)
    assert float(tf.reduce_sum(tf.abs(step.accumulators[0]))) == 0.0  # accumulators reset for the next step


def test_xla_step_matches_eager_reference_and_counts_compilations():
    model = tiny_model()
    b = batch(6)
    grads, loss = reference_gradients(model, [b])
    before = weights(model)
    step = make_step(model, learning_rate=0.1, jit_compile=True)
    metrics = step.step([b])
    np.testing.assert_allclose(float(metrics["loss"]), loss, rtol=1e-5)
    for old, new, grad in zip(before, weights(model), grads):
        np.testing.assert_allclose(new, old - 0.1 * grad.numpy(), atol=1e-5)
    step.step([batch(7)])  # same shape: no new compilation
    assert step.num_traces == 1
    step.step([batch(8, length=9)])
    assert step.num_traces == 2


def test_switching_xla_on_retraces_only_the_gradients_and_keeps_training_the_same():
    switched, plain = tiny_model(), tiny_model()
    plain.set_weights(switched.get_weights())
    step, reference = make_step(switched, learning_rate=0.1), make_step(plain, learning_rate=0.1)
    step.step([batch(9)])
    reference.step([batch(9)])
    apply_function = step.apply
    step.set_jit_compile(True)
    assert step.jit_compile and step.apply is apply_function  # the optimizer update is not traced again
    got = step.step([batch(10)])
    want = reference.step([batch(10)])
    assert step.num_traces == 2  # one trace without XLA, one XLA compilation
    np.testing.assert_allclose(float(got["loss"]), float(want["loss"]), rtol=1e-5)
    for new, old in zip(weights(switched), weights(plain)):
        np.testing.assert_allclose(new, old, atol=1e-5)
