"""The C++ optimizer update (NmtApplyAdam, nmt/kernels/adam.cc) against TensorFlow's Mul and ResourceApplyAdam bit
for bit and against float64 NumPy; `FusedAdam.apply_scaled` on it against Keras' path; its refusals."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from nmt.optimizer import FusedAdam

SHAPES = [(7,), (300, 256), (1,), (33, 5), (40_000,), (0, 3)]
# Keras' EMA cannot add to a (0, 3) variable (its add turns into a BiasAdd): the optimizer tests leave it out
KERAS_SHAPES = SHAPES[:-1]
BETA1, BETA2, EPSILON, LR = 0.9, 0.98, 1e-9, 1e-3


def _variables(seed):
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.normal(size=s).astype(np.float32)) for s in SHAPES]


def _slots():
    return [tf.Variable(tf.zeros(s)) for s in SHAPES], [tf.Variable(tf.zeros(s)) for s in SHAPES]


def _numpy_adam(var, m, v, grad, factor, step):
    """One Adam step in float64, TensorFlow's formula."""
    g = grad.astype(np.float64) * factor
    m = m + (g - m) * (1 - BETA1)
    v = v + (g * g - v) * (1 - BETA2)
    alpha = LR * np.sqrt(1 - BETA2**step) / (1 - BETA1**step)
    return var - m * alpha / (np.sqrt(v) + EPSILON), m, v


def test_apply_adam_is_tensorflows_mul_and_resource_apply_adam_bit_for_bit_and_float64_numpy(ops):
    rng = np.random.default_rng(1)
    ours, (our_m, our_v) = _variables(0), _slots()
    theirs, (their_m, their_v) = _variables(0), _slots()
    reference = [(w.numpy().astype(np.float64), 0.0, 0.0) for w in ours]
    for step in range(1, 4):
        grads = [tf.constant(rng.normal(size=s).astype(np.float32) * 10) for s in SHAPES]
        factor = tf.constant(0.0123 * step, tf.float32)
        powers = dict(
            beta1_power=tf.constant(BETA1**step, tf.float32), beta2_power=tf.constant(BETA2**step, tf.float32)
        )
        scalars = dict(lr=LR, beta1=BETA1, beta2=BETA2, epsilon=EPSILON, **powers)
        for w, m, v, g in zip(theirs, their_m, their_v, grads):
            tf.raw_ops.ResourceApplyAdam(var=w.handle, m=m.handle, v=v.handle, grad=g * factor, **scalars)
        # a read that holds the old buffer: updated in place, it would change under the reader
        held = ours[1].read_value()
        held_before = held.numpy().copy()
        ops.nmt_apply_adam(
            var=[w.handle for w in ours],
            m=[m.handle for m in our_m],
            v=[v.handle for v in our_v],
            grad=grads,
            factor=factor,
            **scalars,
        )
        np.testing.assert_array_equal(held.numpy(), held_before)
        for a, b in zip(ours + our_m + our_v, theirs + their_m + their_v):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        reference = [
            _numpy_adam(w, m, v, g.numpy(), float(factor.numpy()), step)
            for (w, m, v), g in zip(reference, grads)
        ]
    for w, (expected, _, _) in zip(ours, reference):
        np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6, atol=1e-6)
    assert not np.array_equal(ours[1].numpy(), _variables(0)[1].numpy())


def test_apply_adam_refuses_a_mismatched_gradient_a_non_scalar_and_a_variable_twice(ops):
    w, (m, v) = [tf.Variable(tf.ones([4]))], ([tf.Variable(tf.zeros([4]))], [tf.Variable(tf.zeros([4]))])
    handles = dict(var=[w[0].handle], m=[m[0].handle], v=[v[0].handle])
    scalars = dict(beta1_power=0.9, beta2_power=0.98, lr=LR, beta1=BETA1, beta2=BETA2, epsilon=EPSILON)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"var\[0\] is float/\[4\], its gradient float/\[5\]"
    ):
        ops.nmt_apply_adam(grad=[tf.ones([5])], factor=1.0, **handles, **scalars)
    with pytest.raises(tf.errors.InvalidArgumentError, match="factor must be a scalar"):
        ops.nmt_apply_adam(grad=[tf.ones([4])], factor=[1.0, 2.0], **handles, **scalars)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be distinct variables, got 2"):
        ops.nmt_apply_adam(
            grad=[tf.ones([4])], factor=1.0, var=[w[0].handle], m=[m[0].handle], v=[m[0].handle], **scalars
        )
    np.testing.assert_array_equal(w[0].numpy(), np.ones(4))


def _keras_variables():
    rng = np.random.default_rng(3)
    return [
        keras.Variable(rng.normal(size=s).astype(np.float32), name=f"w{i}")
        for i, s in enumerate(KERAS_SHAPES)
    ]


def _compiled_apply(optimizer, variables, library):
    @tf.function
    def apply(grads, factor):
        optimizer.apply_scaled(grads, factor, variables, library)

    return apply


@pytest.mark.parametrize("kwargs", [dict(), dict(use_ema=True, ema_momentum=0.9), dict(amsgrad=True)])
def test_apply_scaled_on_the_kernel_equals_keras_path_on_scaled_gradients(ops, kwargs):
    """One op for all variables (ops given) or Keras' per-variable path on g * factor: the same bits."""
    runs = []
    for library in (ops, None):
        variables = _keras_variables()
        optimizer = FusedAdam(learning_rate=LR, beta_1=BETA1, beta_2=BETA2, epsilon=EPSILON, **kwargs)
        optimizer.build(variables)
        rng = np.random.default_rng(4)

        apply = _compiled_apply(optimizer, variables, library)
        for step in range(3):
            grads = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in KERAS_SHAPES]
            apply(grads, tf.constant(0.5 + step, tf.float32))
        ops_used = {
            op.type for op in apply.get_concrete_function(grads, tf.constant(1.0)).graph.get_operations()
        }
        runs.append((variables, optimizer, ops_used))
    (ours, our_optimizer, our_ops), (theirs, their_optimizer, their_ops) = runs
    assert ("NmtApplyAdam" in our_ops) == (not kwargs.get("amsgrad")) and "NmtApplyAdam" not in their_ops
    assert our_optimizer.fuses(ours) == (not kwargs.get("amsgrad"))
    assert int(our_optimizer.iterations.numpy()) == int(their_optimizer.iterations.numpy()) == 3
    for a, b in zip(ours + our_optimizer.variables, theirs + their_optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    assert not np.array_equal(ours[1].numpy(), _keras_variables()[1].numpy())


def test_apply_scaled_on_mirrored_variables_keeps_keras_per_replica_update(ops):
    """Variables of a MirroredStrategy, updated as the trainer does, outside its scope: Keras' per-variable update of
    every copy, not one op on the first copy (one device here: the variables are mirrored all the same;
    tests/nmt/test_distribute.py trains on two)."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        variables = _keras_variables()
        optimizer = FusedAdam(learning_rate=LR)
        optimizer.build(variables)
    grads = [tf.ones(s) for s in KERAS_SHAPES]
    apply = _compiled_apply(optimizer, variables, ops)
    apply(grads, tf.constant(2.0))
    assert "NmtApplyAdam" not in {
        op.type for op in apply.get_concrete_function(grads, tf.constant(2.0)).graph.get_operations()
    }
    assert not optimizer.fuses(variables)
    reference = _keras_variables()
    plain = FusedAdam(learning_rate=LR)
    plain.build(reference)
    plain.apply([g * 2.0 for g in grads], reference)
    for a, b in zip(variables, reference):
        for copy in a.value.values:
            np.testing.assert_array_equal(copy.numpy(), b.numpy())
