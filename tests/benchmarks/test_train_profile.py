"""The profile's op categories (benchmarks.train_profile.categorize), on node names as the traced step has them."""

import pytest

from benchmarks.train_profile import CLUSTERS, DROPOUT, LAYER_NORMS, PROJECTION, categorize


@pytest.mark.parametrize(
    ("node", "op_type", "category"),
    [
        ("StatefulPartitionedCall/cluster_3_1/xla_run", "_XlaRun", CLUSTERS),
        ("StatefulPartitionedCall/cluster_3_1/xla_compile", "_XlaCompile", CLUSTERS),
        ("StatefulPartitionedCall/transformer/encoder_layer_0/dropout/SelectV2", "SelectV2", DROPOUT),
        ("StatefulPartitionedCall/transformer/MatMul", "_MklMatMul", PROJECTION),
        ("gradient_tape/transformer/decoder_layer_1/ffn_norm/mul", "Mul", LAYER_NORMS),
        ("StatefulPartitionedCall/transformer/encoder_layer_0/ffn/Cast", "Cast", "casts"),
    ],
)
def test_op_events_fall_into_their_category(node, op_type, category):
    assert categorize(node, op_type) == category
