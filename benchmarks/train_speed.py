"""Training throughput: our model against the stock-Keras reference, per precision and XLA setting.

Both models train with the project's real `nmt.train_step.TrainStep` (Adam with the warmup schedule, label
smoothing, global clipnorm, loss scaling under float16), on the same fixed list of Multi30k batches from
`make_train_dataset`, in the same process. For each (precision, XLA) setting:

    set the global Keras policy, build ours and the reference (same seed), once per precision; the XLA
    settings of a precision share the models and their optimizer-update trace (`TrainStep.set_jit_compile`)
    warm up: one step of each model per batch shape (traces / XLA compiles every shape the timed passes meet)
    `rounds` times: one timed pass of ours, then one of the reference (alternated, so load drifts hit both)
    tokens/s = target tokens of the batches / pass seconds, median over the rounds

MFU divides the model FLOPs/s (`benchmarks.flops`) by a matmul peak measured in the same process, in the compute
dtype of the precision. Batches: the first `num_batches` of the seeded epoch whose shape is among the epoch's
`max_shapes` most common shapes, so XLA compiles at most `max_shapes` programs per model, on the shapes training
meets most.
"""

from __future__ import annotations

import collections
import logging

import keras
import tensorflow as tf

from benchmarks.common import PRECISIONS, BenchContext, median, rounded, timed
from benchmarks.flops import (
    count_parameters,
    matmul_peak_gflops,
    non_embedding_parameters,
    target_tokens,
    train_flops,
)
from benchmarks.reference_model import build_reference_model, parameter_difference

log = logging.getLogger("benchmarks")


def sample_batches(context: BenchContext, *, num_batches: int, max_shapes: int) -> list[dict]:
    """The first `num_batches` batches of the seeded epoch whose shape is among its `max_shapes` most common ones."""
    from data.pipeline import make_train_dataset

    cfg = context.config
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


def make_train_step(model, config, *, precision: str, xla: bool):
    """The real `TrainStep` with the trainer's optimizer settings, on the default strategy."""
    from nmt.schedule import WarmupInverseSqrt
    from nmt.train_step import TrainStep

    cfg = config.train
    optimizer = keras.optimizers.Adam(
        learning_rate=WarmupInverseSqrt(cfg.learning_rate, cfg.warmup_steps),
        beta_1=cfg.beta_1,
        beta_2=cfg.beta_2,
        epsilon=cfg.epsilon,
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


def _train_pass(step, batches) -> float:
    """One optimizer step per batch; returns the last loss (reading it waits for the work to finish)."""
    metrics = None
    for batch in batches:
        metrics = step.step([batch])
    return float(metrics["loss"])


def build_pair(context: BenchContext, precision: str):
    """(ours, reference), built under `precision` with the same seed."""
    from transformer.model import build_model

    cfg, tokenizer = context.config, context.tokenizer
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
) -> list[dict]:
    """Emits one `{"bench": "train", ...}` record per (precision, XLA) setting; returns them."""
    cfg = context.config
    model_cfg = cfg.model
    batches = sample_batches(context, num_batches=num_batches, max_shapes=max_shapes)
    tokens = sum(target_tokens(b) for b in batches)
    shapes = sorted({tuple(b["source"].shape) for b in batches})
    # Warm-up: one step per distinct shape traces (and under XLA compiles) everything the timed passes run.
    warmup_batches = list({tuple(b["source"].shape): b for b in batches}.values())
    records = []
    try:
        for precision in precisions:
            peak = matmul_peak_gflops(precision, size=peak_size)
            ours, reference = build_pair(context, precision)
            non_embedding = non_embedding_parameters(
                ours,
                target_vocab_size=context.tokenizer.target_vocab_size,
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
                "reference": make_train_step(reference, cfg, precision=precision, xla=False),
            }
            for xla in xla_settings:
                for (
                    step
                ) in steps.values():  # the optimizer update keeps its trace; the gradients are traced anew
                    step.set_jit_compile(xla)
                traces_before = {name: step.num_traces for name, step in steps.items()}
                warmup = {
                    name: timed(lambda s=step: _train_pass(s, warmup_batches))[0]
                    for name, step in steps.items()
                }
                seconds = {name: [] for name in steps}
                losses = {}
                for _ in range(rounds):
                    for name, step in steps.items():  # ours, reference, ours, reference, ...
                        elapsed, losses[name] = timed(lambda s=step: _train_pass(s, batches))
                        seconds[name].append(elapsed)
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
                    "model_gflops_per_pass": rounded(flops / 1e9, 2),
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
                    "compiled_shapes": {
                        name: step.num_traces - traces_before[name] for name, step in steps.items()
                    },
                    "final_loss": {name: rounded(loss, 4) for name, loss in losses.items()},
                }
                records.append(emit(record))
                if precision == "float32" and not xla:
                    context.results["train_tokens_per_sec_float32"] = record["tokens_per_sec"]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return records
