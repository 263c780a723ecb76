"""Training speed as a run meets it: our TrainStep on the first N batches of the real seeded epoch, compiles included.

    python -m benchmarks.train_sequence [--config base.yaml] [--set ...] [--precision mixed_bfloat16]
        [--steps 400] [--xla off,fusible] [--tokenizer-dir runs/base/tokenizer]

`bench.py`'s train rows time a few batches of one shape after a warm-up, which hides what a setting costs per new
batch shape. Here every batch comes in training order, with every bucket shape the epoch holds (30 for base.yaml
on Multi30k), from a cold start: tracing, and under `fusible` XLA's compile of the clusters for each new shape (at
its first request: `nmt.xla` turns TensorFlow's lazy compilation off), are all on the clock.

Each XLA setting runs in a fresh process (its own traces and XLA caches), one after the other. One JSON line per
setting: target tokens/s over all steps and over windows of the later steps (steady state), the total seconds, and
the steps that took over 1.5 s (first steps, compiles) with their seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import nmt.xla  # noqa: E402, F401  (TF_XLA_FLAGS before TensorFlow reads them: fusible)
from benchmarks.common import positive_int

SLOW_STEP_SECONDS = 1.5


def measure(config, tokenizer, *, precision: str, xla: str, steps: int) -> dict:
    """Trains a fresh model for `steps` batches of the seeded epoch under `xla` ('off' or 'fusible'); the record."""
    import keras
    import numpy as np

    from benchmarks.train_speed import make_train_step
    from data.pipeline import make_train_dataset
    from nmt.precision import set_policy
    from transformer.model import build_model
    from transformer.vocab import PAD_ID

    iterator = iter(make_train_dataset(config.data, tokenizer, seed=config.train.seed, repeat=True))
    batches = [next(iterator) for _ in range(steps)]  # read before the clock starts
    set_policy(precision)
    keras.utils.set_random_seed(config.train.seed)
    model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    step = make_train_step(model, config, precision=precision, xla=False)
    step.autocluster = xla == "fusible"
    cumulative = np.cumsum([np.count_nonzero(b["target_out"].numpy() != PAD_ID) for b in batches])
    ends = []
    start = time.perf_counter()
    for batch in batches:  # nothing but the step on the clock
        bool(step.step([batch])["applied"])  # the trainer reads this every step
        ends.append(time.perf_counter() - start)
    ends = np.array(ends)

    shapes = {(tuple(b["source"].shape), tuple(b["target_in"].shape)) for b in batches}
    return {
        "bench": "train_sequence",
        "precision": precision,
        "xla": xla,
        "steps": steps,
        "batch_shapes": len(shapes),
        "target_tokens": int(cumulative[-1]),
        "seconds": round(float(ends[-1]), 2),
        "tokens_per_sec": round(float(cumulative[-1] / ends[-1]), 1),
        "tokens_per_sec_after": {
            str(first): rate_after(cumulative, ends, first)
            for first in (steps // 4, steps // 2, 3 * steps // 4)
        },
        "slow_steps": slow_steps(ends),
    }


def rate_after(cumulative, ends, first: int) -> float | None:
    """Target tokens/s over steps first+1 .. N (from 1), from the tokens through each step (`cumulative`) and the
    steps' end times (`ends`); None for fewer than two steps. Before 2026-12-07d over steps first+2 .. N."""
    if first >= len(ends) - 1:
        return None
    tokens, seconds = cumulative[-1], ends[-1]
    if first > 0:
        tokens, seconds = tokens - cumulative[first - 1], seconds - ends[first - 1]
    return round(float(tokens / seconds), 1)


def slow_steps(ends, threshold: float = SLOW_STEP_SECONDS) -> list[list]:
    """[step (from 1), seconds] of the steps that took over `threshold` seconds, from the steps' end times."""
    import numpy as np

    durations = np.diff(np.asarray(ends, dtype=np.float64), prepend=0.0)
    return [[i + 1, round(float(d), 2)] for i, d in enumerate(durations) if d > threshold]


def parse_args(argv=None) -> argparse.Namespace:
    from nmt.cli import add_set_argument

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="base.yaml")
    add_set_argument(parser)
    parser.add_argument(
        "--precision",
        default=None,
        choices=("float32", "mixed_float16", "mixed_bfloat16"),
        help="a Keras policy (default: the config's, resolved)",
    )
    parser.add_argument("--steps", type=positive_int, default=400)
    parser.add_argument("--xla", default="off,fusible", help="comma-separated: off, fusible")
    parser.add_argument("--tokenizer-dir", default="runs/base/tokenizer", help="used if it holds a tokenizer")
    parser.add_argument(
        "--one", action="store_true", help=argparse.SUPPRESS
    )  # the child process: one setting
    args = parser.parse_args(argv)
    args.xla = [x for x in args.xla.split(",") if x]
    if not args.xla or any(x not in ("off", "fusible") for x in args.xla):
        parser.error(f"--xla: expected off and/or fusible, got {args.xla}")
    if args.steps < 2:
        parser.error(f"--steps: must be at least 2, got {args.steps}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.one:  # one fresh process per setting, in order
        base = list(argv if argv is not None else sys.argv[1:])
        for xla in args.xla:
            child = [sys.executable, "-m", "benchmarks.train_sequence", *base, "--xla", xla, "--one"]
            code = subprocess.run(child, check=False).returncode
            if code:
                return code
        return 0
    from pathlib import Path

    from benchmarks.common import BenchContext
    from nmt.config import load_config
    from nmt.precision import resolve_precision

    config = load_config(args.config, args.overrides)
    context = BenchContext(config, Path(args.tokenizer_dir))
    precision = args.precision or resolve_precision(config.train.precision, "cpu")
    try:
        record = measure(config, context.tokenizer, precision=precision, xla=args.xla[0], steps=args.steps)
    finally:
        context.close()
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    from nmt import cli

    cli.stop_on_sigterm()
    cli.run(main)  # a config or data error: one line, exit 2 or 1
