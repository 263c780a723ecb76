"""Training throughput: our model against the stock-Keras reference, per precision and XLA setting.

Both models train with the project's real `nmt.train_step.TrainStep` (Adam with the warmup schedule, label
smoothing, global clipnorm, loss scaling under float16; ours with the trainer's fused Adam, the reference with
Keras' own), on the same fixed list of Multi30k batches from
`make_train_dataset`, in the same process. For each (precision, XLA) setting:

    set the global Keras policy, build ours and the reference (same seed), once per precision; the XLA
    settings of a precision share the models and their optimizer-update trace (`TrainStep.set_jit_compile`)
    warm up: one step of each model per batch shape (traces / XLA compiles every shape the timed passes meet)
    `rounds` times: one timed pass of ours, then one of the reference (alternated, so load drifts hit both)
    tokens/s = target tokens of the batches / pass seconds, median over the rounds

MFU divides the model FLOPs/s (`benchmarks.flops`) by a matmul peak measured in the same process, in the compute
dtype of the precision (`matmul_peak_gflops`: the best of a few shapes), or by the row's matmul-only rate (its best
round) where that is higher (`row_peak`): `peak_gflops` is the one used, `measured_peak_gflops` and
`measured_peak_by_shape` the measurement, `peak_source` says which ("measured" or "matmul_only"), so no fraction of
the peak exceeds 1 for the matmuls. Batches: the first `num_batches` of the seeded epoch whose shape is among the
epoch's `max_shapes` most common shapes, so XLA compiles at most `max_shapes` programs per model, on the shapes
training meets most.

Model settings the reference does not model (`benchmarks.reference_model.unmodelled_settings`: local or chunked
attention, attention dropout, ...) are refused: the ratio would compare unlike models and the FLOP counts assume
full attention.

The matmul-only lower bound (`benchmarks.matmul_bound`): the step's matmuls alone (same shapes and compute dtype,
forward and backward, jit-compiled when the row is), timed in the same rounds as a third entry after ours and the
reference. `overhead_ratio` = our seconds per step / its seconds per step; `matmul_only_gflops` (its own FLOP count,
`matmul_gflops_per_pass`, over its time) and `matmul_only_peak_fraction` sit beside the MFU;
`matmul_over_model_flops` compares the two FLOP counts (they differ by padding, source-vs-target rows and biases).
`train_variants`: the config with other `data.batch_tokens` and bucket edges, for the batch-shape sweep
(`bench.py --train-batch-tokens`, `--train-bucket-steps`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging

import keras
import tensorflow as tf

from benchmarks.common import PRECISIONS, BenchContext, median, rounded, timed
from benchmarks.flops import (
    count_parameters,
    matmul_peaks,
    non_embedding_parameters,
    row_peak,
    target_tokens,
    train_flops,
)
from benchmarks.matmul_bound import MatmulOnly
from benchmarks.reference_model import build_reference_model, parameter_difference, unmodelled_settings

log = logging.getLogger("benchmarks")


def train_variants(config, batch_tokens=(), bucket_steps=()) -> list:
    """`config` with each `data.batch_tokens` x bucket edges asked for (empty: the config's own value).

    A bucket step ``n > 0`` gives the edges ``n, 2n, ...`` below `data.max_length` (which is always the last edge);
    ``0`` the automatic edges (`data.pipeline.bucket_edges`).
    """
    variants = []
    for tokens in batch_tokens or (config.data.batch_tokens,):
        for step in bucket_steps or (None,):
            data = dataclasses.replace(config.data, batch_tokens=int(tokens))
            if step is not None:
                if step < 0:
                    raise ValueError(f"bucket step must be >= 0, got {step}")
                data.bucket_boundaries = list(range(step, data.max_length, step)) if step else []
            variants.append(dataclasses.replace(config, data=data))
    return variants


def sample_batches(context: BenchContext, *, num_batches: int, max_shapes: int, config=None) -> list[dict]:
    """The first `num_batches` batches of the seeded epoch whose shape is among its `max_shapes` most common ones.

    `config`: the config whose data settings batch the epoch (default: the context's).
    """
    from data.pipeline import make_train_dataset

    cfg = config or context.config
    dataset = make_train_dataset(cfg.data, context.tokenizer, seed=cfg.train.seed, repeat=False)
    counts = collections.Counter(tuple(b["source"].shape) for b in dataset.as_numpy_iterator())
    shapes = {shape for shape, _ in counts.most_common(max_shapes)}
    batches = []
    for batch in dataset.as_numpy_iterator():
        if tuple(batch["source"].shape) in shapes:
            batches.append({key: tf.constant(value) for key, value in batch.items()})
            if len(batches) >= num_batches:
                break
    log.info(
        "train bench: %d batches of shapes %s (the most common of %d)",
        len(batches),
        sorted(shapes),
        len(counts),
    )
    return batches


def make_train_step(
    model, config, *, precision: str, xla: bool, stock_adam: bool = False, ema_decay: float = 0.0
):
    """The real `TrainStep` with the trainer's optimizer settings, on the default strategy.

    `stock_adam`: Keras' own Adam (the stock reference) instead of the trainer's `nmt.optimizer.FusedAdam`.
    `ema_decay`: > 0 keeps an EMA of the weights, as `train.ema_decay` does (`benchmarks.train_ema`).
    """
    from nmt.optimizer import FusedAdam
    from nmt.schedule import WarmupInverseSqrt
    from nmt.train_step import TrainStep

    cfg = config.train
    optimizer = (keras.optimizers.Adam if stock_adam else FusedAdam)(
        learning_rate=WarmupInverseSqrt(cfg.learning_rate, cfg.warmup_steps),
        beta_1=cfg.beta_1,
        beta_2=cfg.beta_2,
        epsilon=cfg.epsilon,
        use_ema=ema_decay > 0,
        ema_momentum=ema_decay if ema_decay > 0 else 0.99,
    )
    optimizer.build(model.trainable_variables)
    return TrainStep(
        model=model,
        optimizer=optimizer,
        strategy=tf.distribute.get_strategy(),
        label_smoothing=cfg.label_smoothing,
        clipnorm=cfg.clipnorm,
        loss_scaling=precision == "mixed_float16",
        jit_compile=xla,
        loss_normaliser=config.data.batch_tokens,
    )


def train_pass(step, batches) -> float:
    """One optimizer step per batch; returns the last loss (reading it waits for the work to finish)."""
    metrics = None
    for batch in batches:
        metrics = step.step([batch])
    return float(metrics["loss"])


def build_pair(context: BenchContext, precision: str, config=None):
    """(ours, reference), built under `precision` with the same seed."""
    from transformer.model import build_model

    cfg, tokenizer = config or context.config, context.tokenizer
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(cfg.train.seed)
    ours = build_model(cfg.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    keras.utils.set_random_seed(cfg.train.seed)
    reference = build_reference_model(cfg.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    return ours, reference


def bench_train(
    context: BenchContext,
    emit,
    *,
    precisions=PRECISIONS,
    xla_settings=(False, True),
    num_batches: int = 3,
    max_shapes: int = 1,
    rounds: int = 2,
    peak_size: int = 2048,
    config=None,
) -> list[dict]:
    """Emits one `{"bench": "train", ...}` record per (precision, XLA) setting; returns them.

    `config`: the config to train with (default: the context's), e.g. one of `train_variants`; the context's
    tokenizer is used either way (batch sizes and bucket edges do not change it).
    """
    cfg = config or context.config
    model_cfg = cfg.model
    unmodelled = unmodelled_settings(model_cfg)
    if unmodelled:
        raise ValueError(f"train rows: the stock-Keras reference does not model {'; '.join(unmodelled)}")
    vocab_size = context.tokenizer.target_vocab_size
    batches = sample_batches(context, num_batches=num_batches, max_shapes=max_shapes, config=cfg)
    tokens = sum(target_tokens(b) for b in batches)
    shapes = sorted({tuple(b["source"].shape) for b in batches})
    # Warm-up: one step per distinct shape traces (and under XLA compiles) everything the timed passes run.
    warmup_batches = list({tuple(b["source"].shape): b for b in batches}.values())
    records = []
    try:
        for precision in precisions:
            measured_by_shape = matmul_peaks(precision, size=peak_size)
            measured_peak = max(measured_by_shape.values())
            ours, reference = build_pair(context, precision, cfg)
            non_embedding = non_embedding_parameters(
                ours,
                target_vocab_size=vocab_size,
                d_model=model_cfg.d_model,
                tie_output=model_cfg.tie_output,
            )
            flops = train_flops(
                batches,
                non_embedding=non_embedding,
                d_model=model_cfg.d_model,
                num_layers=model_cfg.num_layers,
            )
            steps = {
                "ours": make_train_step(ours, cfg, precision=precision, xla=False),
                "reference": make_train_step(reference, cfg, precision=precision, xla=False, stock_adam=True),
            }
            for xla in xla_settings:  # False, True (jit_compile) or "fusible" (train.xla: fusible, nmt.xla)
                for (
                    step
                ) in steps.values():  # the optimizer update keeps its trace; the gradients are traced anew
                    step.set_jit_compile(xla is True)
                    step.autocluster = xla == "fusible"
                traces_before = {name: step.num_traces for name, step in steps.items()}
                warmup = {
                    name: timed(lambda s=step: train_pass(s, warmup_batches))[0]
                    for name, step in steps.items()
                }
                # Under XLA the first pass after compiling ran much slower than the next (e.g. 6.07 s then 2.96 s,
                # docs/bench-train-xla-2026-12-05-avx2/run2.jsonl): one more untimed pass before the timed ones.
                warmup_passes = 2 if xla else 1
                for _ in range(warmup_passes - 1):
                    for name, step in steps.items():
                        warmup[name] += timed(lambda s=step: train_pass(s, batches))[0]
                # Our step projects the real target tokens only, except under XLA (static shapes).
                jit = xla is True
                bound = MatmulOnly(
                    batches, model_cfg, vocab_size, precision=precision, xla=jit, masked=not jit
                )
                warmup["matmul_only"] = timed(bound.run)[0]  # traces (and compiles) every shape
                seconds = {name: [] for name in (*steps, "matmul_only")}
                losses = {}
                for _ in range(rounds):
                    for name, step in steps.items():  # ours, reference, matmul-only, ours, reference, ...
                        elapsed, losses[name] = timed(lambda s=step: train_pass(s, batches))
                        seconds[name].append(elapsed)
                    seconds["matmul_only"].append(timed(bound.run)[0])
                step_seconds = median(seconds["ours"]) / len(batches)
                bound_seconds = median(seconds["matmul_only"]) / len(batches)
                bound_gflops = bound.flops / median(seconds["matmul_only"]) / 1e9
                peak, peak_source = row_peak(measured_peak, bound.flops / min(seconds["matmul_only"]) / 1e9)
                ours_rate = tokens / median(seconds["ours"])
                reference_rate = tokens / median(seconds["reference"])
                record = {
                    "bench": "train",
                    "precision": precision,
                    "xla": xla,
                    "tokens_per_sec": rounded(ours_rate),
                    "reference_tokens_per_sec": rounded(reference_rate),
                    "ratio": rounded(ours_rate / reference_rate, 3),
                    "mfu": rounded(flops / median(seconds["ours"]) / (peak * 1e9), 4),
                    "reference_mfu": rounded(flops / median(seconds["reference"]) / (peak * 1e9), 4),
                    "peak_gflops": rounded(peak),
                    "peak_source": peak_source,  # "measured" or "matmul_only" (its best round: faster)
                    "measured_peak_gflops": rounded(measured_peak),
                    "measured_peak_by_shape": {shape: rounded(g) for shape, g in measured_by_shape.items()},
                    "model_gflops_per_pass": rounded(flops / 1e9, 2),
                    "step_seconds": rounded(step_seconds, 6),
                    "matmul_only_seconds": rounded(bound_seconds, 6),  # per step, same batches
                    "overhead_ratio": rounded(step_seconds / bound_seconds, 2),
                    "matmul_only_gflops": rounded(bound_gflops),
                    "matmul_only_peak_fraction": rounded(bound_gflops / peak, 4),  # beside "mfu"
                    "matmul_gflops_per_pass": rounded(bound.flops / 1e9, 3),
                    "matmul_over_model_flops": rounded(
                        bound.flops / flops, 3
                    ),  # padding, source rows, biases
                    "seconds_matmul_only": [round(s, 3) for s in seconds["matmul_only"]],
                    "batch_tokens": cfg.data.batch_tokens,
                    "bucket_boundaries": list(cfg.data.bucket_boundaries),
                    "params": count_parameters(ours),
                    "reference_params": count_parameters(reference),
                    "expected_param_difference": parameter_difference(model_cfg),
                    "non_embedding_params": non_embedding,
                    "batches": len(batches),
                    "batch_shapes": [list(s) for s in shapes],
                    "target_tokens_per_pass": tokens,
                    "rounds": rounds,
                    "seconds_ours": [round(s, 3) for s in seconds["ours"]],
                    "seconds_reference": [round(s, 3) for s in seconds["reference"]],
                    "warmup_seconds": {name: round(s, 2) for name, s in warmup.items()},
                    "warmup_passes": warmup_passes,
                    "compiled_shapes": {
                        name: step.num_traces - traces_before[name] for name, step in steps.items()
                    },
                    "final_loss": {name: rounded(loss, 4) for name, loss in losses.items()},
                }
                records.append(emit(record))
                if precision == "float32" and not xla and cfg.data == context.config.data:
                    context.results["train_tokens_per_sec_float32"] = record["tokens_per_sec"]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return records
