"""The Multi30k TFDS builder: offline preparation from a mirror, clear errors, no half-prepared state."""

from __future__ import annotations

import gzip
import socket
from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from data.errors import DataError
from data.multi30k import Multi30k, config_name, read_lines
from tests.data.conftest import SIZES, mirror_lines, write_mirror

SHARED_MIRROR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"


def prepare(data_dir: Path, manual_dir: Path | None, config: str = "en-de") -> Multi30k:
    builder = Multi30k(config=config, data_dir=str(data_dir))
    download_config = tfds.download.DownloadConfig(manual_dir=manual_dir, try_download_gcs=False)
    builder.download_and_prepare(download_config=download_config)
    return builder


def assert_nothing_prepared(data_dir: Path) -> None:
    config_dir = data_dir / "multi30k" / "en-de"
    leftovers = list(config_dir.iterdir()) if config_dir.exists() else []
    assert leftovers == [], f"a failed prepare left {leftovers}"


def test_prepares_splits_in_corpus_order_and_reuses(tmp_path, mirror):
    builder = prepare(tmp_path, mirror)
    sizes = {name: split.num_examples for name, split in builder.info.splits.items()}
    assert sizes == {"train": SIZES["train"], "validation": SIZES["val"], "test": SIZES["test_2016_flickr"]}
    examples = list(builder.as_dataset(split="validation").as_numpy_iterator())
    assert [ex["en"].decode() for ex in examples] == mirror_lines(mirror, "val", "en")
    assert [ex["de"].decode() for ex in examples] == mirror_lines(mirror, "val", "de")

    # A second prepare reuses the prepared files: it does not read the mirror (a regeneration would fail on this
    # damaged copy, without touching the network), rewrites nothing, and reads the same examples.
    damaged = write_mirror(tmp_path / "damaged", languages=("en", "de"))
    (damaged / "train.en.gz").write_bytes(b"not gzip at all")
    files = {path: path.stat().st_mtime_ns for path in (tmp_path / "multi30k").rglob("*") if path.is_file()}
    assert any("train.tfrecord" in path.name for path in files)
    again = prepare(tmp_path, damaged)
    assert {
        path: path.stat().st_mtime_ns for path in (tmp_path / "multi30k").rglob("*") if path.is_file()
    } == files
    examples = again.as_dataset(split="validation").as_numpy_iterator()
    assert [ex["de"].decode() for ex in examples] == mirror_lines(mirror, "val", "de")


def test_other_pair_and_config_names(tmp_path, mirror):
    builder = prepare(tmp_path, mirror, config="en-fr")
    assert set(builder.info.features.keys()) == {"en", "fr"}
    assert config_name("de", "en") == "en-de" and config_name("fr", "de") == "de-fr"
    with pytest.raises(DataError, match="'cs' is not in multi30k"):
        config_name("en", "cs")
    with pytest.raises(DataError, match="no language pair en-en"):
        config_name("en", "en")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", r"missing val\.de\.gz"),
        ("empty", r"val\.de\.gz is empty"),
        ("mismatch", r"line counts differ: .*val\.en\.gz has 12 lines, .*val\.de\.gz has 11"),
        ("utf8", r"val\.de\.gz is not valid UTF-8 \(line 3"),
        ("gzip", r"val\.de\.gz is not a valid gzip file"),
    ],
)
def test_bad_mirror_files_are_named_and_leave_nothing_behind(tmp_path, damage, message):
    mirror = write_mirror(tmp_path / "mirror", languages=("en", "de"))
    target = mirror / "val.de.gz"
    lines = mirror_lines(mirror, "val", "de")
    if damage == "missing":
        target.unlink()
    elif damage == "empty":
        target.write_bytes(gzip.compress(b""))
    elif damage == "mismatch":
        target.write_bytes(gzip.compress(("\n".join(lines[:-1]) + "\n").encode()))
    elif damage == "utf8":
        raw = "\n".join(lines[:2]).encode() + b"\nbad \xff\xfe byte\n" + "\n".join(lines[3:]).encode()
        target.write_bytes(gzip.compress(raw))
    else:
        target.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=message):
        prepare(tmp_path / "tfds", mirror)
    assert_nothing_prepared(tmp_path / "tfds")

    write_mirror(mirror, languages=("en", "de"))  # repaired: the next prepare succeeds
    assert prepare(tmp_path / "tfds", mirror).info.splits["validation"].num_examples == SIZES["val"]


def test_no_mirror_and_no_network_says_where_the_mirror_goes(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(tfds.download.DownloadManager, "download", offline)
    monkeypatch.setattr(socket, "create_connection", offline)  # the fail-fast reachability check
    with pytest.raises(
        DataError, match=r"cannot download Multi30k.*data\.manual_dir.*NMT_DATA_MIRROR.*shared/data"
    ):
        prepare(tmp_path / "tfds", None)
    assert_nothing_prepared(tmp_path / "tfds")


def test_an_empty_mirror_is_named_and_nothing_is_downloaded(tmp_path, monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("an empty mirror must not lead to a download")

    monkeypatch.setattr(tfds.download.DownloadManager, "download", no_download)
    monkeypatch.setattr(socket, "create_connection", no_download)
    empty = tmp_path / "empty_mirror"
    empty.mkdir()
    with pytest.raises(DataError, match=rf"Multi30k mirror {empty} is empty: .*data\.manual_dir"):
        prepare(tmp_path / "tfds", empty)
    assert_nothing_prepared(tmp_path / "tfds")


def test_read_lines_splits_on_newlines_only(tmp_path):
    path = tmp_path / "x.en"
    path.write_bytes("\ufeffone\r\ntwo \u2028 still two\nthree".encode())
    assert read_lines(path) == ["one", "two \u2028 still two", "three"]


def test_real_mirror_prepares_offline(tmp_path):
    """CI: the shared Multi30k mirror prepares into a fresh data_dir with the published split sizes."""
    if not SHARED_MIRROR.is_dir():
        pytest.skip(f"the shared Multi30k mirror is absent ({SHARED_MIRROR})")
    builder = prepare(tmp_path, SHARED_MIRROR)
    sizes = {name: split.num_examples for name, split in builder.info.splits.items()}
    assert sizes == {"train": 29000, "validation": 1014, "test": 1000}


def test_a_rebuild_of_edited_text_of_the_same_size_changes_the_split_identity(tmp_path):
    """The README's recipe after editing a mirror (delete <data_dir>/multi30k): the prepared data's key changes,
    even when the edit keeps every byte count (before, only sizes were compared and the old tokens were reused).
    A rebuild of the same text elsewhere keeps the identity (a cache is keyed by text, not by place)."""
    from data.config import DataConfig
    from data.stream import split_identity

    mirror = write_mirror(tmp_path / "mirror", languages=("en", "de"))

    def identities(data_dir: Path) -> dict:
        cfg = DataConfig(
            dataset="multi30k", source="en", target="de", manual_dir=str(mirror), data_dir=str(data_dir),
            cache_dir=str(tmp_path / "cache"),
        )  # fmt: skip
        return {split: split_identity(cfg, split) for split in ("validation", "validation[:50%]", "train")}

    before = identities(tmp_path / "tfds")
    assert before["validation[:50%]"]["contents"] == before["validation"]["contents"] is not None
    assert before["validation[:50%]"]["examples"] == SIZES["val"]
    assert identities(tmp_path / "tfds-elsewhere") == before
    lines = mirror_lines(mirror, "val", "de")
    lines[0] = lines[0].swapcase()
    (mirror / "val.de.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8"), mtime=0))
    import shutil

    shutil.rmtree(tmp_path / "tfds" / "multi30k")
    after = identities(tmp_path / "tfds")
    assert after["validation"]["bytes"] == before["validation"]["bytes"]
    assert (
        after["validation"] != before["validation"]
        and after["validation[:50%]"] != before["validation[:50%]"]
    )
    assert after["train"] == before["train"]
