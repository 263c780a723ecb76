"""`train.xla: fusible`: XLA auto-clusters the step's fusible ops, the matmuls stay TensorFlow's, results unchanged.

The flags are in this process' environment before TensorFlow reads them: tests/conftest.py imports nmt.xla first.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from nmt.config import ModelConfig
from nmt.xla import FLAGS, autoclustering, install_flags
from tests.nmt.test_train_step import VOCAB, batch, make_step, reference_gradients, tiny_model, weights
from transformer.model import build_model


def test_install_flags_adds_both_keeps_an_explicit_choice_and_is_idempotent():
    environ = {}
    install_flags(environ)
    assert environ["TF_XLA_FLAGS"].split() == list(FLAGS)
    install_flags(environ)
    assert environ["TF_XLA_FLAGS"].split() == list(FLAGS)
    environ = {"TF_XLA_FLAGS": "--tf_xla_ops_to_cluster=PW --xla_foo=1"}
    install_flags(environ)
    assert environ["TF_XLA_FLAGS"].split() == [
        "--tf_xla_ops_to_cluster=PW", "--xla_foo=1", "--tf_xla_cpu_global_jit", "--tf_xla_enable_lazy_compilation=false"
    ]  # fmt: skip


def test_autoclustering_is_on_inside_the_block_only_even_on_error():
    assert tf.config.optimizer.get_jit() == ""
    with autoclustering():
        assert tf.config.optimizer.get_jit() == "autoclustering"
        with autoclustering(False):  # disabled: leaves the setting alone
            assert tf.config.optimizer.get_jit() == "autoclustering"
    assert tf.config.optimizer.get_jit() == ""
    with pytest.raises(RuntimeError), autoclustering():
        raise RuntimeError("boom")
    assert tf.config.optimizer.get_jit() == ""


def executed_op_types(step, b) -> tuple[set[str], dict]:
    """The op types of the graphs TensorFlow partitions and runs for `step`'s first step (its instantiation), and
    that step's metrics."""
    context.context().enable_run_metadata()
    try:
        metrics = step.step([b])
        metadata = context.context().export_run_metadata()
    finally:
        context.context().disable_run_metadata()
    types = {
        node.op
        for function in metadata.function_graphs
        for graph in function.partition_graphs
        for node in graph.node
    }
    return types, metrics


@pytest.fixture(scope="module")
def fusible_first_step():
    """One fusible step (traced and compiled once for the two tests below): its executed op types, its loss, and
    the weights before and after it with the eager reference's gradients."""
    keras.utils.set_random_seed(1234)  # module fixtures run before the autouse seed fixture
    model = tiny_model()
    b = batch(6)
    grads, loss = reference_gradients(model, [b])
    before = weights(model)
    types, metrics = executed_op_types(make_step(model, learning_rate=0.1, autocluster=True), b)
    return types, float(metrics["loss"]), loss, before, weights(model), grads


def test_fusible_step_runs_xla_clusters_and_keeps_the_matmuls_out_of_them(fusible_first_step):
    clustered = fusible_first_step[0]
    plain, _ = executed_op_types(make_step(tiny_model()), batch(6))
    assert {"_XlaCompile", "_XlaRun"} <= clustered
    assert not {"_XlaCompile", "_XlaRun"} & plain
    # The matmuls run as TensorFlow (oneDNN) kernels beside the clusters, as in the plain step.
    assert any("MatMul" in op for op in clustered), sorted(clustered)
    assert any("MatMul" in op for op in plain), sorted(plain)
    # Fused away: the elementwise ops the clusters took no longer run one by one.
    assert "Rsqrt" in plain and "Rsqrt" not in clustered  # layer norm


def test_fusible_step_matches_the_eager_reference(fusible_first_step):
    _, step_loss, loss, before, after, grads = fusible_first_step
    np.testing.assert_allclose(step_loss, loss, rtol=1e-5)
    for old, new, grad in zip(before, after, grads):
        np.testing.assert_allclose(new, old - 0.1 * grad.numpy(), atol=1e-5)


def dropout_model(seed=3):
    keras.utils.set_random_seed(seed)
    config = ModelConfig(d_model=16, num_heads=2, d_ff=32, num_layers=1, dropout=0.3, max_length=32)
    return build_model(config, VOCAB, VOCAB)


def adam_losses(model, autocluster, steps=range(10, 14)):
    step = make_step(model, optimizer=keras.optimizers.Adam(1e-2), autocluster=autocluster, clipnorm=1.0)
    return np.array([float(step.step([batch(i)])["loss"]) for i in steps]), step


@pytest.mark.slow  # make test keeps the bfloat16 one (the same fusible path); make test-all runs both
def test_fusible_float32_step_draws_the_same_dropout_masks_and_trains_the_same():
    losses, _ = adam_losses(dropout_model(), autocluster=False)
    fused, _ = adam_losses(dropout_model(), autocluster=True)
    np.testing.assert_allclose(fused, losses, rtol=1e-5)  # a different mask would move the loss by percents


def test_fusible_bfloat16_step_stays_within_rounding_of_the_unclustered_one():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")  # reset by conftest
    losses, _ = adam_losses(dropout_model(), autocluster=False)
    fused, _ = adam_losses(dropout_model(), autocluster=True)
    # XLA keeps fused intermediates in float32 where TensorFlow rounds each op's output to bfloat16 (8 bits of
    # mantissa): the runs part by rounding, not by masks or math (0.2% measured on a Zen 3; another dropout mask
    # moves a step's loss by 4% or more).
    np.testing.assert_allclose(fused, losses, rtol=1e-2)
