"""A corpus split as a stream of raw pairs, in bounded memory, and the identity of what it holds.

    for sources, targets in stream_pairs(cfg, "train"):     # lists of bytes, at most CHUNK_PAIRS each
        ...
    split_identity(cfg, "train")   # JSON-able: what the split's text is (for cache keys), not where it is cached
    count_pairs(cfg, "train")      # pairs in the split (TFDS metadata, or a fast newline count of a folder file)

A `folder` corpus is read by `data.folder`, line by line; its identity is a digest of what the split's two files
hold (not where they are nor when they were written).
TFDS corpora (Multi30k, catalog names) are read through `data.corpus`; their identity is name, config, version, the
split's size and a digest of the examples its files hold. Digests are memoised per file: see `file_digest`.
A file that cannot be read (truncated, corrupt, not aligned) is a `DataError` naming it.
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


def _damaged(cfg: DataConfig, split: str, err: Exception) -> DataError:
    """The error for a TFDS split whose files cannot be read to the end, naming the damaged ones."""
    bad = _bad_shards(cfg, split)
    message = getattr(err, "message", str(err)).strip()
    where = f"corrupt or truncated file(s): {'; '.join(bad)}" if bad else message
    return DataError(
        f"cannot read split {split!r} of {cfg.dataset!r} ({type(err).__name__}), {where}. "
        "The prepared TFDS files are damaged: delete them (see data.data_dir) and prepare again."
    )


def _stream_tfds(cfg: DataConfig, split: str, chunk: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    import tensorflow as tf

    from data.corpus import load_batches

    try:
        for batch in load_batches(cfg, split, batch_size=chunk).as_numpy_iterator():
            yield list(batch["source"]), list(batch["target"])
    # e.g. DataLossError: a truncated or corrupt TFRecord shard
    except tf.errors.OpError as err:
        raise _damaged(cfg, split, err) from err


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
        # What the two files hold, not where or when they were written: an edit that keeps their sizes and
        # modification times (sed, then touch -r; rsync -a, cp -p or tar x of another version) changes it
        files = [
            {"bytes": os.stat(path).st_size, "contents": file_digest(cfg, path, BYTES)}
            for path in folder.split_files(cfg, split)
        ]
        return {**identity, "files": files}
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    from data.corpus import tfds_builder

    builder = tfds_builder(cfg)
    config = builder.builder_config.name if builder.builder_config else None
    base = split.split("[")[0]  # a sliced split ("train[:10%]") is read from its split's files
    info = builder.info.splits[base] if base in builder.info.splits else None
    file_format = builder.info.file_format
    kind = EXAMPLES if file_format is None or file_format.value == "tfrecord" else BYTES
    try:
        # What TFDS's files hold, not where or when they were written: a rebuild of edited text (a mirror edited,
        # then <data_dir>/<name> deleted) changes it even when the text keeps its size; a rebuild of the same text
        # keeps it (TFDS writes the same examples in other bytes from one process to the next)
        contents = files_digest(cfg, info.filepaths, kind) if info is not None else None
    except (tf.errors.OpError, DecodeError) as err:
        raise _damaged(cfg, base, err) from err
    return {
        **identity,
        "builder": builder.name,
        "config": config,
        "version": str(builder.version),
        "examples": int(info.num_examples) if info is not None else None,
        "bytes": int(info.num_bytes) if info is not None else None,
        "contents": contents,
    }


def legacy_identity_matches(cfg: DataConfig, split: str, recorded) -> bool:
    """Whether `recorded`, a `split_identity` in the format written before 2026-12-07d, names the split's text as
    it is now: a folder's two files at the same paths, sizes and modification times; a TFDS split with the same
    fields and the same digest of its files' bytes (then `contents`). A record saved by an older version (e.g. a
    distilled folder's settings) is so carried over instead of read as a changed corpus."""
    if not isinstance(recorded, dict):
        return False
    base = {"dataset": cfg.dataset, "split": split, "source": cfg.source, "target": cfg.target}
    if cfg.dataset == FOLDER:
        try:
            stats = [(path, os.stat(path)) for path in folder.split_files(cfg, split)]
        except (OSError, DataError):
            return False
        files = [{"path": os.fspath(p), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns} for p, st in stats]
        return recorded == {**base, "files": files}
    from data.corpus import tfds_builder

    now = split_identity(cfg, split)
    if {k: v for k, v in recorded.items() if k != "contents"} != {
        k: v for k, v in now.items() if k != "contents"
    }:
        return False
    info = tfds_builder(cfg).info.splits[split.split("[")[0]]
    # the old digest: each file's bytes (the BYTES kind's combination is the same)
    return recorded.get("contents") == files_digest(cfg, info.filepaths, BYTES)


# What a file digest reads: its bytes, or (a TFRecord file of tf.train.Example) its examples
BYTES, EXAMPLES = "bytes", "examples"


def _blocks(path: str) -> Iterator[bytes]:
    """The file's bytes, a MiB at a time; `DataError` naming it if it cannot be read."""
    try:
        with open(path, "rb") as handle:
            while block := handle.read(1 << 20):
                yield block
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from err


def _examples(path: str) -> Iterator[bytes]:
    """The examples of a TFRecord file, each length-prefixed in its canonical form (feature map in key order):
    TFDS serializes an example's features in an order that changes from one process to the next, so two builds of
    the same text have files of other bytes but the same examples."""
    import tensorflow as tf

    for records in tf.data.TFRecordDataset(path).batch(CHUNK_PAIRS).as_numpy_iterator():
        parts = []
        for record in records:
            example = tf.train.Example.FromString(record).SerializeToString(deterministic=True)
            parts += (len(example).to_bytes(8, "little"), example)
        yield b"".join(parts)


_READERS = {BYTES: _blocks, EXAMPLES: _examples}


def files_digest(cfg: DataConfig, paths, kind: str) -> str:
    """A digest of the files' names and contents (`kind`: BYTES or EXAMPLES), each memoised: see `file_digest`."""
    combined = hashlib.blake2b(digest_size=16)
    for path in sorted(map(os.fspath, paths)):
        combined.update(f"{os.path.basename(path)}\0{file_digest(cfg, path, kind)}\0".encode())
    return combined.hexdigest()


# file_digest's memo in this process: {memo name (the file's stamp): digest}
_DIGESTS: dict[str, str] = {}


def file_digest(cfg: DataConfig, path, kind: str) -> str:
    """A digest of a file's contents (`kind`: BYTES or EXAMPLES), memoised under `<cache_dir>/file-digests/` by
    path, size, modification and status-change times and inode: a WMT-sized corpus is read through once, not at
    every start, and read again after any write to it (touch can set a file's mtime back, never its ctime; on a
    kernel that stamps times per clock tick, two same-size writes within one tick, digested between them, share a
    stamp: an edit that fast after a digest keeps the old one)."""
    from data.cache import cache_root, digest

    path = os.fspath(path)
    try:
        stat = os.stat(path)
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from err
    stamp = {
        "path": path, "kind": kind, "bytes": stat.st_size, "ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns,
        "inode": stat.st_ino,
    }  # fmt: skip
    memo = cache_root(cfg) / "file-digests" / digest(stamp)
    # this process's own memo first: a cache whose memos cannot be written (read-only) reads each file once
    if (known := _DIGESTS.get(memo.name)) is not None:
        return known
    with contextlib.suppress(OSError, UnicodeDecodeError):
        known = memo.read_text(encoding="ascii").strip()
        if re.fullmatch(r"[0-9a-f]{32}", known):
            return known
    contents = hashlib.blake2b(digest_size=16)
    for block in _READERS[kind](path):
        contents.update(block)
    value = _DIGESTS[memo.name] = contents.hexdigest()
    # no memo on disk (a read-only cache): read again by the next process
    with contextlib.suppress(OSError):
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
