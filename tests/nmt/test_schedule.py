"""The learning-rate schedules against NumPy: Vaswani et al. (2017), eq. 3, and the decays to a floor at the planned
last step; the rule that scales the peak with the global batch."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from nmt.schedule import WarmupDecay, WarmupInverseSqrt, make_schedule, scaled_learning_rate


def vaswani(step: np.ndarray, d_model: int, warmup: int) -> np.ndarray:
    """lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5), step_num counting from 1."""
    step = np.asarray(step, dtype=np.float64)
    return d_model**-0.5 * np.minimum(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize(("d_model", "warmup"), [(512, 4000), (256, 4000), (32, 10)])
def test_values_match_the_paper_with_its_peak(d_model, warmup):
    peak = (d_model * warmup) ** -0.5  # the paper's schedule reaches this at step_num == warmup
    schedule = WarmupInverseSqrt(peak, warmup)
    steps = np.array(
        [1, 2, warmup // 2, warmup - 1, warmup, warmup + 1, 2 * warmup, 10 * warmup, 100 * warmup]
    )
    # The schedule is called with the optimizer's iteration count, which is step_num - 1.
    got = np.array([float(schedule(s - 1)) for s in steps])
    np.testing.assert_allclose(got, vaswani(steps, d_model, warmup), rtol=1e-6)
    assert float(schedule(warmup - 1)) == pytest.approx(peak, rel=1e-6)  # the maximum, at the warmup boundary
    assert np.argmax(got) == list(steps).index(warmup)


def test_any_peak_scales_the_same_shape():
    warmup, peak = 100, 7e-4
    steps = np.arange(1, 1001)
    got = np.array([float(WarmupInverseSqrt(peak, warmup)(s - 1)) for s in steps])
    want = peak * np.where(steps <= warmup, steps / warmup, np.sqrt(warmup / steps))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_no_warmup_decays_from_the_first_step():
    got = [float(WarmupInverseSqrt(1e-3, 0)(s - 1)) for s in (1, 4, 100)]
    np.testing.assert_allclose(got, [1e-3, 1e-3 / 2, 1e-3 / 10], rtol=1e-6)


def test_adam_uses_the_value_of_its_step_number():
    """Adam's first update is lr(step 1) * sign(g) (bias-corrected moments), its second lr(step 2) * sign(g)."""
    warmup, peak = 10, 0.1
    schedule = WarmupInverseSqrt(peak, warmup)
    variable = keras.Variable(np.zeros(3, np.float32))
    optimizer = keras.optimizers.Adam(learning_rate=schedule, epsilon=1e-12)
    grad = np.array([0.5, -2.0, 3.0], np.float32)
    optimizer.apply([grad], [variable])
    first = -np.asarray(variable.numpy())
    optimizer.apply([grad], [variable])
    second = -np.asarray(variable.numpy()) - first
    np.testing.assert_allclose(first, peak / warmup * np.sign(grad), rtol=1e-4)  # float32 subtraction
    np.testing.assert_allclose(second, peak * 2 / warmup * np.sign(grad), rtol=1e-4)  # float32 subtraction


def test_round_trips_through_keras_serialization():
    schedule = WarmupInverseSqrt(3e-4, 123)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(restored, WarmupInverseSqrt)
    assert (restored.peak, restored.warmup_steps) == (3e-4, 123)
    assert float(restored(500)) == float(schedule(500))


# ----------------------------------------------------------------------------------------------------------------
# Warmup, then a decay to a floor at the planned last step (train.schedule: linear | cosine)


def decay_reference(steps, peak, warmup, total, floor, kind, decided_at=0):
    """NumPy: peak * step / warmup, then from max(warmup, decided_at) a linear or cosine decay to floor * peak at
    `total`, the floor after it; total == 0 (not planned yet): the peak after the warmup."""
    steps = np.asarray(steps, dtype=np.float64)
    start = max(warmup, decided_at)
    progress = np.clip((steps - start) / max(total - start, 1), 0.0, 1.0)
    shape = 1 - progress if kind == "linear" else (1 + np.cos(np.pi * progress)) / 2
    after = peak * (floor + (1 - floor) * shape) if total else np.full_like(steps, peak)
    return np.where(steps < warmup, peak * steps / max(warmup, 1), after)


def values(schedule, steps):
    return np.array([float(schedule(s - 1)) for s in steps])  # called with the iteration count, step - 1


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_decay_reaches_the_floor_at_the_planned_step(kind):
    peak, warmup, total, floor = 2e-3, 10, 100, 0.1
    steps = np.arange(1, 131)
    got = values(WarmupDecay(peak, warmup, kind, floor, total), steps)
    np.testing.assert_allclose(got, decay_reference(steps, peak, warmup, total, floor, kind), rtol=1e-5)
    # The landmarks, by hand: the warmup is inverse_sqrt's, the peak at the end of warmup, the floor at `total`.
    inverse_sqrt = values(WarmupInverseSqrt(peak, warmup), steps)
    np.testing.assert_allclose(got[:warmup], inverse_sqrt[:warmup], rtol=1e-6)
    assert got[warmup - 1] == pytest.approx(peak, rel=1e-6)
    assert got[total - 1] == pytest.approx(floor * peak, rel=1e-5)
    np.testing.assert_allclose(got[total:], floor * peak, rtol=1e-5)  # past the plan: the floor
    assert np.all(np.diff(got[warmup - 1 : total]) < 0)  # decreasing all the way
    halfway = got[warmup - 1 + (total - warmup) // 2]
    assert halfway == pytest.approx(peak * (floor + (1 - floor) / 2), rel=1e-5)  # both shapes: the midpoint


def test_undecided_plan_is_warmup_then_peak_and_follows_the_variables():
    """The plan lives in variables: the schedule (and a compiled function that calls it) sees their new values."""
    total, decided_at = tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64)
    schedule = WarmupDecay(1e-3, 4, "linear", 0.0, total, decided_at)
    steps = np.arange(1, 41)
    np.testing.assert_allclose(values(schedule, steps), np.minimum(steps / 4, 1) * 1e-3, rtol=1e-6)
    compiled = tf.function(lambda step: schedule(step))
    before = float(compiled(tf.constant(19, tf.int64)))
    # Decided at step 12 (after the warmup) for 30 steps: the decay starts at 12, continuously from the peak.
    total.assign(30)
    decided_at.assign(12)
    want = decay_reference(steps, 1e-3, 4, 30, 0.0, "linear", decided_at=12)
    np.testing.assert_allclose(values(schedule, steps), want, rtol=1e-5, atol=1e-12)
    assert before == pytest.approx(1e-3) and float(compiled(tf.constant(19, tf.int64))) == pytest.approx(
        want[19]
    )
    assert float(schedule(11)) == pytest.approx(1e-3) and float(schedule(29)) == 0.0  # steps 12 and 30


def test_make_schedule_keeps_inverse_sqrt_unchanged():
    schedule = make_schedule("inverse_sqrt", 1e-3, 40, floor=0.5, total_steps=100)
    assert type(schedule) is WarmupInverseSqrt and (schedule.peak, schedule.warmup_steps) == (1e-3, 40)
    assert isinstance(make_schedule("cosine", 1e-3, 40, total_steps=100), WarmupDecay)


def test_decay_round_trips_through_keras_serialization():
    schedule = WarmupDecay(3e-4, 12, "cosine", 0.2, tf.Variable(90, dtype=tf.int64), 5)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(restored, WarmupDecay)
    assert float(restored(50)) == pytest.approx(float(schedule(50)), rel=1e-7)


@pytest.mark.parametrize(
    ("rule", "global_tokens", "reference", "want"),
    [
        ("sqrt", 4096, 1024, 2e-3),  # 4x the batch: 2x the learning rate (Adam)
        ("sqrt", 512, 2048, 0.5e-3),
        ("linear", 4096, 1024, 4e-3),
        ("none", 4096, 1024, 1e-3),
        ("sqrt", 1024, 1024, 1e-3),
    ],
)
def test_learning_rate_scaling_rules(rule, global_tokens, reference, want):
    assert scaled_learning_rate(1e-3, global_tokens, reference, rule) == pytest.approx(want, rel=1e-12)
