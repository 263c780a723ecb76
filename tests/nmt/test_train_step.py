"""The optimizer step: token normalisation, accumulation, global clipping, loss scaling and skipped steps."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from nmt.config import ModelConfig
from nmt.train_step import INITIAL_LOSS_SCALE, LOSS_SCALE_GROWTH_STEPS, TrainStep
from transformer.model import build_model
from transformer.vocab import PAD_ID, UNK_ID

VOCAB = 40


def tiny_model(**overrides):
    config = ModelConfig(
        **{
            "d_model": 16,
            "num_heads": 2,
            "d_ff": 32,
            "num_layers": 1,
            "dropout": 0.0,
            "max_length": 32,
            **overrides,
        }
    )
    return build_model(config, VOCAB, VOCAB)


def batch(seed, batch_size=3, length=7, pad_tail=2):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, VOCAB, size=(batch_size, length)).astype(np.int32)
    ids[0, length - pad_tail :] = PAD_ID
    target = rng.integers(4, VOCAB, size=(batch_size, length)).astype(np.int32)
    target[1, length - pad_tail :] = PAD_ID
    return {"source": tf.constant(ids), "target_in": tf.constant(target), "target_out": tf.constant(target)}


def make_step(
    model,
    *,
    clipnorm=0.0,
    loss_scaling=False,
    learning_rate=1e-3,
    jit_compile=False,
    optimizer=None,
    label_smoothing=0.0,
    **kwargs,
):
    optimizer = optimizer or keras.optimizers.SGD(learning_rate=learning_rate)
    optimizer.build(model.trainable_variables)
    return TrainStep(
        model=model,
        optimizer=optimizer,
        strategy=tf.distribute.get_strategy(),
        label_smoothing=label_smoothing,
        clipnorm=clipnorm,
        loss_scaling=loss_scaling,
        jit_compile=jit_compile,
        loss_normaliser=64.0,
        **kwargs,
    )


def plain_loss_sums(logits, labels, eps=0.0):
    """(smoothed loss, tokens) summed over non-pad positions, by autodiff-able TF ops independent of nmt.losses."""
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    q = (1.0 - eps) * tf.one_hot(labels, VOCAB) + eps / VOCAB
    weights = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    return -tf.reduce_sum(tf.reduce_sum(q * log_probs, axis=-1) * weights), tf.reduce_sum(weights)


def reference_gradients(model, batches, eps=0.0):
    """Gradients of (summed loss over all batches) / (all non-pad target tokens), straight from GradientTape
    (label smoothing `eps`)."""
    with tf.GradientTape() as tape:
        total, tokens = 0.0, 0.0
        for b in batches:
            logits = model({"source": b["source"], "target_in": b["target_in"]}, training=False)
            loss_sum, n = plain_loss_sums(logits, b["target_out"], eps)
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


def test_clipnorm_is_applied_to_the_global_unscaled_gradient_and_layer_norms_are_of_it_unclipped():
    """Clipping by the global norm of the real (unscaled) gradient; the per-layer norms are those of the same
    gradient before clipping (the root of the sum of their squares is grad_norm)."""
    model = tiny_model()
    b = batch(3)
    grads, _ = reference_gradients(model, [b])
    groups = {}
    for variable, grad in zip(model.trainable_variables, grads):
        # below the model's name (transformer, transformer_1...): the layer
        name = variable.path.split("/")[1]
        groups.setdefault(name, []).append(np.asarray(tf.convert_to_tensor(grad), np.float64).ravel())
    want = {name: float(np.linalg.norm(np.concatenate(parts))) for name, parts in groups.items()}
    assert want.keys() == {"source_embedding", "encoder_layer_0", "decoder_layer_0"}
    norm = float(tf.linalg.global_norm(grads))
    assert float(np.sqrt(sum(v**2 for v in want.values()))) == pytest.approx(norm, rel=1e-5)
    clip = norm / 4
    before = weights(model)
    step = make_step(model, clipnorm=clip, learning_rate=1.0, loss_scaling=True)
    metrics = step.step([b])
    np.testing.assert_allclose(float(metrics["grad_norm"]), norm, rtol=1e-4)
    update = [old - new for old, new in zip(before, weights(model))]
    np.testing.assert_allclose(float(tf.linalg.global_norm(update)), clip, rtol=1e-4)
    for u, g in zip(update, grads):  # same direction, scaled by clip / norm
        np.testing.assert_allclose(u, g.numpy() * clip / norm, atol=1e-6)
    assert "layer_grad_norms" not in metrics  # grouped only when asked, by the steps that log them
    got = step.layer_grad_norms(metrics)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-4), name


def test_float16_overflow_skips_the_step_and_lowers_the_loss_scale():
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = tiny_model()
    step = make_step(model, loss_scaling=True)
    assert float(step.loss_scale.numpy()) == INITIAL_LOSS_SCALE
    assert step.loss_scale_growth_steps == LOSS_SCALE_GROWTH_STEPS == 2000  # the default growth interval
    with pytest.raises(ValueError, match="loss_scale_growth_steps"):
        make_step(model, loss_scaling=True, loss_scale_growth_steps=0)
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


def poisonable_model():
    """A model whose source embedding of UNK_ID overflows float32 in the forward pass (x * sqrt(d_model)).

    The tiny batches never contain UNK_ID; `poisoned(batch)` puts one in, so that batch, and only it, yields a real
    non-finite loss and gradient. Source and target embeddings are separate (and the output projection untied), so
    the huge row is read only through the source of a poisoned batch; it stays finite itself.
    """
    model = tiny_model(share_embeddings=False, tie_output=False)
    table = model.source_embedding.token_embedding.embeddings
    table.assign(tf.tensor_scatter_nd_update(table, [[UNK_ID]], tf.fill([1, table.shape[1]], 3e38)))
    return model


def poisoned(b):
    source = b["source"].numpy().copy()
    source[0, 0] = UNK_ID
    return dict(b, source=tf.constant(source))


def state(step):
    """Every variable an update may change: weights, optimizer state (Adam moments, iterations), as arrays."""
    return [v.numpy().copy() for v in step.variables] + [v.numpy().copy() for v in step.optimizer.variables]


def test_a_nonfinite_step_is_skipped_exactly_and_the_loss_scale_halves_and_doubles_after_n_finite_steps():
    """A poisoned batch (a real non-finite loss and gradient) skips the update bit for bit (weights, Adam moments,
    iterations), leaks nothing into the next step, and halves the loss scale (never below 1); the scale doubles
    after exactly `loss_scale_growth_steps` finite steps in a row, and a skipped step or a doubling restarts that
    count."""
    model = poisonable_model()
    adam = keras.optimizers.Adam(learning_rate=1e-2)
    step = make_step(model, optimizer=adam, clipnorm=1.0, loss_scaling=True, loss_scale_growth_steps=3)

    def run(b):
        applied = bool(step.step([b])["applied"])
        return applied, float(step.loss_scale.numpy()), int(step.good_steps.numpy())

    s = INITIAL_LOSS_SCALE
    assert [run(batch(i)) for i in range(7)] == [
        (True, s, 1), (True, s, 2), (True, 2 * s, 0),  # the 3rd finite step doubles and restarts the count
        (True, 2 * s, 1), (True, 2 * s, 2), (True, 4 * s, 0),
        (True, 4 * s, 1),
    ]  # fmt: skip
    assert int(adam.iterations.numpy()) == 7  # Adam moments are non-zero from here on

    before = state(step)
    metrics = step.step([poisoned(batch(7))])
    assert not np.isfinite(float(metrics["loss"])) and not np.isfinite(float(metrics["grad_norm"]))
    assert not bool(metrics["applied"])
    assert (float(step.loss_scale.numpy()), int(step.good_steps.numpy())) == (2 * s, 0)  # halved, restarted
    assert int(step.skipped_steps.numpy()) == 1 and int(step.bad_steps.numpy()) == 1
    assert int(adam.iterations.numpy()) == 7
    after = state(step)
    assert len(after) == len(before) > 2 * len(step.variables)  # the moments are compared too
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)  # bit for bit: weights, m, v, iterations
    assert not any(np.any(a.numpy()) for a in step.accumulators)  # nothing leaks into the next step
    assert not np.any(step.sums.numpy())

    metrics = step.step([batch(7)])  # the same batch, clean: applies
    assert bool(metrics["applied"]) and np.isfinite(float(metrics["loss"]))
    assert int(step.bad_steps.numpy()) == 0 and int(step.skipped_steps.numpy()) == 1
    assert int(adam.iterations.numpy()) == 8
    assert all(np.isfinite(v).all() for v in state(step))
    assert all(not np.array_equal(old, new) for old, new in zip(before, state(step)[: len(step.variables)]))
    assert (float(step.loss_scale.numpy()), int(step.good_steps.numpy())) == (2 * s, 1)
    assert [run(batch(i)) for i in range(8, 10)] == [(True, 2 * s, 2), (True, 4 * s, 0)]

    step.loss_scale.assign(3.0)
    assert run(poisoned(batch(11))) == (False, 1.5, 0)
    assert run(poisoned(batch(12))) == (False, 1.0, 0)  # floor: max(0.75, 1)
    assert run(poisoned(batch(13))) == (False, 1.0, 0)
    assert int(step.skipped_steps.numpy()) == 4 and int(step.bad_steps.numpy()) == 3
    assert run(batch(14)) == (True, 1.0, 1)
    table = model.source_embedding.token_embedding.embeddings.numpy()
    assert np.all(table[UNK_ID] == np.float32(3e38))  # unused by clean batches: zero gradient, no Adam update


def test_a_nonfinite_float32_step_without_loss_scaling_is_skipped_exactly():
    """The float32 path (no loss scale: its own branches of the update) skips a poisoned batch bit for bit too."""
    model = poisonable_model()
    adam = keras.optimizers.Adam(learning_rate=1e-2)
    step = make_step(model, optimizer=adam, clipnorm=1.0)
    assert bool(step.step([batch(5)])["applied"])  # Adam moments are non-zero from here on
    before = state(step)
    assert not bool(step.step([poisoned(batch(6))])["applied"])
    assert int(step.skipped_steps.numpy()) == 1 and int(adam.iterations.numpy()) == 1
    after = state(step)
    assert len(after) == len(before) > 2 * len(step.variables)  # the moments are compared too
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)  # bit for bit: weights, m, v, iterations
    assert bool(step.step([batch(6)])["applied"]) and int(adam.iterations.numpy()) == 2


# ~10 s; make test keeps the XLA step against the eager reference (test_loss_on_real_tokens..., jit_compile True)
@pytest.mark.slow
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


def test_one_micro_batch_skips_the_accumulators_and_updates_bit_for_bit_like_them():
    direct, accumulated = tiny_model(), tiny_model()
    accumulated.set_weights(direct.get_weights())
    one, two = (
        make_step(m, optimizer=keras.optimizers.Adam(1e-2), clipnorm=0.5, label_smoothing=0.1)
        for m in (direct, accumulated)
    )
    b = batch(20)
    grads, sums = one.gradients(b)  # what step([b]) hands to the update
    two.accumulate(b)
    for grad, accumulator in zip(grads, two.accumulators, strict=True):
        np.testing.assert_array_equal(grad.numpy(), accumulator.numpy())
    np.testing.assert_array_equal(sums.numpy(), two.sums.numpy())
    two.apply()
    one.update(grads, sums)
    for i in range(21, 24):  # Adam moments and clipping carry the state on: any difference would grow
        got = one.step([batch(i)])
        two.accumulate(batch(i))
        want = two.apply()
        for key in ("loss", "nll", "tokens", "grad_norm"):
            assert float(got[key]) == float(want[key]), key
    for new, old in zip(state(one), state(two), strict=True):
        np.testing.assert_array_equal(new, old)
    assert one.accumulate.experimental_get_tracing_count() == 0  # no accumulator round trip
    assert one.apply.experimental_get_tracing_count() == 0
    assert not any(np.any(a.numpy()) for a in one.accumulators)


def numpy_smoothed_loss(logits, labels, eps):
    """(mean smoothed loss, mean nll, tokens) over the non-pad positions, in float64 NumPy."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    one_hot = np.eye(VOCAB)[labels]
    real = labels != PAD_ID
    loss = -(((1.0 - eps) * one_hot + eps / VOCAB) * log_p).sum(-1)[real]
    nll = -(one_hot * log_p).sum(-1)[real]
    return loss.mean(), nll.mean(), real.sum()


@pytest.mark.parametrize("jit_compile", [False, True])  # real tokens only; XLA: every position, weighted
def test_loss_on_real_tokens_equals_the_padded_loss_in_numpy_and_the_update_the_eager_one(jit_compile):
    """The step's loss against NumPy, its update against the eager reference's gradients, and its traces: XLA
    compiles once per batch shape, without XLA one relaxed trace serves every shape."""
    model = tiny_model()
    b = batch(25, batch_size=4, length=9, pad_tail=4)
    inputs = {"source": b["source"], "target_in": b["target_in"]}
    labels = b["target_out"].numpy()
    logits = model(inputs, training=False).numpy()  # (batch, length, vocab): every position, padding included
    want_loss, want_nll, tokens = numpy_smoothed_loss(logits, labels, 0.1)

    real = tf.not_equal(b["target_out"], PAD_ID)
    projected = model.masked_logits(inputs, real).numpy()  # the projection of the real positions only
    assert projected.shape == (tokens, VOCAB) and tokens < labels.size
    np.testing.assert_allclose(projected, logits[labels != PAD_ID], rtol=1e-5, atol=1e-5)

    grads, _ = reference_gradients(model, [b], eps=0.1)
    before = weights(model)
    step = make_step(model, label_smoothing=0.1, jit_compile=jit_compile, learning_rate=0.1)
    metrics = step.step([b])  # loss before the update
    assert float(metrics["tokens"]) == tokens
    np.testing.assert_allclose(float(metrics["loss"]), want_loss, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["nll"]), want_nll, rtol=1e-5)
    for old, new, grad in zip(before, weights(model), grads):
        np.testing.assert_allclose(new, old - 0.1 * grad.numpy(), atol=1e-5)
    step.step([batch(26, batch_size=4, length=9)])  # same shape: no new compilation
    assert step.num_traces == 1
    step.step([batch(27, length=5)])
    assert step.num_traces == (2 if jit_compile else 1)


def test_a_step_does_not_depend_on_the_batch_shape_a_process_started_with():
    """A resumed run starts on another batch shape than the uninterrupted one did. Before, the first shape a
    process met got a static-shape trace of its own (other kernels and roundings) and every later one a relaxed
    trace, so a resumed run drifted from the uninterrupted one whenever batches came in several shapes (buckets).
    Here two processes (two models, same weights, learning rate 0) start on different shapes: every batch's
    gradients must be bit-identical in both."""
    # One layer: the matmul shapes that pick the kernels are those of d_model 64, d_ff 256 and these batches; with
    # _relax a no-op (the old behaviour) the gradients of the first and last batch differ in hundreds of elements.
    config = ModelConfig(d_model=64, num_heads=4, d_ff=256, num_layers=1, dropout=0.0, max_length=64)
    models = [build_model(config, VOCAB, VOCAB) for _ in range(2)]
    models[1].set_weights(models[0].get_weights())
    batches = [
        batch(i, batch_size=size, length=length)
        for i, (size, length) in enumerate([(16, 30), (9, 13), (24, 6)])
    ]
    steps = [make_step(model, learning_rate=0.0) for model in models]
    steps[0].step([batches[0]])  # the "uninterrupted" process starts on the first shape
    steps[1].step([batches[2]])  # the "resumed" one on the last
    for b in batches:
        got, want = (step.gradients(b)[0] for step in steps)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_a_resume_across_loss_scaling_starts_the_scale_again(tmp_path):
    """A float32 (or bfloat16) checkpoint resumed under mixed_float16 kept its scale of 1, which grows back to 2^15
    only after ~30,000 steps, small gradients flushed to zero meanwhile; the other way a float32 run showed 32768
    (before 2026-12-07c; found by a numerics review). Real checkpoints of the step's state; the same kind keeps the
    saved scale and its count of good steps (bit-exact resumes)."""
    from nmt.train_step import INITIAL_LOSS_SCALE

    model = tiny_model()
    saved = {}
    for scaling in (False, True):
        step = make_step(model, loss_scaling=scaling)
        step.loss_scale.assign(1024.0 if scaling else 1.0)
        step.good_steps.assign(7)
        saved[scaling] = tf.train.Checkpoint(**step.checkpoint_state()).save(
            str(tmp_path / f"{scaling}" / "c")
        )
    for was, now in ((False, True), (True, False), (True, True), (False, False)):
        step = make_step(model, loss_scaling=now)
        tf.train.Checkpoint(**step.checkpoint_state()).restore(saved[was]).assert_existing_objects_matched()
        message = step.reconcile_loss_scaling()
        if was == now:
            assert message == ""
            assert (float(step.loss_scale.numpy()), int(step.good_steps.numpy())) == (
                1024.0 if now else 1.0,
                7,
            )
        else:
            expected = INITIAL_LOSS_SCALE if now else 1.0
            assert message.endswith(f"the loss scale starts again at {expected:g}")
            assert (float(step.loss_scale.numpy()), int(step.good_steps.numpy())) == (expected, 0)
            assert step.reconcile_loss_scaling() == ""  # and the next checkpoint records this run's kind


def test_the_step_on_the_cpp_kernels_equals_the_step_on_tensorflow_ops():
    """Same dropout draws (bit for bit) and layer norms to float32 rounding: one update on the kernels
    (nmt.kernels, when built) and one on TensorFlow's ops give the same loss and weights."""
    from nmt import kernels

    if kernels.ops() is None:
        pytest.skip(f"kernels not built: {kernels.unavailable()}")
    results = []
    for on_cpu in (True, False):
        keras.utils.set_random_seed(5)
        model = tiny_model(dropout=0.3)
        step = make_step(model, learning_rate=0.5)
        step.on_cpu = on_cpu  # False: the path of a GPU or XLA step
        metrics = step.step([batch(3)])
        spec = {
            key: tf.TensorSpec([None, None], tf.int32) for key in batch(3)
        }  # the step's one relaxed trace
        graph = step.gradients.get_concrete_function(spec).graph.as_graph_def()
        ops = {node.op for function in graph.library.function for node in function.node_def}
        results.append((float(metrics["loss"]), weights(model), ops))
    (loss, fused, fused_ops), (tf_loss, plain, plain_ops) = results
    assert {"NmtLayerNorm", "NmtLayerNormGrad", "NmtDropout"} <= fused_ops
    assert not any(op.startswith("Nmt") for op in plain_ops)
    np.testing.assert_allclose(loss, tf_loss, rtol=1e-6)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_the_log_says_what_the_step_runs_on(monkeypatch):
    """The `C++ kernels:` log line: the kernels, or under XLA TensorFlow's ops with Adam's update (never compiled)
    on the kernels when the optimizer is FusedAdam under the default strategy; the AVX2 switch named."""
    from nmt import kernels
    from nmt.optimizer import FusedAdam

    if kernels.ops() is None:
        pytest.skip(f"kernels not built: {kernels.unavailable()}")
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    model = tiny_model()
    sgd = make_step(model)
    assert sgd.kernels_in_use() == "C++ kernels (nmt.kernels)"
    sgd.set_jit_compile(True)
    assert sgd.kernels_in_use() == "TensorFlow ops under XLA"
    adam = make_step(model, optimizer=FusedAdam(), jit_compile=True)
    assert adam.kernels_in_use() == "TensorFlow ops under XLA; Adam's update on the C++ kernels"
    monkeypatch.setenv(kernels.ISA_ENV, "avx2")
    assert adam.kernels_in_use().endswith(
        "Adam's update on the C++ kernels with the AVX2 paths (NMT_KERNELS_ISA=avx2)"
    )
    adam.on_cpu = False
    assert adam.kernels_in_use() == "TensorFlow ops (not CPU)"
