"""`data.prepare` on damaged input: named errors (exit 1), never a silent skip; TFDS corpora; the CLI."""

from __future__ import annotations

import dataclasses
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
    shard.write_bytes(shard.read_bytes()[:-40])
    damaged = dataclasses.replace(cfg, data_dir=str(tmp_path / "tfds"))
    # data_dir is a location, not a key: the cached tokens are used and nothing is read
    prepare(damaged, progress=False)
    damaged = dataclasses.replace(damaged, cache_dir=str(tmp_path / "fresh"))
    with pytest.raises(DataError, match=rf"corrupt or truncated file\(s\): {shard}.*prepare again"):
        prepare(damaged, progress=False)


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
