"""A prepared TFDS dataset directory that lost a file or holds a cut one (a partial copy, an interrupted deletion):
a data error naming the directory to delete, exit 1, before anything is written into the cache; not a traceback
(before: "splits is empty", a protobuf ParseError, a FileNotFoundError for a shard)."""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest

from data.config import DataConfig
from data.corpus import tfds_builder
from data.errors import DataError
from data.prepare import main, prepare
from tests.data.test_prepare import write_config

INFO = "dataset_info.json"
TEST_SHARD = "multi30k-test.tfrecord-00000-of-00001"


def damaged_copy(tmp_path, mirror, prepared_dir, damage) -> tuple[DataConfig, object]:
    """A copy of the session's prepared Multi30k with `damage(version_dir)` done to it, and its version dir."""
    cfg = DataConfig(
        manual_dir=str(mirror), data_dir=str(prepared_dir), vocab_size=96, cache_dir=str(tmp_path / "cache")
    )
    tfds_builder(cfg)  # the session's prepared Multi30k, intact: copied, then the copy damaged
    shutil.copytree(prepared_dir / "multi30k", tmp_path / "tfds" / "multi30k")
    (version,) = (tmp_path / "tfds" / "multi30k" / "en-de").iterdir()
    damage(version)
    return dataclasses.replace(cfg, data_dir=str(tmp_path / "tfds")), version


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda version: (version / INFO).unlink(), rf"is incomplete \(no {INFO}\)"),
        (
            lambda version: (version / INFO).write_text("{"),
            rf"is damaged: .*/{INFO} cannot be read \(ParseError: ",
        ),
        (
            lambda version: (version / INFO).write_text(""),
            rf"is damaged: .*/{INFO} cannot be read \(ParseError: ",
        ),
        (
            lambda version: (version / INFO).write_text("{}"),
            rf"is damaged: .*/{INFO} cannot be read \(AssertionError: ",
        ),
        (
            lambda version: (version / INFO).write_text('{"version": "1.0.0"}'),
            rf"is incomplete \(its {INFO} lists no splits\)",
        ),
        (lambda version: (version / TEST_SHARD).unlink(), rf"is incomplete \(missing: {TEST_SHARD}\)"),
    ],
    ids=["no-info", "cut-info", "empty-info", "info-of-no-version", "info-without-splits", "no-test-shard"],
)
def test_a_damaged_tfds_directory_is_a_data_error_naming_it(
    tmp_path, mirror, prepared_dir, capsys, damage, problem
):
    cfg, version = damaged_copy(tmp_path, mirror, prepared_dir, damage)
    expected = (
        rf"prepared TFDS dataset 'multi30k'.*{problem}.*: delete {re.escape(str(version))} and prepare again$"
    )
    with pytest.raises(DataError, match=expected):
        prepare(cfg, progress=False)
    # nothing of it in the cache (before, without dataset_info.json: a tokenizer-*.partial stayed)
    assert not [path.name for path in (tmp_path / "cache").glob("*") if not path.name.endswith(".lock")]
    # the CLI: one line, exit 1
    assert main(["--config", str(write_config(tmp_path, cfg)), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch("error: .*" + expected, err[-1]) and "Traceback" not in "\n".join(err)


def test_deleting_the_named_directory_prepares_it_again(tmp_path, mirror, prepared_dir):
    cfg, version = damaged_copy(
        tmp_path, mirror, prepared_dir, lambda version: (version / TEST_SHARD).unlink()
    )
    with pytest.raises(DataError) as raised:
        prepare(cfg, progress=False)
    named = re.search(r": delete (\S+) and prepare again$", str(raised.value)).group(1)
    assert named == str(version)
    shutil.rmtree(named)
    _, splits = prepare(cfg, progress=False)
    assert sorted(splits) == ["test", "train", "validation"] and (version / TEST_SHARD).is_file()


def test_prepared_data_is_read_after_its_mirror_moved(tmp_path, mirror, prepared_dir):
    """A run's config.yaml keeps data.manual_dir; prepared data never reads the mirror again, so a mirror moved
    since does not stop evaluate.py or a resume (before 2026-12-07d: "data.manual_dir=...: no such directory").
    A dataset still to prepare needs it, and says so."""
    from data.corpus import load_text_pairs

    cfg, _ = damaged_copy(tmp_path, mirror, prepared_dir, lambda version: None)
    moved = dataclasses.replace(cfg, manual_dir=str(tmp_path / "moved"))
    assert load_text_pairs(moved, "validation") == load_text_pairs(cfg, "validation")
    unprepared = dataclasses.replace(moved, data_dir=str(tmp_path / "empty"))
    with pytest.raises(DataError, match=r"data\.manual_dir=.*moved: no such directory"):
        tfds_builder(unprepared)
