"""Where a training step's time goes: a TensorFlow profiler trace of a few steps, op time by category.

    python -m benchmarks.train_profile --config base.yaml [--set ...] [--precision mixed_bfloat16] [--steps 6]
        [--xla off|fusible] [--top-kernels N]

The config's model with the real `nmt.train_step.TrainStep` (`benchmarks.train_speed.make_train_step`, XLA off, or
with `--xla fusible` the fusible ops auto-clustered as `train.xla: fusible` does: each XLA cluster is one opaque op,
counted in its own category, and the ops it fused no longer appear in theirs), on the first `steps` batches of the
seeded epoch whose shape is among its 3 most common. Warm-up: one pass over the batches (traces every shape). Wall
time per step: the median of two more passes, outside the profiler. Then one pass under `tf.profiler`; the
TensorFlow op events of the host trace (the XSpace protobuf, read with the `xplane_pb2` TensorFlow ships) are
summed per category of `categorize`. That is op time summed over TensorFlow's inter-op threads, so it can exceed
the wall time, and it includes the time an op's thread waits for a core: on a loaded machine compare shares, not
milliseconds.

Also times the step's matmuls alone (`benchmarks.matmul_bound.MatmulOnly`, same shapes and compute dtype, median of
3 passes after a warm-up, outside the profiler): the lower bound the matmul categories of the table are compared to.

Prints a markdown table and one JSON line prefixed `TRAIN_PROFILE ` (ms per step per category, wall ms per step,
matmul-only ms per step).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import nmt.xla  # noqa: E402, F401  (TF_XLA_FLAGS before TensorFlow reads them: --xla fusible)
from benchmarks.common import positive_int

MARK = "TRAIN_PROFILE "
PROJECTION = "output projection matmuls (fwd+bwd)"
MATMULS = "other matmuls (attention, FFN, fwd+bwd)"
LOSS = "loss over the vocabulary (log-softmax, cross-entropy, gradient, gathers)"
DROPOUT = "dropout (random masks, select)"
LAYER_NORMS = "layer norms (fwd+bwd)"
ATTENTION = "attention softmax, masks"
OTHER = "other (bias, residual, ReLU, transposes, embedding lookup, update bookkeeping)"
CLUSTERS = "XLA clusters (the fused ops of train.xla: fusible)"
CATEGORIES = (PROJECTION, MATMULS, LOSS, DROPOUT, "casts", LAYER_NORMS, ATTENTION,
              "gradient sums (AddN)", "optimizer (Adam)", "gradient norms, clipping", "accumulator copies",
              OTHER, CLUSTERS)  # fmt: skip


def categorize(node: str, op_type: str) -> str:
    """The category of one op event: `node` is its node name in the traced function, `op_type` its kernel.

    The gradient function's nodes sit under `StatefulPartitionedCall/` (its backward pass under `gradient_tape/`),
    the model's under its layers' names; the optimizer update's under `adam/`.
    """
    path = re.sub(r"^(StatefulPartitionedCall/)?(gradient_tape/)?(transformer(_\d+)?/)?", "", node)
    if op_type.startswith("_Xla"):  # _XlaRun (a cluster's kernels), _XlaCompile (its cache lookup)
        return CLUSTERS
    if "dropout" in path:
        return DROPOUT
    if "bias_grad" in path:  # the dense layers' bias (and ReLU) gradient kernels, named in their tape's scope
        return OTHER
    if "masked_softmax_grad" in path:  # the attention softmax's gradient kernel, likewise
        return ATTENTION
    if "MatMul" in op_type or "Einsum" in op_type:
        return PROJECTION if path.startswith("MatMul") else MATMULS  # the model's only matmul outside a layer
    if op_type == "Cast":
        return "casts"
    if "adam" in path.lower():
        return "optimizer (Adam)"
    if "global_norm" in path or "clip_by" in path or op_type == "L2Loss":
        return "gradient norms, clipping"
    if op_type in ("AssignAddVariableOp", "AssignVariableOp") and "/" not in node:
        return "accumulator copies"
    if op_type == "AddN":
        return "gradient sums (AddN)"
    if "_norm" in path:
        return LAYER_NORMS
    if "attention" in path and ("oftmax" in op_type or "Select" in op_type):
        return ATTENTION
    if node.startswith("StatefulPartitionedCall") and "_layer" not in path and "embedding" not in path:
        return LOSS
    return OTHER


def op_milliseconds(logdir: str, by_kernel: collections.Counter | None = None) -> collections.Counter:
    """Op time (ms) per category in the profiler trace under `logdir`; also per (category, kernel) into `by_kernel`
    when given."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1], "rb") as trace:
        space.ParseFromString(trace.read())
    totals = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):  # the inter-op threads; Eigen's run inside their ops
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name  # "node:OpType", or a runtime region
                if ":" in name and not name.startswith(("Threadpool", "ExecutorState")):
                    node, op_type = name.rsplit(":", 1)
                    category = categorize(node, op_type)
                    totals[category] += event.duration_ps / 1e9
                    if by_kernel is not None:
                        by_kernel[category, op_type] += event.duration_ps / 1e9
    return totals


def profile_step(step, batches: list) -> dict:
    """{"op_ms": {category: ms per step}, "kernel_ms": {(category, kernel): ms per step}, "wall_ms": median wall ms
    per step} of `step.step([b])` over `batches`."""
    import tensorflow as tf

    def one_pass():
        start = time.perf_counter()
        for batch in batches:
            bool(step.step([batch])["applied"])  # the trainer reads this every step
        return (time.perf_counter() - start) * 1000 / len(batches)

    one_pass()  # warm-up: traces every shape (and under fusible compiles its clusters: nmt.xla)
    wall = statistics.median([one_pass(), one_pass()])
    logdir = tempfile.mkdtemp(prefix="train-profile-")
    try:
        tf.profiler.experimental.start(logdir)
        one_pass()
        tf.profiler.experimental.stop()
        by_kernel = collections.Counter()
        totals = op_milliseconds(logdir, by_kernel)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return {
        "op_ms": {c: totals.get(c, 0.0) / len(batches) for c in CATEGORIES},
        "kernel_ms": {key: ms / len(batches) for key, ms in by_kernel.items()},
        "wall_ms": wall,
    }


def markdown_table(profiles: dict[str, dict], tokens_per_step: float) -> str:
    """One ms/step and one share column per profile (name -> `profile_step` result)."""
    lines = ["| category | " + " | ".join(f"{name}: ms/step | {name}: share" for name in profiles) + " |"]
    lines.append("|---|" + "---:|---:|" * len(profiles))
    for category in CATEGORIES:
        cells = []
        for profile in profiles.values():
            ms, total = profile["op_ms"][category], sum(profile["op_ms"].values())
            cells += [f"{ms:.0f}", f"{ms / total:.1%}"]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    cells = [f"**{sum(p['op_ms'].values()):.0f}** | 100%" for p in profiles.values()]
    lines.append("| **op time, all categories** | " + " | ".join(cells) + " |")
    cells = [
        f"{p['wall_ms']:.0f} | {tokens_per_step / p['wall_ms'] * 1000:,.0f} tok/s" for p in profiles.values()
    ]
    lines.append("| wall time per step (outside the profiler) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sample_batches(config, tokenizer, *, num_batches: int, max_shapes: int = 3) -> list[dict]:
    """The first `num_batches` batches of the seeded epoch whose shape is among its `max_shapes` most common."""
    import tensorflow as tf

    from data.pipeline import make_train_dataset

    dataset = make_train_dataset(config.data, tokenizer, seed=config.train.seed, repeat=False)
    counts = collections.Counter(tuple(b["source"].shape) for b in dataset.as_numpy_iterator())
    shapes = {shape for shape, _ in counts.most_common(max_shapes)}
    chosen = [b for b in dataset.take(20 * num_batches).as_numpy_iterator() if b["source"].shape in shapes]
    return [{key: tf.constant(value) for key, value in b.items()} for b in chosen[:num_batches]]


def main(argv: list[str] | None = None) -> int:
    from common.config_tree import add_set_argument  # TensorFlow only after parsing: --help is quick

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    add_set_argument(parser)
    parser.add_argument(
        "--precision",
        choices=("float32", "mixed_float16", "mixed_bfloat16"),
        help="a Keras policy (default: the config's, resolved)",
    )
    parser.add_argument("--steps", type=positive_int, default=6)
    parser.add_argument(
        "--xla", choices=("off", "fusible"), default="off", help="fusible: as train.xla: fusible (nmt.xla)"
    )
    parser.add_argument(
        "--top-kernels",
        type=positive_int,
        metavar="N",
        help="also print the N (category, kernel) pairs with the most op time",
    )
    args = parser.parse_args(argv)

    import keras

    from benchmarks.common import timed
    from benchmarks.matmul_bound import MatmulOnly
    from benchmarks.train_speed import make_train_step
    from data.prepare import prepare
    from nmt.config import load_config
    from nmt.precision import resolve_precision, set_policy
    from transformer.model import build_model

    config = load_config(args.config, args.overrides)
    tokenizer, _ = prepare(config.data, progress=False)
    precision = args.precision or resolve_precision(config.train.precision, "cpu")
    batches = sample_batches(config, tokenizer, num_batches=args.steps)
    set_policy(precision)
    keras.utils.set_random_seed(config.train.seed)
    model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    step = make_train_step(model, config, precision=precision, xla=False)
    step.autocluster = args.xla == "fusible"
    profile = profile_step(step, batches)
    bound = MatmulOnly(
        batches, config.model, tokenizer.target_vocab_size, precision=precision, xla=False, masked=True
    )
    bound.run()  # warm-up: traces every shape
    matmul_ms = statistics.median(timed(bound.run)[0] for _ in range(3)) * 1000 / len(batches)
    tokens = sum(int((b["target_out"].numpy() != 0).sum()) for b in batches) / len(batches)
    print(
        f"precision {precision}, XLA {args.xla}, {len(batches)} batches, {tokens:.0f} target tokens per step"
    )
    print(markdown_table({"step": profile}, tokens))
    print(
        f"matmul-only (the step's matmuls alone, same shapes): {matmul_ms:.0f} ms/step, "
        f"wall / matmul-only = {profile['wall_ms'] / matmul_ms:.2f}"
    )
    if args.top_kernels:
        print("\n| category | kernel | ms/step |\n|---|---|---:|")
        top = sorted(profile["kernel_ms"].items(), key=lambda item: -item[1])[: args.top_kernels]
        for (category, kernel), ms in top:
            print(f"| {category} | {kernel} | {ms:.1f} |")
    record = {"precision": precision, "xla": args.xla, "steps": len(batches)}
    record["target_tokens_per_step"] = round(tokens, 1)
    record.update(
        wall_ms=round(profile["wall_ms"], 1),
        op_ms={k: round(v, 1) for k, v in profile["op_ms"].items()},
        matmul_only_ms=round(matmul_ms, 1),
    )
    record["load_average"] = round(os.getloadavg()[0], 2)
    print(MARK + json.dumps(record), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    from nmt import cli

    cli.stop_on_sigterm()
    cli.run(main)  # a config or data error: one line, exit 2 or 1
