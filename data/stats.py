"""Corpus, tokenizer and input-pipeline statistics as one JSON line.

    python -m data.stats --config base.yaml [--set data.vocab_size=4000 ...] [--tokenizer-dir DIR]

Keys: `splits` (split -> pairs), `vocab_size` (padded target vocabulary; `source_vocab_size` too),
`roundtrip_exact` (fraction of validation sentences, source and target sides together, with
detokenize(tokenize(x)) == x; per side in `roundtrip_exact_source` / `_target`; null without validation
sentences), `padding_waste` (PAD slots / all slots of source and target_out over one training epoch),
`num_shapes` (distinct batch shapes in that epoch), `num_buckets`, `bucket_edges`, `num_batches`, `dropped_long`
(training pairs over max_length), `tokens_per_sec` (target tokens per second of the pipeline alone over a second
epoch, cache warm) and `seconds` (wall time).

The tokenizer is loaded from `--tokenizer-dir` if it holds one, else trained into it as `data.prepare` trains the
cached one (its seed and threads); without `--tokenizer-dir`, the cached tokenizer of `data.prepare` is used. The splits are read from the cache (prepared first if missing).
The seed of the batch order is `train.seed`. stdout carries only the JSON line; logs go to stderr. A config error
exits 2, a data error 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

DEFAULT_SEED = 1234  # nmt.config.TrainConfig.seed


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    from common.config_tree import add_set_argument

    parser = argparse.ArgumentParser(prog="python -m data.stats", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML config (a bare name is looked up in configs/)")
    add_set_argument(parser)
    parser.add_argument(
        "--tokenizer-dir",
        help="load the tokenizer from here, or train it into here if absent (default: the cached tokenizer)",
    )
    return parser.parse_args(argv)


def _roundtrip(strings: list[str], tokenize, detokenize, lowercase: bool = False) -> int:
    """How many strings have detokenize(tokenize(s)) == s (with `lowercase`: s lowercased as the tokenizer does,
    lossless up to case; before 2026-12-07d compared with s, and a lowercasing tokenizer reported 0)."""
    if not strings:
        return 0
    import tensorflow as tf

    from data.tokenizer_training import lowercase_table

    back = detokenize(tokenize(tf.constant(strings))).numpy()
    expected = [s.translate(lowercase_table()) for s in strings] if lowercase else strings
    return sum(b.decode("utf-8") == s for b, s in zip(back, expected))


def _fraction(count: int, total: int) -> float | None:
    """count / total rounded for the report; None (JSON null) for no strings: no fraction to report."""
    return round(count / total, 5) if total else None


def _epoch_stats(dataset) -> dict:
    """Shapes, padding and token counts of one pass over a batched dataset."""
    from common.special_ids import PAD_ID

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


def compute_stats(cfg, seed: int, tokenizer_dir: Path | None) -> dict:
    """All statistics for a `DataConfig`; trains a tokenizer into `tokenizer_dir` if none is there.

    Args:
      cfg: the data config.
      seed: the seed of the batch order.
      tokenizer_dir: where the tokenizer is (or is trained into); None: the cached tokenizer of `data.prepare`.
    """
    from data.corpus import load_text_pairs, split_sizes
    from data.errors import DataError
    from data.pipeline import bucket_edges, open_split, split_tables, train_batches
    from data.prepare import cached_tokenizer, train_cache_tokenizer
    from data.tokenizer import Tokenizer

    log = logging.getLogger("data.stats")
    splits = split_sizes(cfg)
    if tokenizer_dir is None:
        tokenizer = cached_tokenizer(cfg)
    elif any(tokenizer_dir.glob("*.model")):
        log.info("loading the tokenizer from %s", tokenizer_dir)
        tokenizer = Tokenizer.load(tokenizer_dir)
    else:
        log.info("training the tokenizer into %s", tokenizer_dir)
        try:
            tokenizer_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a file there, or no write access
            raise DataError(f"--tokenizer-dir {tokenizer_dir} cannot be a directory: {err}") from err
        # as data.prepare trains the cached one (its seed and threads, not train.seed's): the statistics are those
        # of the tokenizer a run of this config would train; into a staging folder, the model files moved into
        # DIR once whole (a failure leaves no model file there to be loaded next time)
        staging = tokenizer_dir / f".partial-{os.getpid()}"
        try:
            train_cache_tokenizer(cfg, staging)
            for model in sorted(staging.glob("*.model")):
                os.replace(model, tokenizer_dir / model.name)
        except OSError as err:
            raise DataError(
                f"cannot write the tokenizer into --tokenizer-dir {tokenizer_dir}: {err}"
            ) from err
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        tokenizer = Tokenizer.load(tokenizer_dir)
    sources, targets = load_text_pairs(cfg, cfg.validation_split)
    exact_source = _roundtrip(sources, tokenizer.tokenize_source, tokenizer.detokenize_source, cfg.lowercase)
    exact_target = _roundtrip(targets, tokenizer.tokenize_target, tokenizer.detokenize_target, cfg.lowercase)

    train = open_split(cfg, tokenizer, cfg.train_split)
    max_pieces = cfg.max_length - 1
    dropped = int(((train.source_lengths > max_pieces) | (train.target_lengths > max_pieces)).sum())
    # with subword dropout as training has it (before 2026-12-07d: a traceback, the tables not given)
    dataset = train_batches(cfg, train, seed=seed, repeat=False, tables=split_tables(cfg, tokenizer))
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
        "roundtrip_exact": _fraction(exact_source + exact_target, len(sources) + len(targets)),
        "roundtrip_exact_source": _fraction(exact_source, len(sources)),
        "roundtrip_exact_target": _fraction(exact_target, len(targets)),
        "padding_waste": round(first["waste"], 4),
        "num_shapes": first["shapes"],
        "num_buckets": len(edges),
        "bucket_edges": edges,
        "num_batches": first["batches"],
        "dropped_long": dropped,
        "train_target_tokens": second["target_tokens"],
        "tokens_per_sec": round(second["target_tokens"] / max(elapsed, 1e-9)),
    }


def _seed(tree: dict) -> int:
    """train.seed of the config tree (the `train:` section belongs to `nmt`; only this key is read here)."""
    train = tree.get("train") or {}
    if not isinstance(train, dict):
        from common.config_tree import ConfigError

        raise ConfigError(f"train: expected a mapping, got {type(train).__name__} {train!r}")
    seed = train.get("seed", DEFAULT_SEED)
    if not isinstance(seed, int) or isinstance(seed, bool):
        from common.config_tree import ConfigError

        raise ConfigError(f"train.seed: expected int, got {type(seed).__name__} {seed!r}")
    if not 0 <= seed <= 2**32 - 1:  # train.py's range (NumPy's): before, a traceback from inside the pipeline
        from common.config_tree import ConfigError

        raise ConfigError(f"train.seed: must be in [0, {2**32 - 1}], got {seed}")
    return seed


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger("absl").setLevel(logging.WARNING)
    from common.config_tree import ConfigError
    from data.config import load_data_config, refuse_fine_tuning_without_tokenizer

    try:
        cfg, tree = load_data_config(args.config, args.overrides)
        refuse_fine_tuning_without_tokenizer(tree, args.tokenizer_dir, "--tokenizer-dir")
        seed = _seed(tree)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from data.errors import DataError

    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # TFDS prints its progress to stdout
            stats = compute_stats(cfg, seed, Path(args.tokenizer_dir) if args.tokenizer_dir else None)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    stats["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
