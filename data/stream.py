"""A corpus split as a stream of raw pairs, in bounded memory, and the identity of what it holds.

    for sources, targets in stream_pairs(cfg, "train"):     # lists of bytes, at most CHUNK_PAIRS each
        ...
    split_identity(cfg, "train")   # JSON-able: what the split's text is (for cache keys), not where it is cached
    count_pairs(cfg, "train")      # pairs in the split (TFDS metadata, or a fast newline count of a folder file)

A `folder` corpus is read by `data.folder`, line by line; its identity is the absolute path, size and modification
time of the split's two files.
TFDS corpora (Multi30k, catalog names) are read through `data.corpus`; their identity is name, config, version and
the split's size. A file that cannot be read (truncated, corrupt, not aligned) is a `DataError` naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator

from data import folder
from data.config import FOLDER, DataConfig
from data.errors import DataError

CHUNK_PAIRS = 4096


def _bad_shards(cfg: DataConfig, split: str) -> list[str]:
    """The TFRecord files of a TFDS split that cannot be read to the end (looked for after a read error)."""
    import tensorflow as tf

    from data.corpus import tfds_builder

    bad = []
    try:
        paths = tfds_builder(cfg).info.splits[split.split("[")[0]].filepaths
    except Exception:  # noqa: BLE001 - best effort: the error is reported anyway
        return bad
    for path in paths:
        try:
            for _ in tf.data.TFRecordDataset(os.fspath(path)).batch(1024):
                pass
        except tf.errors.OpError as err:
            reason = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\].*", "", err.message.strip().splitlines()[-1])
            bad.append(f"{path} ({reason})")
    return bad


def _stream_tfds(cfg: DataConfig, split: str, chunk: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    import tensorflow as tf

    from data.corpus import load_batches

    try:
        for batch in load_batches(cfg, split, batch_size=chunk).as_numpy_iterator():
            yield list(batch["source"]), list(batch["target"])
    except tf.errors.OpError as err:  # e.g. DataLossError: a truncated or corrupt TFRecord shard
        bad = _bad_shards(cfg, split)
        where = f"corrupt or truncated file(s): {'; '.join(bad)}" if bad else err.message.strip()
        raise DataError(
            f"cannot read split {split!r} of {cfg.dataset!r} ({type(err).__name__}), {where}. "
            "The prepared TFDS files are damaged: delete them (see data.data_dir) and prepare again."
        ) from err


def stream_pairs(
    cfg: DataConfig, split: str, chunk: int = CHUNK_PAIRS
) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """The pairs of `split` in corpus order, as (sources, targets) lists of raw UTF-8 bytes, `chunk` at a time."""
    if cfg.dataset == FOLDER:
        return folder.stream(cfg, split, chunk)
    return _stream_tfds(cfg, split, chunk)


def count_pairs(cfg: DataConfig, split: str) -> int:
    """Pairs in `split` (TFDS metadata; a folder's source file is counted, fast)."""
    if cfg.dataset == FOLDER:
        return folder.count_lines(folder.split_files(cfg, split)[0])
    from data.corpus import split_sizes

    size = split_sizes(cfg).get(split)
    if size is None:  # e.g. a sliced split name: count it
        size = sum(len(sources) for sources, _ in stream_pairs(cfg, split))
    return size


def split_identity(cfg: DataConfig, split: str) -> dict:
    """What the text of a split is, as a JSON-able dict: it changes when the text may have changed."""
    identity = {"dataset": cfg.dataset, "split": split, "source": cfg.source, "target": cfg.target}
    if cfg.dataset == FOLDER:
        return {**identity, **folder.identity(cfg, split)}
    from data.corpus import tfds_builder

    builder = tfds_builder(cfg)
    config = builder.builder_config.name if builder.builder_config else None
    base = split.split("[")[0]  # a sliced split ("train[:10%]") is read from its split's files
    info = builder.info.splits[base] if base in builder.info.splits else None
    return {
        **identity,
        "builder": builder.name,
        "config": config,
        "version": str(builder.version),
        "examples": int(info.num_examples) if info is not None else None,
        "bytes": int(info.num_bytes) if info is not None else None,
        # What TFDS's files hold, not where or when they were written: a rebuild of edited text (a mirror edited,
        # then <data_dir>/<name> deleted) changes it even when the text keeps its size
        "contents": files_digest(cfg, info.filepaths) if info is not None else None,
    }


def files_digest(cfg: DataConfig, paths) -> str:
    """A digest of the files' names and contents, memoised per file (path, size, modification time) under
    `<cache_dir>/file-digests/`: a WMT-sized build is read through once, not at every start."""
    combined = hashlib.blake2b(digest_size=16)
    for path in sorted(map(os.fspath, paths)):
        combined.update(f"{os.path.basename(path)}\0{_file_digest(cfg, path)}\0".encode())
    return combined.hexdigest()


def _file_digest(cfg: DataConfig, path: str) -> str:
    from data.cache import cache_root, digest

    stat = os.stat(path)
    memo = (
        cache_root(cfg)
        / "file-digests"
        / digest({"path": path, "bytes": stat.st_size, "ns": stat.st_mtime_ns})
    )
    with contextlib.suppress(OSError, UnicodeDecodeError):
        known = memo.read_text(encoding="ascii").strip()
        if re.fullmatch(r"[0-9a-f]{32}", known):
            return known
    contents = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            contents.update(chunk)
    value = contents.hexdigest()
    with contextlib.suppress(OSError):  # no memo (a read-only cache): read again next time
        memo.parent.mkdir(parents=True, exist_ok=True)
        partial = memo.with_name(f"{memo.name}.{os.getpid()}.partial")
        partial.write_text(value + "\n", encoding="ascii")
        os.replace(partial, memo)
    return value


def split_exists(cfg: DataConfig, split: str) -> bool:
    """Whether the corpus has `split` (a sliced TFDS split name counts as present)."""
    if cfg.dataset == FOLDER:
        files = folder.listing(cfg).get(split, {})
        return cfg.source in files and cfg.target in files
    from data.corpus import tfds_builder

    names = list(tfds_builder(cfg).info.splits.keys())
    return not names or split.split("[")[0] in names
