"""The learning-rate schedule against the formula of Vaswani et al. (2017), eq. 3, written in NumPy."""

import keras
import numpy as np
import pytest

from nmt.schedule import WarmupInverseSqrt


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
