"""Where prepared data lives, under which key, and how writers and readers of the cache meet.

    <cache_dir>/tokenizer-<key>/               spm.model (or spm.source/target.model), trained once
    <cache_dir>/<dataset>.<src>-<tgt>.<split>-<key>/   one prepared split (see data.store)
    <cache_dir>/file-digests/                  digests of corpus files (TFDS's built files, a folder's split
                                               files), per path, size, mtime, ctime and inode (data.stream)

The keys are hashes of what changes the tokens, never of what is applied when reading (max_length, batch sizes,
buckets) nor of where things are stored (data_dir, manual_dir, cache_dir):
- tokenizer: the train split's identity (data.stream.split_identity), direction, tokenizer type, vocab_size,
  joint_vocab, tokenizer_max_sentences, the sampling seed, SentencePiece's training threads and the preparation
  format;
- split: the split's identity, direction, the tokenizer's fingerprint (its model bytes) and the format.

Everything is written into `<final>.partial` and renamed when complete, so a killed preparation leaves nothing
that is taken as complete; the next preparation removes the leftover and starts that item again. An exclusive
`fcntl` lock per key keeps two preparations on one machine from writing the same item. On a multi-worker run only
the chief prepares; the others read what it made once it is done (`require`: the trainer has them wait for it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from data.config import DataConfig
from data.errors import DataError

log = logging.getLogger(__name__)

CACHE_ENV = "NMT_DATA_CACHE"
PREPARE_FORMAT = 1  # bump when the preparation changes the tokens or the layout
TOKENIZER_SEED = 1234
# SentencePiece's training threads for the cached tokenizer, whatever the machine's cores: the unigram trainer
# gives other pieces for another thread count (deterministic for one count, whatever the cores that run it). Before,
# it was the machine's CPU count (at most 16): a 2-core and a 16-core machine trained different tokenizers.
TOKENIZER_TRAIN_THREADS = 16


def cache_root(cfg: DataConfig) -> Path:
    """data.cache_dir, else $NMT_DATA_CACHE, else ~/.cache/nmt/prepared."""
    root = cfg.cache_dir or os.environ.get(CACHE_ENV) or "~/.cache/nmt/prepared"
    return Path(root).expanduser()


def _cache_advice(cfg: DataConfig | None) -> str:
    """How to point the cache elsewhere: data.cache_dir wins over $NMT_DATA_CACHE (a trained run's config.yaml keeps
    the one it was trained with: evaluate.py and translate.py read it there, and have no --set)."""
    if cfg is not None and cfg.cache_dir:
        return (
            f"data.cache_dir is {cfg.cache_dir} (${CACHE_ENV} is used only when it is unset): set it to a writable "
            "directory (for a trained run, in its config.yaml)"
        )
    return f"set data.cache_dir (or ${CACHE_ENV}) to a writable directory"


def digest(payload: dict) -> str:
    """A short stable hash of a JSON-able dict."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def tokenizer_key_inputs(cfg: DataConfig, train_identity: dict) -> dict:
    return {
        "format": PREPARE_FORMAT,
        "train": train_identity,
        "source": cfg.source,
        "target": cfg.target,
        "tokenizer": cfg.tokenizer,
        "vocab_size": cfg.vocab_size,
        "joint_vocab": cfg.joint_vocab,
        "max_sentences": cfg.tokenizer_max_sentences,
        "seed": TOKENIZER_SEED,
        # a cache trained with the machine's CPU count (before) is trained again, once
        "threads": TOKENIZER_TRAIN_THREADS,
        **({"lowercase": True} if cfg.lowercase else {}),  # absent when off: older caches keep their keys
    }


def split_key_inputs(cfg: DataConfig, identity: dict, fingerprint: str) -> dict:
    return {
        "format": PREPARE_FORMAT,
        "split": identity,
        "source": cfg.source,
        "target": cfg.target,
        "tokenizer": fingerprint,
    }


def tokenizer_dir(cfg: DataConfig, inputs: dict) -> Path:
    return cache_root(cfg) / f"tokenizer-{digest(inputs)}"


def split_dir(cfg: DataConfig, split: str, inputs: dict) -> Path:
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", f"{cfg.dataset}.{cfg.source}-{cfg.target}.{split}")
    return cache_root(cfg) / f"{name}-{digest(inputs)}"


def staging(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


@contextlib.contextmanager
def exclusive(final: Path, *, required: bool = True, cfg: DataConfig | None = None) -> Iterator[None]:
    """Holds an exclusive lock for preparing `final`, `<final>.lock` (waits while another process holds it).

    A lock file that cannot be created is a DataError (naming the setting that chose the cache: `cfg`'s), or with
    `required=False` (a read-only directory of data prepared elsewhere, which nothing will write) no lock.
    """
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        handle = open(final.with_name(final.name + ".lock"), "a")  # noqa: SIM115 - closed below
    except OSError as err:
        if not required:
            yield
            return
        raise DataError(
            f"cannot write into the data cache {final.parent} ({err}): {_cache_advice(cfg)}"
        ) from err
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is preparing %s: waiting for it", final)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fresh_staging(final: Path) -> Path:
    """An empty `<final>.partial` (removing what a killed preparation left)."""
    partial = staging(final)
    if partial.exists() or partial.is_symlink():
        log.info("removing %s, left by an interrupted preparation", partial)
        remove(partial)
    partial.mkdir(parents=True)
    return partial


def remove(path: Path) -> None:
    """Removes an item of the cache, or its staging: a directory tree, or a file or a link in its place.

    Only this module makes these names (a key is a hash): a file there is a leftover (an item copied or cut by
    hand), not someone's data, and is removed as a damaged item is, not reported as a NotADirectoryError.
    """
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def publish(partial: Path, final: Path) -> None:
    """Renames a completed staging directory to its final name (atomic on one filesystem)."""
    os.replace(partial, final)


def require(path: Path, what: str, complete=Path.exists) -> None:
    """Raises DataError unless `complete(path)`: a non-chief worker reads what the chief prepared, never prepares."""
    if not complete(path):
        raise DataError(
            f"{what} is not at {path}, where the chief worker has prepared it: data.cache_dir ({path.parent}) "
            "must be one directory shared by every worker (e.g. on a network filesystem)"
        )
