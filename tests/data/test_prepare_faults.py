"""`data.prepare` on damaged input: named errors (exit 1), never a silent skip; TFDS corpora; the CLI."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from data.config import DataConfig
from data.corpus import load_text_pairs
from data.errors import DataError
from data.pipeline import make_train_dataset
from data.prepare import main, prepare
from data.store import PreparedSplit
from tests.data.conftest import sentences
from tests.data.test_prepare import BAD, REPO, TRAIN, folder_cfg, write_config


def test_a_truncated_folder_file_is_named(tmp_path):
    cfg = folder_cfg(tmp_path)
    path = tmp_path / "corpus" / "fr.train.txt"
    path.write_bytes(b"\n".join(path.read_bytes().split(b"\n")[:50]) + b"\n")
    with pytest.raises(DataError, match=r"fr\.train\.txt ends after 50 lines but .*en\.train\.txt goes on"):
        prepare(cfg, progress=False)


def test_a_missing_split_file_is_named(tmp_path):
    cfg = folder_cfg(tmp_path)
    (tmp_path / "corpus" / "fr.dev.txt").unlink()
    with pytest.raises(DataError, match=r"fr\.dev\.txt: no such file for split 'dev'"):
        prepare(cfg, progress=False)


def test_a_truncated_prepared_file_is_named_not_skipped(tmp_path):
    cfg = folder_cfg(tmp_path)
    tokenizer, splits = prepare(cfg, progress=False)
    values = splits["train"] / "target.values"
    values.write_bytes(values.read_bytes()[:-6])
    with pytest.raises(
        DataError, match=r"target\.values is truncated or corrupt .* delete .* and prepare again"
    ):
        PreparedSplit.open(splits["train"])
    with pytest.raises(DataError, match=r"target\.values is truncated"):
        make_train_dataset(cfg, tokenizer, seed=0)


def test_a_truncated_tfds_shard_is_named(tmp_path, mirror, prepared_dir):
    cfg = DataConfig(
        manual_dir=str(mirror), data_dir=str(prepared_dir), vocab_size=96, cache_dir=str(tmp_path)
    )
    prepare(cfg, progress=False)  # the session's prepared Multi30k, intact: copy it, then damage the copy
    shutil.copytree(prepared_dir / "multi30k", tmp_path / "tfds" / "multi30k")
    (shard,) = (tmp_path / "tfds" / "multi30k" / "en-de").glob("*/multi30k-validation.tfrecord-*")
    copy = dataclasses.replace(cfg, data_dir=str(tmp_path / "tfds"))
    # data_dir is a location, not a key: the same text elsewhere, and the cached tokens are used
    made = set()
    prepare(copy, progress=False, made=made)
    assert not made
    shard.write_bytes(shard.read_bytes()[:-40])  # other contents: prepared again, and the damage named
    with pytest.raises(DataError, match=rf"corrupt or truncated file\(s\): {shard}.*prepare again"):
        prepare(copy, progress=False)


def test_a_tfds_catalog_corpus_is_prepared(tmp_path, monkeypatch):
    # mock_data prepares without downloading: the download host is taken as reachable (no network in tests)
    monkeypatch.setattr("data.corpus.check_host", lambda url, timeout=5.0: None)
    cfg = DataConfig(
        dataset="ted_hrlr_translate/pt_to_en", source="pt", target="en", data_dir=str(tmp_path / "tfds"),
        cache_dir=str(tmp_path / "cache"), vocab_size=40, max_length=64,
    )  # fmt: skip
    with tfds.testing.mock_data(num_examples=30, policy=tfds.testing.MockPolicy.USE_CODE):
        tokenizer, splits = prepare(cfg, progress=False)
        assert sorted(splits) == ["test", "train", "validation"]
        for path in splits.values():
            split = PreparedSplit.open(path)
            drops = split.manifest["drops"]
            assert drops["total"] == 30 and len(split) == drops["kept"] > 0
        batches = list(make_train_dataset(cfg, tokenizer, seed=0, repeat=False).as_numpy_iterator())
        assert sum(len(b["source"]) for b in batches) > 0


def test_cli_exit_codes_and_a_second_run_does_nothing(tmp_path, capsys):
    cfg = folder_cfg(tmp_path)
    config = str(write_config(tmp_path, cfg))
    assert main(["--config", config, "--no-progress"]) == 0
    assert "prepared train, dev" in capsys.readouterr().err
    assert main(["--config", config, "--no-progress"]) == 0
    assert "nothing to do: everything was already prepared" in capsys.readouterr().err
    assert main(["--config", config, "--set", "data.vocab_sise=8"]) == 2
    assert "unknown config key data.vocab_sise" in capsys.readouterr().err
    assert main(["--config", config, "--set", f"data.folder={tmp_path / 'absent'}"]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_the_cli_does_not_claim_what_another_process_prepared_meanwhile(tmp_path, capsys, monkeypatch):
    """Two `data.prepare` at once: the one that waited for the other's splits says so, it does not claim them."""
    import data.prepare as prepare_module

    cfg = folder_cfg(tmp_path)
    config = str(write_config(tmp_path, cfg))

    def other_process_first(cfg, **kwargs):  # another process prepares everything while this one starts
        prepare(cfg, progress=False)
        return prepare(cfg, **kwargs)

    monkeypatch.setattr(prepare_module, "prepare", other_process_first)
    assert main(["--config", config, "--no-progress"]) == 0
    assert "nothing to do: everything was already prepared" in capsys.readouterr().err


def test_corrupt_offsets_are_named(tmp_path):
    cfg = folder_cfg(tmp_path)
    _, splits = prepare(cfg, progress=False)
    offsets = splits["train"] / "source.offsets"
    data = bytearray(offsets.read_bytes())
    data[-8:] = (10**9).to_bytes(8, "little")  # same size, wrong end
    offsets.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"source\.offsets is corrupt"):
        PreparedSplit.open(splits["train"])


def test_a_token_file_cut_after_opening_is_named_when_read(tmp_path):
    cfg = folder_cfg(tmp_path)
    _, splits = prepare(cfg, progress=False)
    split = PreparedSplit.open(splits["train"], in_memory=False)
    values = splits["train"] / "source.values"
    values.write_bytes(values.read_bytes()[:2])  # cut while a training run has the split open
    with pytest.raises(
        DataError, match=r"source\.values is shorter than its manifest says: delete .* prepare again"
    ):
        split.gather(np.arange(len(split)))


def _scramble(path, start: int, data: bytes) -> None:
    """Overwrites bytes of `path` at `start`: the same size, other contents."""
    content = bytearray(path.read_bytes())
    content[start : start + len(data)] = data
    path.write_bytes(bytes(content))


@pytest.mark.parametrize("in_memory", [True, False])
def test_right_sized_but_corrupt_files_are_named(tmp_path, monkeypatch, in_memory):
    """Random bytes in place of ids or offsets: a DataError naming the file, whether the split is read into memory
    or from its files (in chunks smaller than the files here, so the chunk seams are crossed). Read from its files,
    a split's ids are checked as batches read them: opening does not read the whole corpus."""
    import data.store

    monkeypatch.setattr(data.store, "CHECK_CHUNK", 7)
    cfg = folder_cfg(tmp_path)
    tokenizer, splits = prepare(cfg, progress=False)
    vocab = {"source": tokenizer.source_vocab_size, "target": tokenizer.target_vocab_size}
    directory = splits["train"]
    pristine = {path.name: path.read_bytes() for path in directory.iterdir()}
    split = PreparedSplit.open(directory, in_memory=in_memory, vocab=vocab)  # intact: opens
    assert len(split) == split.manifest["pairs"]
    dtype = np.dtype(split.manifest["dtype"])

    def damaged(name, start, data):
        for path in directory.iterdir():
            path.write_bytes(pristine[path.name])
        _scramble(directory / name, start, data)
        return lambda: PreparedSplit.open(directory, in_memory=in_memory, vocab=vocab)

    too_large = np.array([vocab["target"]], dtype).tobytes()  # one id past the vocabulary, in the 10th piece
    with pytest.raises(DataError, match=rf"target\.values is corrupt \(piece id {vocab['target']} outside"):
        opened = damaged("target.values", 9 * dtype.itemsize, too_large)()  # in memory: refused at once
        opened.gather(np.arange(len(opened)))  # read from the file: refused by the batch that reads the id
    backwards = np.array([3], np.int64).tobytes()  # offset 20 set back to 3: pair 19 ends before it starts
    with pytest.raises(DataError, match=r"source\.offsets is corrupt \(offset 20 decreases\).*prepare again"):
        damaged("source.offsets", 20 * 8, backwards)()
    lengths = np.array([60000], np.uint16).tobytes()  # pair 12's source length, not what the offsets say
    with pytest.raises(
        DataError, match=r"lengths is corrupt \(source lengths disagree with source\.offsets\)"
    ):
        damaged("lengths", 12 * 4, lengths)()
    damaged("target.values", 9 * dtype.itemsize, too_large)
    PreparedSplit.open(directory, in_memory=in_memory)  # without a vocabulary the ids are not checked
    with pytest.raises(DataError, match=r"target\.values is corrupt"):
        make_train_dataset(cfg, tokenizer, seed=0)  # what training opens


def test_an_entry_without_its_manifest_is_prepared_again(tmp_path):
    cfg = folder_cfg(tmp_path)
    _, splits = prepare(cfg, progress=False)
    directory = splits["train"]

    def contents():  # the arrays byte for byte, the manifest but its timing
        files = {path.name: path.read_bytes() for path in directory.iterdir() if path.name != "manifest.json"}
        manifest = json.loads((directory / "manifest.json").read_text())
        return files, {key: value for key, value in manifest.items() if key != "seconds"}

    pristine = contents()
    (directory / "manifest.json").unlink()  # by hand: the entry no longer counts as complete
    _, again = prepare(cfg, progress=False)
    assert again["train"] == directory
    assert contents() == pristine


def test_a_damaged_cached_tokenizer_is_named_with_the_fix(tmp_path):
    cfg = folder_cfg(tmp_path)
    prepare(cfg, progress=False)
    (model,) = (tmp_path / "cache").glob("tokenizer-*/spm.model")
    model.write_bytes(model.read_bytes()[:1000])
    with pytest.raises(
        DataError, match=rf"cached tokenizer is damaged \({model.parent}: .*delete {model.parent}"
    ):
        prepare(cfg, progress=False)


def test_the_cli_names_a_damaged_entry_instead_of_nothing_to_do(tmp_path, capsys):
    cfg = folder_cfg(tmp_path)
    config = str(write_config(tmp_path, cfg))
    assert main(["--config", config, "--no-progress"]) == 0
    capsys.readouterr()
    (offsets,) = (tmp_path / "cache").glob("*_train-*/source.offsets")
    offsets.unlink()
    assert main(["--config", config, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"{offsets} is truncated or corrupt" in err and "nothing to do" not in err


@pytest.mark.parametrize("from_config", [True, False])
def test_an_unwritable_cache_names_the_setting_that_chose_it(tmp_path, monkeypatch, from_config):
    """data.cache_dir wins over $NMT_DATA_CACHE: with it set (a trained run's config.yaml keeps it), the advice says
    so, instead of suggesting the variable, which changes nothing (found by a data review, 2026-12-07c)."""
    (tmp_path / "a-file").write_text("not a directory\n", encoding="utf-8")
    unwritable = tmp_path / "a-file" / "cache"
    monkeypatch.setenv("NMT_DATA_CACHE", str(tmp_path / "writable" if from_config else unwritable))
    cfg = dataclasses.replace(folder_cfg(tmp_path), cache_dir=str(unwritable) if from_config else "")
    with pytest.raises(DataError) as raised:
        prepare(cfg, progress=False)
    message = str(raised.value)
    assert message.startswith(f"cannot write into the data cache {unwritable}")
    if from_config:
        assert message.endswith(
            f"data.cache_dir is {unwritable} ($NMT_DATA_CACHE is used only when it is unset): set it to a writable "
            "directory (for a trained run, in its config.yaml)"
        )
    else:
        assert message.endswith("set data.cache_dir (or $NMT_DATA_CACHE) to a writable directory")


def test_a_split_with_no_usable_pair_stops_before_any_step_saying_why(tmp_path):
    """A validation split of blank lines: a data error when the split is opened (the trainer opens it before its
    first step), with preparation's counts; not a StopIteration at the first evaluation."""
    from data.pipeline import make_eval_dataset, open_split

    cfg = folder_cfg(tmp_path)
    (Path(cfg.folder) / "en.dev.txt").write_text("\n" * 3)
    (Path(cfg.folder) / "fr.dev.txt").write_text("Un.\n\n \n")
    tokenizer, _ = prepare(cfg, progress=False)
    message = (
        r"split 'dev' of folder has no usable pair \(kept 0 of 3 pairs; dropped 2 empty, 1 with one side"
    )
    with pytest.raises(DataError, match=message):
        open_split(cfg, tokenizer, "dev")
    with pytest.raises(DataError, match=message):
        make_eval_dataset(cfg, tokenizer, "dev")
    assert len(open_split(cfg, tokenizer, "train")) == TRAIN
    # data.prepare says so too, instead of "prepared" (the split the config validates on: train.py would stop)
    assert main(["--config", str(write_config(tmp_path, cfg)), "--no-progress"]) == 1


def test_a_train_split_with_no_usable_pair_says_why_not_just_empty(tmp_path):
    from data.tokenizer_training import train_tokenizer

    cfg = folder_cfg(tmp_path)
    (Path(cfg.folder) / "fr.train.txt").write_text(" \n" * (TRAIN + len(BAD)))
    with pytest.raises(
        DataError, match=r"split 'train' has no usable pair \(kept 0 of 84 pairs; dropped 1 empty"
    ):
        train_tokenizer(cfg, tmp_path / "tokenizer", seed=0)


def test_a_split_in_another_encoding_is_refused_not_mostly_dropped(tmp_path):
    """Latin-1 files: every line with an accent is invalid UTF-8. Dropping them line by line (with a warning) would
    train on what is left; most of a split invalid means the files' encoding, named with the fix."""
    from data.pipeline import open_split
    from data.tokenizer_training import train_tokenizer

    cfg = folder_cfg(tmp_path)
    dev = Path(cfg.folder) / "fr.dev.txt"
    lines = dev.read_text(encoding="utf-8").splitlines()
    tokenizer, _ = prepare(cfg, progress=False)  # a few bad lines: dropped with a warning (above)
    dev.write_bytes("".join(f"Déjà {line}\n" for line in lines).encode("latin-1", errors="replace"))
    message = (
        rf"split 'dev'.*: {len(lines)} of {len(lines)} pairs are not valid UTF-8 .* iconv -f latin1 -t utf-8"
    )
    with pytest.raises(DataError, match=message):
        open_split(cfg, tokenizer, "dev")
    with pytest.raises(DataError, match=message):
        load_text_pairs(cfg, "dev")
    assert not list(Path(cfg.cache_dir).rglob("*dev*partial*"))  # nothing half-written left in the cache
    train = Path(cfg.folder) / "fr.train.txt"
    train.write_bytes(
        train.read_text(encoding="utf-8").replace("\n", " à\n").encode("latin-1", errors="replace")
    )
    with pytest.raises(DataError, match=r"split 'train' \(the tokenizer's sample\): .* are not valid UTF-8"):
        train_tokenizer(cfg, tmp_path / "tokenizer2", seed=0)


def test_a_cp1252_split_is_refused_even_when_most_of_its_lines_are_plain_ascii(tmp_path):
    """cp1252 files where only some lines have a curly quote or an accent (here a fifth): refused naming the
    conversion, not a fifth of the split silently lost (before, up to half was dropped with a warning)."""
    from data.pipeline import open_split

    cfg = folder_cfg(tmp_path)
    tokenizer, _ = prepare(cfg, progress=False)
    count = 100
    quoted = [f"Line {i} is plain." + (" It\u2019s not." if i % 5 == 0 else "") for i in range(count)]
    (Path(cfg.folder) / "en.dev.txt").write_bytes("".join(f"{line}\n" for line in quoted).encode("cp1252"))
    (Path(cfg.folder) / "fr.dev.txt").write_text("".join(f"{line}\n" for line in sentences("fr", count, 2)))
    invalid = sum(not line.isascii() for line in quoted)
    assert count / 10 < invalid < count / 2  # below the old limit (half the split), above the new (a tenth)
    message = rf"split 'dev'.*: {invalid} of {count} pairs are not valid UTF-8 .* iconv"
    with pytest.raises(DataError, match=message):
        open_split(cfg, tokenizer, "dev")
    with pytest.raises(DataError, match=message):
        load_text_pairs(cfg, "dev", every_line=True)


def test_a_full_disk_while_the_tokenizer_is_written_is_an_error_not_a_traceback(tmp_path):
    """A file-size limit stands in for a full disk: data.prepare exits 1 naming the tokenizer's directory, and
    leaves nothing the cache would take as complete."""
    import resource
    import signal

    cfg = folder_cfg(tmp_path)

    def full_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, as ENOSPC: an error, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    done = subprocess.run(
        [sys.executable, "-m", "data.prepare", "--config", str(write_config(tmp_path, cfg)), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=600, preexec_fn=full_disk,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert re.search(
        r"error: cannot write the tokenizer into .*tokenizer-\w+\.partial: .*File too large", done.stderr
    )
    # the corpus files' digests (memoised: complete or absent) may stay
    left = [p.name for p in Path(cfg.cache_dir).iterdir() if not p.name.endswith(".lock")]
    assert left in ([], ["file-digests"]), left
