"""The matmul-only lower bound of the train bench (benchmarks/matmul_bound.py) and the batch-shape sweep options.

References: a FLOP formula written out by hand, the MatMul / BatchMatMul ops TensorFlow itself puts into the graph
of our model's forward and backward pass, the MFU count of `benchmarks.flops` on a batch without padding, and NumPy
for the products the matmul-only function returns. No time or ratio is asserted.
"""

import dataclasses
import io
import json
import math
import re

import numpy as np
import pytest

from benchmarks.matmul_bound import MatmulOnly, batch_matmuls, matmul_flops, step_matmuls
from nmt.config import ModelConfig

TINY = ModelConfig(d_model=8, num_heads=2, d_ff=12, num_layers=2, dropout=0.0, max_length=32)
VOCAB = 11


def _batch(batch_size, source_length, target_length, *, pad_source=0, pad_target=0, seed=0):
    """Token ids in 3..VOCAB-1, the last `pad_*` positions of every row PAD (0)."""
    rng = np.random.default_rng(seed)

    def ids(length, pad):
        out = rng.integers(3, VOCAB, size=(batch_size, length), dtype=np.int32)
        out[:, length - pad :] = 0
        return out

    target = ids(target_length, pad_target)
    return {"source": ids(source_length, pad_source), "target_in": target, "target_out": target.copy()}


def _hand_count(B, S, T, N, d, f, L, V):
    """Forward FLOPs (2 m k n per product) of every matmul of one step, times 3 for the backward pass."""
    encoder = 2 * B * S * (4 * d * d + 2 * d * f) + 2 * (2 * B * S * S * d)  # projections, FFN; QK^T and PV
    decoder = (
        2 * B * T * (6 * d * d + 2 * d * f)  # self q k v o, cross q o, FFN on target rows
        + 2 * B * S * (2 * d * d)  # cross k v on the memory
        + 2 * (2 * B * T * T * d)  # self QK^T, PV
        + 2 * (2 * B * T * S * d)  # cross QK^T, PV
    )
    return 3 * (L * (encoder + decoder) + 2 * N * d * V)


@pytest.mark.parametrize("tie_output", [True, False])
def test_matmul_flops_match_a_hand_count(tie_output):
    shape = dict(batch_size=3, source_length=5, target_length=4, projection_rows=7)
    model = dict(d_model=8, d_ff=12, num_heads=2, num_layers=2, vocab_size=11, tie_output=tie_output)
    matmuls = step_matmuls(**shape, **model)
    assert matmul_flops(matmuls) == _hand_count(B=3, S=5, T=4, N=7, d=8, f=12, L=2, V=11)
    # 2 layers x (8 encoder + 14 decoder products) + the projection, each with its two backward products
    assert len(matmuls) == 3 * (2 * (8 + 14) + 1)
    projection = [m for m in matmuls if m.name.startswith("output projection")]
    assert all(m.float32 is not tie_output for m in projection)
    assert not any(m.float32 for m in matmuls if m not in projection)


def test_projection_rows_are_the_real_tokens_only_when_masked():
    batch = _batch(3, 5, 6, pad_target=2)  # 3 x 4 real target tokens of 3 x 6 positions
    for masked, rows in ((True, 12), (False, 18)):
        (forward,) = [
            m for m in batch_matmuls(batch, TINY, VOCAB, masked=masked) if m.name == "output projection"
        ]
        assert (forward.m, forward.k, forward.n) == (rows, 8, VOCAB)


def _graph_matmul_flops(model, batch) -> list[int]:
    """FLOPs of each MatMul / BatchMatMul op in TensorFlow's graph of the model's forward and backward pass."""
    import tensorflow as tf

    weights = tf.random.stateless_normal((*batch["target_in"].shape, VOCAB), seed=[1, 2])

    @tf.function
    def gradients(source, target_in):
        with tf.GradientTape() as tape:
            logits = model({"source": source, "target_in": target_in}, training=True)
            loss = tf.reduce_sum(logits * weights)
        return tape.gradient(loss, model.trainable_variables)

    specs = [tf.TensorSpec(batch[key].shape, tf.int32) for key in ("source", "target_in")]
    graph = gradients.get_concrete_function(*specs).graph
    flops = []
    for op in graph.get_operations():
        assert op.type not in ("Einsum", "PartitionedCall", "StatefulPartitionedCall"), (
            op.type
        )  # would hide matmuls
        if op.type == "MatMul":
            a, b = (x.shape.as_list() for x in op.inputs)
            m, k = a[::-1] if op.get_attr("transpose_a") else a
            n = b[0] if op.get_attr("transpose_b") else b[1]
            flops.append(2 * m * k * n)
        elif op.type.startswith("BatchMatMul"):
            a, b = (x.shape.as_list() for x in op.inputs)
            m, k = a[-1:-3:-1] if op.get_attr("adj_x") else a[-2:]
            n = b[-2] if op.get_attr("adj_y") else b[-1]
            flops.append(2 * math.prod(a[:-2]) * m * k * n)
    return sorted(flops)


@pytest.mark.parametrize("changes", [{}, {"tie_output": False, "share_embeddings": False, "norm": "pre"}])
def test_matmul_set_is_the_matmuls_tensorflow_runs_for_our_model(changes):
    """Per product FLOPs: the same multiset as the MatMul / BatchMatMul ops in the graph of our model's gradient."""
    import keras

    from transformer.model import build_model

    config = dataclasses.replace(
        TINY, num_layers=1, **changes
    )  # one layer: the graph of two takes twice as long
    keras.utils.set_random_seed(0)
    model = build_model(config, VOCAB, VOCAB)
    batch = _batch(2, 5, 4, pad_source=1, pad_target=1)
    expected = sorted(m.flops for m in batch_matmuls(batch, config, VOCAB, masked=False))
    assert _graph_matmul_flops(model, batch) == expected


@pytest.mark.parametrize("share_qkv", ["none", "qk", "all"])
def test_matmul_flops_agree_with_the_mfu_count_without_padding(share_qkv):
    """Without padding and with S = T, the MFU count (6 N tokens + attention, `benchmarks.flops`) exceeds the
    matmul-only count by exactly 6 x (bias and LayerNorm parameters) x tokens: the only terms it counts that are
    not matmuls. With padding the matmul-only count is larger (it counts padded rows). A Q/K/V projection shared
    within a self-attention (`share_qkv`) runs once per use, weights and bias: both counts are those of the unshared
    model."""
    import keras

    from benchmarks.flops import non_embedding_parameters, train_flops
    from transformer.model import build_model

    config = dataclasses.replace(TINY, share_qkv=share_qkv)
    keras.utils.set_random_seed(0)
    model = build_model(config, VOCAB, VOCAB)
    d, f = 8, 12
    # Bias and LayerNorm parameters per use, by hand (Post-LN): encoder layer q k v o, FFN, 2 LayerNorms; decoder
    # layer self and cross q k v o, FFN, 3 LayerNorms.
    non_matmul = 2 * ((4 * d + f + d + 2 * 2 * d) + (8 * d + f + d + 3 * 2 * d))
    if share_qkv == "none":
        assert non_matmul == sum(
            int(np.prod(v.shape)) for v in model.trainable_variables if len(v.shape) == 1
        )
    non_embedding = non_embedding_parameters(model, target_vocab_size=VOCAB, d_model=8, tie_output=True)
    count = dict(non_embedding=non_embedding, d_model=8, num_layers=2)

    batch = _batch(3, 6, 6)
    tokens = 3 * 6
    mfu = train_flops([batch], **count)
    assert matmul_flops(batch_matmuls(batch, config, VOCAB, masked=True)) == mfu - 6 * non_matmul * tokens

    padded = _batch(3, 6, 6, pad_source=2, pad_target=2)
    assert matmul_flops(batch_matmuls(padded, config, VOCAB, masked=True)) > train_flops([padded], **count)


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_matmul_only_runs_the_listed_products(precision):
    """Positive finite seconds (no bound on them); every returned product is the NumPy product of its operands, in
    the precision's compute dtype; batches of one shape share one function."""
    import tensorflow as tf

    from benchmarks.common import timed

    batches = [_batch(2, 5, 4, pad_target=1, seed=0), _batch(2, 5, 4, pad_target=1, seed=1), _batch(3, 4, 6)]
    bound = MatmulOnly(batches, TINY, VOCAB, precision=precision, xla=False, masked=True)
    assert len(bound.functions) == 2 and bound.flops == sum(matmul_flops(s) for s in bound.steps)
    seconds, _ = timed(bound.run)
    assert math.isfinite(seconds) and seconds > 0

    dtype = tf.float32 if precision == "float32" else tf.bfloat16
    for matmuls, function in bound.functions.items():
        products, _ = function()
        assert len(products) == len(matmuls)
        for matmul, product in zip(matmuls, products):
            a = bound.operands[(matmul.a_shape, dtype.name)].numpy().astype(np.float64)
            b = bound.operands[(matmul.b_shape, dtype.name)].numpy().astype(np.float64)
            a = np.swapaxes(a, -1, -2) if matmul.transpose_a else a
            b = np.swapaxes(b, -1, -2) if matmul.transpose_b else b
            assert product.dtype == dtype, matmul.name
            tolerance = 1e-4 if precision == "float32" else 0.05
            np.testing.assert_allclose(
                product.numpy().astype(np.float64), a @ b, rtol=tolerance, atol=tolerance
            )


def test_matmul_only_compiles_under_xla():
    import tensorflow as tf

    bound = MatmulOnly([_batch(2, 3, 3)], TINY, VOCAB, precision="float32", xla=True, masked=False)
    bound.run()
    (function,) = bound.functions.values()
    products, _ = function()
    assert products[-1].dtype == tf.float32 and function.experimental_get_tracing_count() == 1


def _hlo_matmuls(function) -> int:
    """Matrix products in XLA's optimized HLO of `function`: dot instructions and oneDNN matmul custom calls."""
    hlo = function.experimental_get_compiler_ir()(stage="optimized_hlo")
    return len(re.findall(r"= \S+ dot\(|custom_call_target=\"__onednn\$matmul", hlo))


def _grappler_matmuls(function) -> int:
    """MatMul / BatchMatMul nodes of `function`'s graph after Grappler's default optimizations."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer

    graph = function.get_concrete_function().graph
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph.as_graph_def(), graph=graph)
    fetch = meta.collection_def["train_op"].node_list.value
    for output in graph.outputs:
        fetch.append(output.name)
    optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)
    return sum("MatMul" in node.op for node in optimized.node)


@pytest.mark.parametrize("xla", [True, False])
def test_every_listed_product_survives_the_optimizers(xla):
    """Products of equal shapes are not merged: the optimized program has one matmul per listed product.

    Before, the products of one operand shape shared one tensor: XLA's common-subexpression elimination left 33
    dots of the 135 products listed here, Grappler 134 MatMul nodes. Operands above and below the size tf.function
    captures as a constant (128 elements) are both present."""
    batch = _batch(4, 6, 5, pad_target=1)  # (24, 8) rows and (8, 6, 4) heads: big; (8, 8) weights: small
    bound = MatmulOnly([batch], TINY, VOCAB, precision="float32", xla=xla, masked=not xla)
    ((matmuls, function),) = bound.functions.items()
    sizes = {math.prod(shape) for m in matmuls for shape in (m.a_shape, m.b_shape)}
    assert min(sizes) <= 128 < max(sizes)
    distinct = {(m.a_shape, m.b_shape, m.transpose_a, m.transpose_b) for m in matmuls}
    assert len(distinct) < len(matmuls)  # a program that merged equal products would have fewer
    count = _hlo_matmuls(function) if xla else _grappler_matmuls(function)
    assert count == len(matmuls)


def test_bench_cli_batch_shape_sweep_options():
    import bench

    def options(*argv):
        return bench.options_from_args(bench.parse_args(list(argv)))

    assert (
        options().train_batch_tokens == () and options().train_bucket_steps == ()
    )  # make bench: config's own
    swept = options("--train-batch-tokens", "1024,2048,4096", "--train-bucket-steps", "0,8")
    assert swept.train_batch_tokens == (1024, 2048, 4096) and swept.train_bucket_steps == (0, 8)
    assert bench.main(["--only", "train", "--train-batch-tokens", "0"]) == 2
    assert bench.main(["--only", "train", "--train-bucket-steps", "-4"]) == 2


def test_train_variants_set_batch_tokens_and_bucket_edges():
    from benchmarks.train_speed import train_variants
    from data.pipeline import bucket_edges
    from nmt.config import config_from_dict

    config = config_from_dict({"data": {"max_length": 20, "batch_tokens": 512, "bucket_boundaries": [7]}})
    (own,) = train_variants(config)
    assert own == config
    variants = train_variants(config, (256, 1024), (0, 6))
    assert [(v.data.batch_tokens, bucket_edges(v.data)) for v in variants] == [
        (256, bucket_edges(dataclasses.replace(config.data, bucket_boundaries=[]))),
        (256, [6, 12, 18, 20]),
        (1024, bucket_edges(dataclasses.replace(config.data, bucket_boundaries=[]))),
        (1024, [6, 12, 18, 20]),
    ]
    assert config.data.batch_tokens == 512 and config.data.bucket_boundaries == [7]  # not changed in place


@pytest.mark.slow  # ~25 s idle, ~60 s loaded: each value traces the train step of our model and the reference
def test_sweep_emits_one_train_row_per_batch_tokens_value(tmp_path):
    """bench.py's runner with two batch_tokens values and a bucket step: one train row per value, batches no larger
    than asked and padded to the asked edges, the matmul-only fields present and positive."""
    from benchmarks.common import JsonLines
    from benchmarks.runner import BenchOptions, run_benchmarks
    from data.tokenizer_training import train_tokenizer
    from nmt.config import config_from_dict
    from tests.run_fixture import tiny_config_tree, write_corpus

    config = config_from_dict(tiny_config_tree(write_corpus(tmp_path / "corpus")))
    train_tokenizer(config.data, tmp_path / "tokenizer", seed=config.train.seed)
    options = BenchOptions.quick(
        only=("train",),
        tokenizer_dir=str(tmp_path / "tokenizer"),
        run_dir="does/not/exist",
        train_batches=1,
        train_rounds=1,
        peak_size=64,
        train_batch_tokens=(128, 256),
        train_bucket_steps=(8,),  # edges 8, 16, 24 and max_length 32
    )
    stream = io.StringIO()
    records = run_benchmarks(options, emit=JsonLines(stream), config=config)
    assert [json.loads(line) for line in stream.getvalue().splitlines()] == records
    # The run's description first; the closing record: wall seconds per benchmark run
    header, *records, timing = records
    assert header["bench"] == "run" and header["options"]["train_batch_tokens"] == [128, 256]
    assert timing["bench"] == "timing" and timing["complete"] is True and list(timing["seconds"]) == ["train"]
    assert [(r["bench"], r["batch_tokens"], r["precision"], r["xla"]) for r in records] == [
        ("train", 128, "float32", False),
        ("train", 256, "float32", False),
    ]
    for record in records:
        (shape,) = record["batch_shapes"]
        assert shape[0] * shape[1] <= record["batch_tokens"] and shape[1] in (8, 16, 24, 32)
        assert record["bucket_boundaries"] == [8, 16, 24]
        for key in ("tokens_per_sec", "mfu", "step_seconds", "matmul_only_seconds", "overhead_ratio"):
            assert isinstance(record[key], (int, float)) and record[key] > 0, key
        assert record["matmul_gflops_per_pass"] > 0 and record["matmul_only_gflops"] > 0
