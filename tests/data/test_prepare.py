"""`data.prepare`: a folder corpus prepared once into the cache, dropped lines counted, reuse, kill and rerun.

The reference for every prepared token is the in-graph tokenizer (TF Text) applied to the raw lines; preparation
itself encodes with SentencePiece's Python API.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from data import cache
from data.cleaning import MAX_LINE_BYTES
from data.config import DataConfig
from data.errors import DataError
from data.pipeline import eval_batches, train_batches
from data.prepare import main, prepare
from data.store import MANIFEST, PreparedSplit
from tests.data.conftest import sentences

REPO = Path(__file__).resolve().parents[2]
TRAIN = 80
BAD = [  # (source, target) lines that preparation drops, and why
    (b"", b"", "empty"),
    (b"A man sleeps.", b"   ", "one_side_empty"),
    (b"\xff\xfe not UTF-8", b"Un chien.", "invalid_utf8"),
    (b"a" * (MAX_LINE_BYTES + 1), b"Un homme.", "too_long"),
]


def write_corpus(folder: Path, bad: bool = True) -> Path:
    """en/fr train (TRAIN clean pairs, then the BAD ones spread in) and dev splits."""
    folder.mkdir(parents=True, exist_ok=True)
    en, fr = sentences("en", TRAIN, 0), sentences("fr", TRAIN, 0)
    source, target = [line.encode() for line in en], [line.encode() for line in fr]
    if bad:
        for index, (s, t, _) in enumerate(BAD):
            source.insert(10 * index + 5, s)
            target.insert(10 * index + 5, t)
    (folder / "en.train.txt").write_bytes(b"\n".join(source) + b"\n")
    (folder / "fr.train.txt").write_bytes(b"\n".join(target) + b"\n")
    (folder / "en.dev.txt").write_text("\n".join(sentences("en", 12, 1)) + "\n")
    (folder / "fr.dev.txt").write_text("\n".join(sentences("fr", 12, 1)) + "\n")
    return folder


def folder_cfg(tmp_path: Path, **changes) -> DataConfig:
    folder = tmp_path / "corpus"
    if not folder.exists():
        write_corpus(folder)
    cfg = DataConfig(
        dataset="folder",
        folder=str(folder),
        source="en",
        target="fr",
        validation_split="dev",
        test_split="dev",
        cache_dir=str(tmp_path / "cache"),
        vocab_size=96,
        max_length=24,
        batch_tokens=256,
    )
    return dataclasses.replace(cfg, **changes)


def reference(tokenizer, lines: list[str], side: str = "source") -> list[list[int]]:
    tokenize = tokenizer.tokenize_source if side == "source" else tokenizer.tokenize_target
    return tokenize(tf.constant(lines)).to_list()


def test_prepares_a_folder_corpus_counts_bad_lines_and_reuses_the_cache(tmp_path, caplog):
    cfg = folder_cfg(tmp_path)
    caplog.set_level("INFO")
    tokenizer, splits = prepare(cfg, progress=False)
    assert sorted(splits) == ["dev", "train"]
    train = PreparedSplit.open(splits["train"])
    assert len(train) == TRAIN
    assert train.pieces("source") == reference(tokenizer, sentences("en", TRAIN, 0))
    assert train.pieces("target") == reference(tokenizer, sentences("fr", TRAIN, 0), "target")
    np.testing.assert_array_equal(train.source_lengths, [len(p) for p in train.pieces("source")])
    drops = train.manifest["drops"]
    assert drops == {
        "total": TRAIN + len(BAD), "kept": TRAIN, "empty": 1, "one_side_empty": 1, "invalid_utf8": 1, "too_long": 1,
    }  # fmt: skip
    assert (
        f"dropped 1 empty, 1 with one side empty, 1 invalid UTF-8, 1 over {MAX_LINE_BYTES} bytes"
        in caplog.text
    )
    dev = PreparedSplit.open(splits["dev"])
    assert dev.pieces("target") == reference(tokenizer, sentences("fr", 12, 1), "target")

    caplog.clear()
    stamps = {split: (path / MANIFEST).stat().st_mtime_ns for split, path in splits.items()}
    again, splits_again = prepare(cfg, progress=False)
    assert splits_again == splits and again.fingerprint == tokenizer.fingerprint
    assert {split: (path / MANIFEST).stat().st_mtime_ns for split, path in splits.items()} == stamps
    assert "split train already prepared" in caplog.text and "training the SentencePiece" not in caplog.text


def test_file_and_in_memory_reads_give_the_same_batches(tmp_path):
    cfg = folder_cfg(tmp_path)
    _, splits = prepare(cfg, progress=False)
    from_file = PreparedSplit.open(splits["train"], in_memory=False)
    loaded = PreparedSplit.open(splits["train"], in_memory=True)
    assert from_file.origin == "from file" and loaded.origin == "memory"
    short = dataclasses.replace(
        cfg, max_length=8, eval_batch_tokens=64
    )  # sides cut to 7 pieces: partial reads
    for make in (
        lambda split: train_batches(cfg, split, seed=4, repeat=False),
        lambda split: eval_batches(short, split),
    ):
        first = list(make(from_file).as_numpy_iterator())
        second = list(make(loaded).as_numpy_iterator())
        assert len(first) == len(second) > 1
        for a, b in zip(first, second):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
    for side in ("source", "target"):  # and both equal the pieces as written, by an independent reading
        offsets = np.fromfile(splits["train"] / f"{side}.offsets", np.int64)
        values = np.fromfile(splits["train"] / f"{side}.values", np.dtype(from_file.manifest["dtype"]))
        expected = [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
        assert from_file.pieces(side) == expected == loaded.pieces(side)


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_reading_from_file_maps_only_the_length_index_and_releases_it(tmp_path):
    """Token and offset files are read with pread (a memory map keeps every page it touched in the RSS), and the
    mapped length index leaves the RSS once the epochs are planned."""
    cfg = folder_cfg(tmp_path)
    _, splits = prepare(cfg, progress=False)
    split = PreparedSplit.open(splits["train"], in_memory=False)
    assert int(split.source_lengths.sum()) > 0  # reads the whole index: its pages are resident now
    batches = list(train_batches(cfg, split, seed=1, repeat=False).as_numpy_iterator())
    assert batches
    resident, name = {}, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):  # a mapping's header: address range ... [path]
            name = Path(fields[-1]).name if str(splits["train"]) in line else None
        elif name is not None and fields[0] == "Rss:":
            resident[name] = resident.get(name, 0) + int(fields[1])
    assert resident == {"lengths": 0}


KILLER = """
import os, signal, sys
import data.prepare as prepare
from data.store import SplitWriter

prepare.CHUNK_PAIRS = 16
append = SplitWriter.append

def append_then_die(self, sources, targets):
    append(self, sources, targets)
    if "_train-" in self.directory.name and self.pairs >= 32:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, as a power cut or the OOM killer

SplitWriter.append = append_then_die
sys.exit(prepare.main(sys.argv[1:]))
"""


def write_config(tmp_path: Path, cfg: DataConfig) -> Path:
    path = tmp_path / "prepare.yaml"
    data = {k: v for k, v in dataclasses.asdict(cfg).items() if v is not None}
    path.write_text(json.dumps({"data": data}))  # JSON is YAML
    return path


def test_a_preparation_killed_mid_split_is_not_taken_as_complete_and_a_rerun_finishes_it(tmp_path):
    cfg = folder_cfg(tmp_path)
    config = write_config(tmp_path, cfg)
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, "--config", str(config), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    root = Path(cfg.cache_dir)
    train_dirs = [p.name for p in root.iterdir() if "_train-" in p.name and p.is_dir()]
    assert len(train_dirs) == 1 and train_dirs[0].endswith(".partial"), train_dirs
    assert not (root / train_dirs[0] / MANIFEST).exists()  # -9: killed after 32 of 80 pairs were appended

    assert main(["--config", str(config), "--no-progress"]) == 0
    tokenizer, splits = prepare(cfg, progress=False)
    assert not [p for p in root.iterdir() if p.name.endswith(".partial")]
    train = PreparedSplit.open(splits["train"])
    assert train.pieces("source") == reference(tokenizer, sentences("en", TRAIN, 0))
    assert len(train) == TRAIN


def keys(cfg: DataConfig, fingerprint: str = "f" * 64) -> tuple[str, str]:
    """(tokenizer key, train split key) of a config, for a given tokenizer fingerprint."""
    from data.stream import split_identity

    identity = split_identity(cfg, cfg.train_split)
    return (
        cache.digest(cache.tokenizer_key_inputs(cfg, identity)),
        cache.digest(cache.split_key_inputs(cfg, identity, fingerprint)),
    )


def test_the_cache_key_changes_exactly_when_the_tokens_may_change(tmp_path):
    cfg = folder_cfg(tmp_path)
    tokenizer_key, split_key = keys(cfg)
    for same in (
        dict(max_length=100), dict(batch_tokens=999), dict(eval_batch_tokens=7), dict(bucket_boundaries=[8, 16]),
        dict(data_dir="/elsewhere"), dict(manual_dir="/mirror"), dict(cache_dir=str(tmp_path / "other")),
        dict(validation_split="test"), dict(test_split="x"),
    ):  # fmt: skip
        assert keys(dataclasses.replace(cfg, **same)) == (tokenizer_key, split_key), same
    for tokenizer_change in (
        dict(vocab_size=97), dict(tokenizer="bpe"), dict(joint_vocab=False), dict(tokenizer_max_sentences=10),
        dict(lowercase=True),
    ):  # fmt: skip
        changed = keys(dataclasses.replace(cfg, **tokenizer_change))
        assert changed[0] != tokenizer_key and changed[1] == split_key, tokenizer_change
    assert (
        keys(cfg, "e" * 64) == (tokenizer_key, keys(cfg, "e" * 64)[1]) and keys(cfg, "e" * 64)[1] != split_key
    )
    assert "lowercase" not in cache.tokenizer_key_inputs(
        cfg, {}
    )  # off: the keys of caches made before the knob
    reverse = keys(dataclasses.replace(cfg, source="fr", target="en"))
    assert reverse[0] != tokenizer_key and reverse[1] != split_key
    with open(Path(cfg.folder) / "fr.train.txt", "a") as handle:
        handle.write("Un autre.\n")
    with open(Path(cfg.folder) / "en.train.txt", "a") as handle:
        handle.write("Another.\n")
    edited = keys(cfg)
    assert edited[0] != tokenizer_key and edited[1] != split_key


def test_non_chief_reads_what_the_chief_prepared_and_never_prepares(tmp_path):
    """The trainer starts the other workers' preparation once the chief's is done (StopControl.chief_first): what
    they do not find is a cache they do not share with the chief."""
    from data.prepare import cached_tokenizer, prepare_split

    cfg = folder_cfg(tmp_path)
    with pytest.raises(
        DataError, match=r"the tokenizer is not at .*must be one directory shared by every worker"
    ):
        cached_tokenizer(cfg, chief=False)
    assert not any(Path(cfg.cache_dir).glob("tokenizer-*"))
    tokenizer, splits = prepare(cfg, progress=False)
    assert cached_tokenizer(cfg, chief=False).fingerprint == tokenizer.fingerprint
    assert prepare_split(cfg, tokenizer, "train", chief=False) == splits["train"]
    empty = tmp_path / "empty"
    with pytest.raises(DataError, match=rf"split 'train' is not at {re.escape(str(empty))}/.*data.cache_dir"):
        prepare_split(dataclasses.replace(cfg, cache_dir=str(empty)), tokenizer, "train", chief=False)
    # nothing prepared there (the corpus files' digests, memoised, are no prepared data; known to this process
    # already, they are not even written)
    assert ([p.name for p in empty.iterdir()] if empty.exists() else []) in ([], ["file-digests"])


def test_resume_mid_epoch_on_a_split_read_from_file_equals_the_uninterrupted_iterator(tmp_path):
    cfg = folder_cfg(tmp_path, batch_tokens=128)
    _, splits = prepare(cfg, progress=False)

    def dataset(repeat=True):
        return train_batches(cfg, PreparedSplit.open(splits["train"], in_memory=False), seed=9, repeat=repeat)

    per_epoch = len(list(dataset(repeat=False).as_numpy_iterator()))
    k, m = per_epoch // 2, per_epoch + 1  # stop mid-epoch; the resumed part crosses into the next epoch
    assert k >= 2
    iterator = iter(dataset())
    for _ in range(k):
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    expected = [next(iterator) for _ in range(m)]

    fresh = iter(dataset())
    tf.train.Checkpoint(iterator=fresh).read(path).assert_consumed()
    for want, got in zip(expected, [next(fresh) for _ in range(m)], strict=True):
        for key in want:
            np.testing.assert_array_equal(want[key].numpy(), got[key].numpy())


def test_a_fine_tuning_config_is_prepared_with_the_given_tokenizer(tmp_path, caplog):
    """`train.init_from` in the config: refused without --tokenizer-dir (exit 2, nothing trained); with it, the
    splits are tokenized by that tokenizer, keyed by it, as the fine-tuning run will look them up."""
    from data.prepare import prepare_split
    from data.tokenizer import Tokenizer

    parent, _ = prepare(folder_cfg(tmp_path), progress=False)
    parent.save(tmp_path / "parent" / "tokenizer")
    cfg = folder_cfg(
        tmp_path, vocab_size=64
    )  # not the parent's size: the config's own tokenizer would differ
    config = tmp_path / "ft.yaml"
    data = {k: v for k, v in dataclasses.asdict(cfg).items() if v is not None}
    config.write_text(json.dumps({"data": data, "train": {"init_from": str(tmp_path / "parent")}}))
    caplog.set_level("INFO")
    before = sorted(p.name for p in Path(cfg.cache_dir).iterdir())
    assert main(["--config", str(config), "--no-progress"]) == 2
    assert sorted(p.name for p in Path(cfg.cache_dir).iterdir()) == before
    assert main(["--config", str(config), "--no-progress", "--tokenizer-dir", str(tmp_path / "nowhere")]) == 2
    caplog.clear()
    given = str(tmp_path / "parent" / "tokenizer")
    assert main(["--config", str(config), "--no-progress", "--tokenizer-dir", given]) == 0
    assert "training the SentencePiece" not in caplog.text
    made = set()
    train = prepare_split(cfg, Tokenizer.load(given), "train", progress=False, made=made)
    assert made == set()  # prepared by main, found under the given tokenizer's key
    assert PreparedSplit.open(train).pieces("source") == reference(parent, sentences("en", TRAIN, 0))


def test_prepare_refuses_a_fine_tuning_config_without_a_tokenizer_by_name(tmp_path):
    cfg = folder_cfg(tmp_path)
    config = tmp_path / "ft.yaml"
    data = {k: v for k, v in dataclasses.asdict(cfg).items() if v is not None}
    config.write_text(json.dumps({"data": data, "train": {"init_from": "runs/base"}}))
    done = subprocess.run(
        [sys.executable, "-m", "data.prepare", "--config", str(config), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    assert "fine-tunes train.init_from=runs/base" in done.stderr
    assert "--tokenizer-dir runs/base/tokenizer" in done.stderr
