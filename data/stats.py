"""Corpus, tokenizer and input-pipeline statistics as one JSON line.

    python -m data.stats --config base.yaml [--set data.vocab_size=4000 ...] [--tokenizer-dir DIR]

Keys: `splits` (split -> pairs), `vocab_size` (padded target vocabulary; `source_vocab_size` too),
`roundtrip_exact` (fraction of validation sentences, source and target sides together, with
detokenize(tokenize(x)) == x; per side in `roundtrip_exact_source` / `_target`), `padding_waste` (PAD slots /
all slots of source and target_out over one training epoch), `num_shapes` (distinct batch shapes in that epoch),
`num_buckets`, `bucket_edges`, `num_batches`, `dropped_long` (training pairs over max_length), `tokens_per_sec`
(target tokens per second of the pipeline alone over a second epoch, cache warm) and `seconds` (wall time).

The tokenizer is loaded from `--tokenizer-dir` if it holds one, else trained (into that directory, or a temporary
one). stdout carries only the JSON line; logs go to stderr. A config error exits 2, a data error 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m data.stats", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML config (a bare name is looked up in configs/)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. data.vocab_size=4000"
    )
    parser.add_argument(
        "--tokenizer-dir", help="load the tokenizer from here, or train it into here if absent"
    )
    return parser.parse_args(argv)


def _roundtrip(strings: list[str], tokenize, detokenize) -> float:
    """Fraction of strings with detokenize(tokenize(s)) == s."""
    if not strings:
        return 1.0
    import tensorflow as tf

    back = detokenize(tokenize(tf.constant(strings))).numpy()
    return sum(b.decode("utf-8") == s for b, s in zip(back, strings)) / len(strings)


def _epoch_stats(dataset) -> dict:
    """Shapes, padding and token counts of one pass over a batched dataset."""
    from transformer.vocab import PAD_ID

    shapes, slots, pads, target_tokens, batches = set(), 0, 0, 0, 0
    for batch in dataset.as_numpy_iterator():
        source, target = batch["source"], batch["target_out"]
        shapes.add((source.shape, target.shape))
        slots += source.size + target.size
        pads += int((source == PAD_ID).sum() + (target == PAD_ID).sum())
        target_tokens += int((target != PAD_ID).sum())
        batches += 1
    return {
        "shapes": len(shapes),
        "waste": pads / max(slots, 1),
        "target_tokens": target_tokens,
        "batches": batches,
    }


def compute_stats(config, tokenizer_dir: Path) -> dict:
    """All statistics for a loaded `nmt.config.Config`; trains a tokenizer into `tokenizer_dir` if none there."""
    from data.corpus import load_text_pairs, split_sizes
    from data.pipeline import bucket_edges, train_batches, train_pieces
    from data.tokenizer import Tokenizer, train_tokenizer

    cfg, seed = config.data, config.train.seed
    log = logging.getLogger("data.stats")
    splits = split_sizes(cfg)
    if any(tokenizer_dir.glob("*.model")):
        log.info("loading the tokenizer from %s", tokenizer_dir)
        tokenizer = Tokenizer.load(tokenizer_dir)
    else:
        log.info("training the tokenizer into %s", tokenizer_dir)
        tokenizer = train_tokenizer(cfg, tokenizer_dir, seed=seed)
    sources, targets = load_text_pairs(cfg, cfg.validation_split)
    exact_source = _roundtrip(sources, tokenizer.tokenize_source, tokenizer.detokenize_source)
    exact_target = _roundtrip(targets, tokenizer.tokenize_target, tokenizer.detokenize_target)
    exact = (exact_source * len(sources) + exact_target * len(targets)) / max(len(sources) + len(targets), 1)

    corpus, dropped = train_pieces(cfg, tokenizer)
    dataset = train_batches(cfg, corpus, seed=seed, repeat=False)
    first = _epoch_stats(dataset)  # also warms the pipeline (tracing, tokenized corpus)
    start = time.perf_counter()
    second = _epoch_stats(dataset)
    elapsed = time.perf_counter() - start
    edges = bucket_edges(cfg)
    return {
        "splits": splits,
        "vocab_size": tokenizer.target_vocab_size,
        "source_vocab_size": tokenizer.source_vocab_size,
        "joint_vocab": tokenizer.joint,
        "roundtrip_exact": round(exact, 5),
        "roundtrip_exact_source": round(exact_source, 5),
        "roundtrip_exact_target": round(exact_target, 5),
        "padding_waste": round(first["waste"], 4),
        "num_shapes": first["shapes"],
        "num_buckets": len(edges),
        "bucket_edges": edges,
        "num_batches": first["batches"],
        "dropped_long": dropped,
        "train_target_tokens": second["target_tokens"],
        "tokens_per_sec": round(second["target_tokens"] / max(elapsed, 1e-9)),
    }


def _run(config, tokenizer_dir: str | None) -> dict:
    if tokenizer_dir:
        path = Path(tokenizer_dir)
        path.mkdir(parents=True, exist_ok=True)
        return compute_stats(config, path)
    with tempfile.TemporaryDirectory(prefix="spm-") as tmp:
        return compute_stats(config, Path(tmp))


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from nmt.config import ConfigError, load_config

    try:
        config = load_config(args.config, args.set)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from data.errors import DataError

    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # TFDS prints its progress to stdout
            stats = _run(config, args.tokenizer_dir)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    stats["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
