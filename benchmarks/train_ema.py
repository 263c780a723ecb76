"""The EMA's cost per training step: our step with `train.ema_decay` against the same step without, in one run.

With `train.ema_decay > 0` the trainer's optimizer (`nmt.optimizer.FusedAdam`, Keras' `use_ema`) keeps a second
copy of every trainable weight and moves it toward the weights after each update. What that costs is measured here,
for the precision `precision: auto` picks on this machine (the config's `train.precision` when it names one), with
the trainer's default on CPU (no XLA):

    build our model twice with the same seed; one TrainStep without EMA, one with ema_decay
    warm up: one step of each per batch shape (traces everything the timed passes run)
    `rounds` times: one timed pass without EMA, then one with (alternated, so load drifts hit both)

Record `{"bench": "train_ema"}`: `tokens_per_sec` (with EMA) and `without_ema_tokens_per_sec`, `ratio` (with /
without; 1.0 = free), `added_step_seconds` (median seconds per step with minus without), `ema_megabytes` (the
copy's size), and `ema_update_error`: after the timed passes, one more step of the EMA model, its EMA recomputed in
NumPy from the copy before the step and the weights after it (``decay x before + (1 - decay) x weights``); the
largest absolute difference, so a step that skipped or mis-weighted the update shows.
"""

from __future__ import annotations

import logging

import keras
import numpy as np

from benchmarks.common import BenchContext, median, rounded, timed
from benchmarks.flops import target_tokens
from benchmarks.train_speed import make_train_step, sample_batches, train_pass

log = logging.getLogger("benchmarks")


def main_job_precision(config) -> str:
    """The Keras policy the trainer would use for `config` on this machine (`train.precision`, `auto` resolved)."""
    from nmt.precision import device_kind, resolve_precision

    return resolve_precision(config.train.precision, device_kind())


def ema_pairs(optimizer) -> list[tuple]:
    """(EMA copy, weight) per trainable weight (Keras keeps the copies in `_model_variables_moving_average`)."""
    averages = optimizer._model_variables_moving_average
    return [(a, w) for a, w in zip(averages, optimizer._trainable_variables, strict=True) if a is not None]


def ema_update_error(step, batch, decay: float) -> float:
    """One more step of `step` on `batch`; the largest |EMA - NumPy's decay x before + (1 - decay) x weights|."""
    pairs = ema_pairs(step.optimizer)
    before = [np.array(a) for a, _ in pairs]
    train_pass(step, [batch])
    errors = [
        np.max(np.abs(np.array(a) - (decay * b + (1.0 - decay) * np.array(w))))
        for (a, w), b in zip(pairs, before, strict=True)
    ]
    return float(max(errors))


def bench_train_ema(
    context: BenchContext,
    emit,
    *,
    ema_decay: float,
    precision: str | None = None,
    num_batches: int = 3,
    max_shapes: int = 1,
    rounds: int = 2,
    config=None,
) -> dict:
    """Emits and returns one `{"bench": "train_ema"}` record (see the module docstring).

    `ema_decay`: the decay whose cost is measured (`bench.py --ema-decay`, default 0.998). `precision`: the Keras
    policy (default: the main job's on this machine, `main_job_precision`).
    """
    from transformer.model import build_model

    if not 0.0 < ema_decay < 1.0:
        raise ValueError(f"ema_decay must be in (0, 1), got {ema_decay}")
    cfg = config or context.config
    precision = precision or main_job_precision(cfg)
    tokenizer = context.tokenizer
    batches = sample_batches(context, num_batches=num_batches, max_shapes=max_shapes, config=cfg)
    tokens = sum(target_tokens(b) for b in batches)
    warmup_batches = list({tuple(b["source"].shape): b for b in batches}.values())
    try:
        keras.mixed_precision.set_global_policy(precision)
        steps = {}
        for name, decay in (("without_ema", 0.0), ("ema", ema_decay)):
            keras.utils.set_random_seed(cfg.train.seed)
            model = build_model(cfg.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
            steps[name] = make_train_step(model, cfg, precision=precision, xla=False, ema_decay=decay)
        for step in steps.values():
            train_pass(step, warmup_batches)
        seconds = {name: [] for name in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                seconds[name].append(timed(lambda s=step: train_pass(s, batches))[0])
        update_error = ema_update_error(steps["ema"], batches[0], ema_decay)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    averages = [a for a, _ in ema_pairs(steps["ema"].optimizer)]
    with_rate = tokens / median(seconds["ema"])
    without_rate = tokens / median(seconds["without_ema"])
    record = {
        "bench": "train_ema",
        "precision": precision,
        "xla": False,
        "ema_decay": ema_decay,
        "tokens_per_sec": rounded(with_rate),
        "without_ema_tokens_per_sec": rounded(without_rate),
        "ratio": rounded(with_rate / without_rate, 3),
        "added_step_seconds": rounded(
            (median(seconds["ema"]) - median(seconds["without_ema"])) / len(batches), 5
        ),
        "ema_megabytes": rounded(
            sum(np.prod(a.shape) * np.dtype(a.dtype).itemsize for a in averages) / 2**20, 2
        ),
        "ema_variables": len(averages),
        "ema_update_error": update_error,
        "batches": len(batches),
        "target_tokens_per_pass": tokens,
        "rounds": rounds,
        "seconds_ema": [round(s, 3) for s in seconds["ema"]],
        "seconds_without_ema": [round(s, 3) for s in seconds["without_ema"]],
    }
    log.info("train_ema: %s with EMA / without = %.3f", precision, record["ratio"] or float("nan"))
    return emit(record)
