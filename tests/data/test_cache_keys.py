"""A corpus's identity (what its cache keys hash) is its text: the same text gives the same key whatever bytes hold
it, other text another key even when sizes and modification times are kept."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

import tensorflow as tf

from data.config import DataConfig
from data.stream import split_identity
from tests.data.conftest import sentences


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2), written by hand."""

    def varint(value: int) -> bytes:
        out = b""
        while value > 0x7F:
            out += bytes([value & 0x7F | 0x80])
            value >>= 7
        return out + bytes([value])

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _encode(example: tf.train.Example, order: list[str]) -> bytes:
    """The tf.train.Example's bytes with its feature map written in `order` (TFDS's order changes per process)."""
    entries = b"".join(
        _field(1, _field(1, key.encode()) + _field(2, example.features.feature[key].SerializeToString()))
        for key in order
    )
    return _field(1, entries)


def _rewrite(shard: Path, order: list[str], edit=None) -> list[tf.train.Example]:
    examples = [
        tf.train.Example.FromString(r) for r in tf.data.TFRecordDataset(str(shard)).as_numpy_iterator()
    ]
    if edit:
        edit(examples)
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for example in examples:
            writer.write(_encode(example, order))
    return examples


def test_tfds_files_of_the_same_examples_in_other_bytes_have_the_same_identity(
    tmp_path, data_cfg, prepared_dir
):
    """Two builds of the same text: the feature maps of their examples in other orders (before, the files' bytes
    were hashed, so that about every other rebuild had other cache keys: a new tokenizer, every split again)."""
    split_identity(data_cfg, "validation")  # prepared once in the session's data_dir
    copies = {}
    for name, order in (("a", ["en", "de"]), ("b", ["de", "en"])):
        shutil.copytree(prepared_dir / "multi30k", tmp_path / name / "multi30k")
        (shard,) = (tmp_path / name / "multi30k" / "en-de").glob("*/multi30k-validation.tfrecord-*")
        examples = _rewrite(shard, order)
        copies[name] = (shard, dataclasses.replace(data_cfg, data_dir=str(tmp_path / name)))
    (shard_a, cfg_a), (shard_b, cfg_b) = copies["a"], copies["b"]
    assert shard_a.read_bytes() != shard_b.read_bytes() and shard_a.stat().st_size == shard_b.stat().st_size
    # the same examples in both files
    read_b = [
        tf.train.Example.FromString(r) for r in tf.data.TFRecordDataset(str(shard_b)).as_numpy_iterator()
    ]
    assert read_b == examples
    assert split_identity(cfg_a, "validation") == split_identity(cfg_b, "validation")
    assert split_identity(cfg_a, "validation[:50%]") == split_identity(cfg_b, "validation[:50%]")

    def edit(examples):
        text = examples[-1].features.feature["de"].bytes_list.value
        text[0] = text[0].swapcase()

    before = split_identity(cfg_b, "validation")
    _rewrite(shard_b, ["de", "en"], edit)
    assert shard_a.stat().st_size == shard_b.stat().st_size
    after = split_identity(cfg_b, "validation")
    assert after["contents"] != before["contents"] and after["examples"] == before["examples"]


def test_a_folder_edit_that_keeps_size_and_modification_time_changes_the_identity(tmp_path):
    """`sed -i s/cat/cow/ f; touch -r orig f` (or rsync -a, cp -p of another version of the same size): before, the
    identity was path, size and mtime only, and the stale prepared data were used."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("en", "fr"):
        (corpus / f"{lang}.train.txt").write_text("\n".join(sentences(lang, 20, 0)) + "\n")
    cfg = DataConfig(
        dataset="folder", folder=str(corpus), source="en", target="fr", cache_dir=str(tmp_path / "c")
    )
    path = corpus / "en.train.txt"
    before = split_identity(cfg, "train")
    stat = path.stat()
    text = path.read_text()
    edited = text.replace(text.split()[1], text.split()[1].swapcase(), 1)
    assert edited != text and len(edited.encode()) == len(text.encode())
    path.write_text(edited)
    # as an edit some time later: a kernel that stamps times per clock tick (1-10 ms) may give a write within one
    # tick the same ctime, which the memo could not tell apart; touch again until the ctime has moved
    deadline = time.monotonic() + 5
    while True:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        if path.stat().st_ctime_ns != stat.st_ctime_ns or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    assert path.stat().st_ctime_ns != stat.st_ctime_ns
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    after = split_identity(cfg, "train")
    assert after != before
    # each file read once per state: a memo per file, and one more for the edited file (its ctime changed)
    assert (
        split_identity(cfg, "train") == after and len(list((tmp_path / "c" / "file-digests").iterdir())) == 3
    )

    # the same text elsewhere, or touched: the same identity (it is the text, not its place or time)
    shutil.copytree(corpus, tmp_path / "copy")
    assert split_identity(dataclasses.replace(cfg, folder=str(tmp_path / "copy")), "train") == after
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert split_identity(cfg, "train") == after


def test_a_cache_without_room_for_memos_reads_each_file_once_per_process(tmp_path, monkeypatch):
    """A cache whose file-digests/ cannot be written (read-only, a file in its place): the train files were read
    twice per start before 2026-12-07d (once for the tokenizer's key, once for the split's)."""
    from data import stream

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("en", "fr"):
        (corpus / f"{lang}.train.txt").write_text("\n".join(sentences(lang, 20, 0)) + "\n")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "file-digests").write_text("in the way")
    cfg = DataConfig(
        dataset="folder", folder=str(corpus), source="en", target="fr", cache_dir=str(tmp_path / "c")
    )
    reads, read = [], stream._READERS[stream.BYTES]
    monkeypatch.setitem(
        stream._READERS, stream.BYTES, lambda path: reads.append(Path(path).name) or read(path)
    )
    first = split_identity(cfg, "train")
    assert split_identity(cfg, "train") == first and sorted(reads) == ["en.train.txt", "fr.train.txt"]
