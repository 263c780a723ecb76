"""Training tokens/s reading the prepared split from its files vs loaded into memory, at equal batches, in one process.

    python -m benchmarks.prepared_speed --config base.yaml [--set ...] [--rounds 20] [--block 10] [--warmup 4]

The two paths differ only in where the split's arrays live: `PreparedSplit.open(dir, in_memory=False)` reads each
batch's pairs from the files with `pread` (what a large corpus gets), `in_memory=True` reads the files into host
memory first (what a split under `data.store.IN_MEMORY_BYTES` gets automatically). Everything else is the same code: `data.pipeline.train_batches`
with the run's seed, so both iterators yield the very same batches in the same order, and the real
`nmt.train_step.TrainStep` on the config's model and precision (as train.py resolves them). The comparison:

    warm up: `warmup` steps from each iterator (traces the step for the first shapes)
    `rounds` times: `block` steps from one iterator, then `block` from the other (which one goes first alternates),
                    each block timed from its first `next(iterator)` to its last step's loss
    tokens/s per path = target tokens of its blocks / their seconds (equal tokens: the same batches, checked)

Interleaving in one process exposes both paths to the same load drift, tracing and allocator state. A path's
prefetch keeps filling while the other path trains, so both gain a few ready batches per block; blocks of 10+
steps of about a second, against a gather of about a millisecond (`input_*` below), keep that crossover negligible.
Also measured: the input pipeline alone (`input_batches_per_sec_*`: batches/s pulled with no training step, after
the first batch), which bounds how much the reading path could weigh on a step. Both reads are from a warm page
cache (loading into memory reads the whole files just before). Prints one JSON line prefixed `PREPARED_SPEED `:
`prepared_vs_memory` = file tokens/s / in-memory tokens/s (the issue's target: >= 0.97), and its value per round.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks.common import non_negative_int, positive_int

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MARK = "PREPARED_SPEED "
PATHS = ("file", "memory")


def _target_tokens(batch) -> int:
    return int((batch["target_out"].numpy() != 0).sum())


def input_speed(iterators: dict, batches: int) -> dict[str, float]:
    """Batches/s of each iterator alone (no training step), alternating the paths twice; the better pass each."""
    best = dict.fromkeys(iterators, 0.0)
    for _ in range(2):
        for name, iterator in iterators.items():
            start = time.perf_counter()
            for _ in range(batches):
                next(iterator)
            best[name] = max(best[name], batches / (time.perf_counter() - start))
    return best


def main(argv: list[str] | None = None) -> int:
    from common.config_tree import add_set_argument  # TensorFlow only after parsing: --help is quick

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    add_set_argument(parser)
    parser.add_argument("--rounds", type=positive_int, default=20)
    parser.add_argument("--block", type=positive_int, default=10)
    parser.add_argument("--warmup", type=non_negative_int, default=4)
    parser.add_argument("--input-batches", type=positive_int, default=200)
    args = parser.parse_args(argv)

    import keras

    from benchmarks.train_speed import make_train_step
    from data.pipeline import split_tables, train_batches
    from data.prepare import prepare
    from data.store import PreparedSplit
    from nmt.config import load_config
    from nmt.precision import resolve_precision, resolve_xla, set_policy
    from transformer.model import build_model

    config = load_config(args.config, args.overrides)
    seed = config.train.seed
    tokenizer, splits = prepare(config.data, progress=False)
    directory = splits[config.data.train_split]
    opened = {
        "file": PreparedSplit.open(directory, in_memory=False),
        "memory": PreparedSplit.open(directory, in_memory=True),
    }

    def fresh_iterators() -> dict:
        # with the config's subword dropout, as training reads them (before 2026-12-07d: a traceback with it on)
        tables = split_tables(config.data, tokenizer)
        return {
            name: iter(train_batches(config.data, split, seed=seed, tables=tables))
            for name, split in opened.items()
        }

    iterators = fresh_iterators()
    for iterator in iterators.values():
        next(iterator)  # planning epoch 0 and the pipeline's start are not the steady state
    input_rates = input_speed(iterators, args.input_batches)

    precision = resolve_precision(config.train.precision, "cpu")
    xla = resolve_xla(config.train.xla, "cpu")
    set_policy(precision)
    keras.utils.set_random_seed(seed)
    model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    step = make_train_step(model, config, precision=precision, xla=xla)

    iterators = fresh_iterators()  # both from the first batch of epoch 0 again
    for _ in range(args.warmup):
        for iterator in iterators.values():
            step.step([next(iterator)])
    traces = step.num_traces
    seconds, tokens, rounds = dict.fromkeys(PATHS, 0.0), dict.fromkeys(PATHS, 0), []
    for round_index in range(args.rounds):
        order = PATHS if round_index % 2 == 0 else PATHS[::-1]
        this_round = {}
        for name in order:
            block_tokens = 0
            start = time.perf_counter()
            for _ in range(args.block):
                batch = next(iterators[name])
                block_tokens += _target_tokens(batch)
                metrics = step.step([batch])
            float(metrics["loss"])  # waits for the block's last step
            this_round[name] = (time.perf_counter() - start, block_tokens)
            seconds[name] += this_round[name][0]
            tokens[name] += block_tokens
        if this_round["file"][1] != this_round["memory"][1]:
            raise RuntimeError(f"round {round_index}: the two paths gave different batches {this_round}")
        rounds.append(round(this_round["memory"][0] / this_round["file"][0], 4))
    speed = {name: tokens[name] / seconds[name] for name in PATHS}
    record = {
        "train_split_pairs": len(opened["memory"]),
        "precision": precision,
        "xla": xla,
        "rounds": args.rounds,
        "block_steps": args.block,
        "tokens_per_sec_file": round(speed["file"], 1),
        "tokens_per_sec_memory": round(speed["memory"], 1),
        "prepared_vs_memory": round(speed["file"] / speed["memory"], 4),
        "prepared_vs_memory_per_round": rounds,
        "traces_while_timed": step.num_traces - traces,
        "input_batches_per_sec_file": round(input_rates["file"], 1),
        "input_batches_per_sec_memory": round(input_rates["memory"], 1),
        "step_seconds": round(sum(seconds.values()) / (2 * args.rounds * args.block), 3),
    }
    print(MARK + json.dumps(record), file=sys.stderr, flush=True)
    del (
        iterators
    )  # stop the input pipelines before the interpreter exits (see benchmarks.train_start.run_child)
    return 0


if __name__ == "__main__":
    from nmt import cli

    cli.stop_on_sigterm()
    cli.run(main)  # a config or data error: one line, exit 2 or 1
