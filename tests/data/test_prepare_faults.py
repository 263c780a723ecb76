"""`data.prepare` on damaged input: named errors (exit 1), never a silent skip; TFDS corpora; the CLI."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from data.config import DataConfig
from data.errors import DataError
from data.pipeline import make_train_dataset
from data.prepare import main, prepare
from data.store import PreparedSplit
from tests.data.test_prepare import folder_cfg, write_config


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


def test_a_tfds_catalog_corpus_is_prepared(tmp_path):
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
