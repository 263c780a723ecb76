"""Prepare once, stream always: train the tokenizer and tokenize the corpus into the cache.

    python -m data.prepare --config base.yaml [--set data.folder=DIR ...] [--no-progress]
    python -m data.prepare --config ft.yaml --tokenizer-dir runs/base/tokenizer   # a fine-tuning config (init_from)

Trains SentencePiece once on a bounded random sample of the train split (data.tokenizer_max_sentences) and
tokenizes the train, validation and test splits in one streaming pass each into `data.store` arrays under
`data.cache_dir` (see `data.cache` for the keys). Memory stays bounded by one chunk of pairs whatever the corpus
size; a progress bar shows pairs/s. Rerunning with a complete cache does nothing and says so. `train.py` calls the
same functions when the cache is missing. `--tokenizer-dir DIR` tokenizes with the SentencePiece model(s) in DIR
instead (e.g. a run's tokenizer/): a config that fine-tunes another run (`train.init_from`) needs it, since its run
tokenizes with the parent's tokenizer; without it such a config is refused (a tokenizer trained here would be of no
use). Exit codes: 0 done, 1 data error, 2 config error.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from data import cache
from data.cleaning import DropCounts, clean
from data.config import DataConfig
from data.errors import DataError
from data.store import MANIFEST, PreparedSplit, SplitWriter, read_manifest, values_dtype
from data.stream import CHUNK_PAIRS, count_pairs, split_exists, split_identity, stream_pairs

log = logging.getLogger(__name__)


def tokenizer_threads() -> int:
    """SentencePiece's threads for encoding (the ids do not depend on them; training uses a fixed count)."""
    return max(1, min(os.cpu_count() or 1, 16))


def train_cache_tokenizer(cfg: DataConfig, out_dir: Path):
    """Trains into `out_dir` the tokenizer the cache holds for `cfg` (data.stats trains this way too): its seed and
    thread count are fixed (`cache.TOKENIZER_SEED`, `cache.TOKENIZER_TRAIN_THREADS`), so the same settings and
    corpus give the same model on any machine."""
    from data.tokenizer_training import train_tokenizer

    return train_tokenizer(cfg, out_dir, seed=cache.TOKENIZER_SEED, num_threads=cache.TOKENIZER_TRAIN_THREADS)


def cached_tokenizer(cfg: DataConfig, *, chief: bool = True):
    """The tokenizer of this corpus and these settings: loaded from the cache, else trained into it.

    A non-chief worker reads the chief's (it starts once the chief has prepared) instead of training it.
    """
    from data.tokenizer import Tokenizer

    inputs = cache.tokenizer_key_inputs(cfg, split_identity(cfg, cfg.train_split))
    final = cache.tokenizer_dir(cfg, inputs)
    if not final.exists() and not chief:
        cache.require(final, "the tokenizer")
    if not final.exists():
        with cache.exclusive(final, cfg=cfg):
            if not final.exists():
                partial = cache.fresh_staging(final)
                log.info(
                    "training the SentencePiece tokenizer on the %s split into %s", cfg.train_split, final
                )
                try:
                    train_cache_tokenizer(cfg, partial)
                except DataError:  # the corpus or the settings refused it: nothing stays
                    shutil.rmtree(partial, ignore_errors=True)
                    raise
                except OSError as err:  # a full disk: nothing stays either
                    shutil.rmtree(partial, ignore_errors=True)
                    raise DataError(f"cannot write the tokenizer into {partial}: {err}") from err
                cache.publish(partial, final)
    else:
        log.info("tokenizer from the cache: %s", final)
    try:
        return Tokenizer.load(final)
    except DataError as err:
        raise DataError(f"the cached tokenizer is damaged ({err}): delete {final} and prepare again") from err


def run_tokenizer(cfg: DataConfig, directory: Path, *, chief: bool = True):
    """The tokenizer of a run, kept in `directory` (a run directory's own copy, so the run stays self-describing).

    `directory` already holding a model (a resumed run, or one from before the cache) wins. Else the cached
    tokenizer is used (trained first if missing) and the chief copies it into `directory` atomically; other
    workers only read.
    """
    import shutil

    from data.tokenizer import Tokenizer

    directory = Path(directory)
    if directory.is_dir() and any(directory.glob("*.model")):
        return Tokenizer.load(directory)
    tokenizer = cached_tokenizer(cfg, chief=chief)
    if not chief:
        return tokenizer
    partial = directory.with_name(directory.name + ".partial")
    try:
        if partial.exists():
            shutil.rmtree(partial)
        tokenizer.save(partial)
        os.replace(partial, directory)  # atomic: a crash leaves no half-written tokenizer behind
    except OSError as err:  # a full disk, a read-only run directory
        shutil.rmtree(partial, ignore_errors=True)
        raise DataError(f"cannot write the run's tokenizer into {directory}: {err}") from err
    return Tokenizer.load(directory)


def _tokenize_into(
    cfg: DataConfig, tokenizer, split: str, directory: Path, info: dict, progress: bool
) -> None:
    import sentencepiece as spm
    from tqdm import tqdm

    from common.progress_bars import bar_settings

    source_model, target_model = tokenizer.models
    source_sp = spm.SentencePieceProcessor(model_proto=source_model)
    target_sp = source_sp if target_model is None else spm.SentencePieceProcessor(model_proto=target_model)
    vocab = max(source_sp.get_piece_size(), target_sp.get_piece_size())
    writer = SplitWriter(directory, values_dtype(vocab))
    counts, threads, start = DropCounts(), tokenizer_threads(), time.perf_counter()
    total = count_pairs(cfg, split)
    bar = tqdm(
        total=total, unit="pairs", unit_scale=True, desc=f"preparing {split}", disable=not progress,
        **bar_settings(terminal=1.0),
    )  # fmt: skip
    try:
        for raw_sources, raw_targets in stream_pairs(cfg, split, CHUNK_PAIRS):
            sources, targets = clean(raw_sources, raw_targets, counts)
            if sources:
                writer.append(
                    source_sp.encode(sources, out_type=int, num_threads=threads),
                    target_sp.encode(targets, out_type=int, num_threads=threads),
                )
            bar.update(len(raw_sources))
        counts.refuse_another_encoding(f"split {split!r}")  # before the split is written into the cache
    except BaseException:
        writer.close()
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    writer.finish({**info, "drops": counts.as_dict(), "seconds": round(seconds, 2)})
    log.info(
        "prepared split %s: %s (%.0f pairs/s)", split, counts.summary(), counts.total / max(seconds, 1e-9),
    )  # fmt: skip
    if counts.dropped:
        log.warning("split %s: %s", split, counts.summary())


def prepare_split(
    cfg: DataConfig, tokenizer, split: str, *, chief: bool = True, progress: bool = True, made=None
) -> Path:
    """The directory of `split` tokenized with `tokenizer`, preparing it first if it is not in the cache.

    A non-chief worker reads what the chief prepared (DataError if it is not there). Returns the complete split directory, and adds `split`
    to the set `made` (if given) when this call prepared it (not another process it waited for).
    """
    inputs = cache.split_key_inputs(cfg, split_identity(cfg, split), tokenizer.fingerprint)
    final = cache.split_dir(cfg, split, inputs)
    if read_manifest(final) is not None:
        log.info("split %s already prepared: %s", split, final)
        return final
    if not chief:
        cache.require(final, f"split {split!r}", complete=lambda path: (path / MANIFEST).is_file())
        return final
    with cache.exclusive(final, cfg=cfg):
        if read_manifest(final) is None:
            # published, then its manifest went (by hand): not complete, made again; so is a file in its place
            if final.exists() or final.is_symlink():
                log.warning("removing %s: it has no %s (incomplete or damaged)", final, MANIFEST)
                cache.remove(final)
            partial = cache.fresh_staging(final)
            try:
                _tokenize_into(cfg, tokenizer, split, partial, {"split": split, "key": inputs}, progress)
            except OSError as err:
                # e.g. a full disk: nothing half-written stays (the disk gets its space back)
                shutil.rmtree(partial, ignore_errors=True)
                raise DataError(f"cannot write the prepared split {split!r} into {partial}: {err}") from err
            except DataError:  # the corpus refused (another encoding): nothing of it stays in the cache
                shutil.rmtree(partial, ignore_errors=True)
                raise
            cache.publish(partial, final)
            if made is not None:
                made.add(split)
    return final


def splits_to_prepare(cfg: DataConfig) -> list[str]:
    """train and validation, and test if the corpus has it (each once)."""
    splits = [cfg.train_split, cfg.validation_split]
    if split_exists(cfg, cfg.test_split):
        splits.append(cfg.test_split)
    return list(dict.fromkeys(splits))


def prepare(
    cfg: DataConfig, *, tokenizer=None, chief: bool = True, progress: bool = True, made=None
) -> tuple:
    """Tokenizer (the cached one unless given) and every split prepared: (tokenizer, {split: directory}); the
    splits this call prepared itself are added to the set `made` (if given)."""
    tokenizer = tokenizer or cached_tokenizer(cfg, chief=chief)
    done = {
        split: prepare_split(cfg, tokenizer, split, chief=chief, progress=progress, made=made)
        for split in splits_to_prepare(cfg)
    }
    return tokenizer, done


def main(argv: list[str] | None = None) -> int:
    from common.config_tree import add_set_argument

    parser = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML config (a bare name is looked up in configs/)")
    add_set_argument(parser)
    parser.add_argument(
        "--tokenizer-dir",
        metavar="DIR",
        help="tokenize with the SentencePiece model(s) in DIR (e.g. RUN/tokenizer, for a train.init_from config) "
        "instead of the one trained and cached for the config",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from common.config_tree import ConfigError
    from data.config import load_data_config, refuse_fine_tuning_without_tokenizer

    try:
        cfg, tree = load_data_config(args.config, args.overrides)
        refuse_fine_tuning_without_tokenizer(tree, args.tokenizer_dir, "--tokenizer-dir")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    start, made = time.perf_counter(), set()
    if args.no_progress:  # TFDS's own bars too (building a TFDS dataset the first time)
        import tensorflow_datasets as tfds

        tfds.disable_progress_bar()
    try:
        given = None
        if args.tokenizer_dir:
            from data.tokenizer import Tokenizer

            given = Tokenizer.load(args.tokenizer_dir)  # DataError naming DIR if it holds no tokenizer
        tokenizer, splits = prepare(cfg, tokenizer=given, progress=not args.no_progress, made=made)
        vocab = {"source": tokenizer.source_vocab_size, "target": tokenizer.target_vocab_size}
        # what training will open: a damaged entry is named now, not passed as "nothing to do"; so is a split
        # training could not use (every pair dropped), not reported prepared
        from data.pipeline import no_usable_pair

        for split, path in splits.items():
            prepared = PreparedSplit.open(path, vocab=vocab)
            if len(prepared) == 0 and split in (cfg.train_split, cfg.validation_split):
                raise DataError(f"{no_usable_pair(cfg, split, prepared)}: train.py would stop there")
            if len(prepared) == 0:
                log.warning("%s", no_usable_pair(cfg, split, prepared))
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    fresh = [split for split in splits if split in made]  # not what another process prepared meanwhile
    verdict = f"prepared {', '.join(fresh)}" if fresh else "nothing to do: everything was already prepared"
    print(
        f"{verdict} ({time.perf_counter() - start:.1f} s) in {cache.cache_root(cfg)}: "
        + ", ".join(f"{split}: {path.name}" for split, path in splits.items()),
        file=sys.stderr,
    )
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops like SIGINT
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # what is half-written stays in a .partial directory, removed by the next run
        print(
            "interrupted: nothing half-prepared counts as complete (the next run removes it); rerun",
            file=sys.stderr,
        )
        sys.exit(130)
