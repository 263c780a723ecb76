"""The profile's op categories (benchmarks.train_profile.categorize), on node names as the traced step has them."""

import pytest

from benchmarks.train_profile import (
    ATTENTION,
    CLUSTERS,
    DROPOUT,
    LAYER_NORMS,
    LOSS,
    OTHER,
    PROJECTION,
    categorize,
)


@pytest.mark.parametrize(
    ("node", "op_type", "category"),
    [
        ("StatefulPartitionedCall/cluster_3_1/xla_run", "_XlaRun", CLUSTERS),
        ("StatefulPartitionedCall/cluster_3_1/xla_compile", "_XlaCompile", CLUSTERS),
        ("StatefulPartitionedCall/transformer/encoder_layer_0/dropout/SelectV2", "SelectV2", DROPOUT),
        ("StatefulPartitionedCall/transformer/MatMul", "_MklMatMul", PROJECTION),
        ("gradient_tape/transformer/decoder_layer_1/ffn_norm/mul", "Mul", LAYER_NORMS),
        ("StatefulPartitionedCall/transformer/encoder_layer_0/ffn/Cast", "Cast", "casts"),
        ("StatefulPartitionedCall/gradient_tape/bias_grad_3/NmtReluBiasGrad", "NmtReluBiasGrad", OTHER),
        (
            "StatefulPartitionedCall/gradient_tape/cross_entropy_grad/NmtCrossEntropyGrad",
            "NmtCrossEntropyGrad",
            LOSS,
        ),
        (
            "StatefulPartitionedCall/masked_softmax_grad/NmtMaskedSoftmaxGrad",
            "NmtMaskedSoftmaxGrad",
            ATTENTION,
        ),
    ],
)
def test_op_events_fall_into_their_category(node, op_type, category):
    assert categorize(node, op_type) == category


def test_a_traced_step_is_summed_per_category_and_per_kernel():
    """A real profiler trace of a small step: the per-kernel op time adds up to the per-category op time, and the
    step's matmul and its dropout-named multiply land in their categories."""
    import tensorflow as tf

    from benchmarks.train_profile import MATMULS, profile_step

    weights = tf.random.stateless_normal([256, 256], seed=[1, 2])

    class Step:
        @tf.function
        def run(self, x):
            with tf.name_scope("layer"):
                h = tf.matmul(x, weights)
            with tf.name_scope("dropout"):
                h = h * 2.0
            return tf.reduce_sum(h)

        def step(self, batches):
            return {"applied": self.run(batches[0]) > -1e30}

    profile = profile_step(Step(), [tf.ones([512, 256])] * 2)
    assert profile["wall_ms"] > 0
    for category, ms in profile["op_ms"].items():
        kernels = sum(v for (c, _), v in profile["kernel_ms"].items() if c == category)
        assert kernels == pytest.approx(ms, rel=1e-9, abs=1e-9)
    kernels = {kernel for (category, kernel) in profile["kernel_ms"] if category == MATMULS}
    assert any("MatMul" in kernel for kernel in kernels)
    assert profile["op_ms"][DROPOUT] > 0
