"""`load_split`, `load_text_pairs`, `split_sizes` for Multi30k, a TranslateFolder and a (mocked) TFDS catalog set."""

from __future__ import annotations

import dataclasses
import gzip
import socket

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from data import corpus
from data.config import DataConfig
from data.corpus import find_mirror, load_split, load_text_pairs, split_sizes
from data.errors import DataError
from tests.data.conftest import SIZES, mirror_lines, sentences


def test_multi30k_both_directions_in_corpus_order(data_cfg, mirror):
    sources, targets = load_text_pairs(data_cfg, "validation")
    assert sources == mirror_lines(mirror, "val", "en")
    assert targets == mirror_lines(mirror, "val", "de")
    reverse = dataclasses.replace(data_cfg, source="de", target="en")
    sources, targets = load_text_pairs(reverse, "test")
    assert sources == mirror_lines(mirror, "test_2016_flickr", "de")
    assert targets == mirror_lines(mirror, "test_2016_flickr", "en")
    assert split_sizes(data_cfg) == {
        "train": SIZES["train"],
        "validation": SIZES["val"],
        "test": SIZES["test_2016_flickr"],
    }


def test_load_split_yields_string_pairs(data_cfg):
    ds = load_split(data_cfg, "validation")
    assert ds.element_spec == {
        "source": tf.TensorSpec([], tf.string),
        "target": tf.TensorSpec([], tf.string),
    }
    assert sum(1 for _ in ds) == SIZES["val"]


def test_unknown_language_split_and_dataset(data_cfg):
    with pytest.raises(DataError, match="'cs' is not in multi30k"):
        load_split(dataclasses.replace(data_cfg, target="cs"), "train")
    with pytest.raises(DataError, match="split 'dev' is not in dataset 'multi30k'"):
        load_split(data_cfg, "dev")
    with pytest.raises(DataError, match="unknown dataset 'no_such_corpus'.*'multi30k', 'folder'"):
        load_split(dataclasses.replace(data_cfg, dataset="no_such_corpus"), "train")


def test_tfds_split_slices_are_read_and_bad_ones_are_data_errors(data_cfg, mirror, tmp_path):
    """A malformed or out-of-range slice is a DataError naming the split (and the config key, for the config's
    splits) with TFDS's reason, found when the dataset is opened: before a tokenizer is trained or a split read
    (before 2026-12-07, a traceback from `as_dataset` after the train split was tokenized)."""
    from data.prepare import prepare

    sources, targets = load_text_pairs(data_cfg, "validation[2:5]")
    assert (sources, targets) == (
        mirror_lines(mirror, "val", "en")[2:5],
        mirror_lines(mirror, "val", "de")[2:5],
    )
    assert load_text_pairs(data_cfg, "test[-20%:]")[1] == mirror_lines(mirror, "test_2016_flickr", "de")[-2:]
    with pytest.raises(
        DataError, match=r"^split 'validation\[:abc\]' of dataset 'multi30k' cannot be read: Unrec"
    ):
        load_split(data_cfg, "validation[:abc]")
    with pytest.raises(
        DataError, match=r"^split 'test\[50:\]' .*: Requested slice \[50:10\] incompatible with 10"
    ):
        load_split(data_cfg, "test[50:]")
    for empty in ("test[:0]", "test[3:3]", "test[:1%]", "test[:0]+validation[:0]"):  # 10 pairs: 1% is none
        with pytest.raises(DataError, match=r"selects no examples \(an empty slice\)$"):
            load_split(data_cfg, empty)
    # a reversed part fails TFDS's read, whatever the other parts select
    for reversed_ in ("test[5:2]", "validation[5:2]+validation[0:3]", "test[-2:]+test[5:2]"):
        with pytest.raises(DataError, match=r"has a reversed slice$"):
            load_split(data_cfg, reversed_)
    assert len(load_text_pairs(data_cfg, "test[:0]+validation[0:3]")[0]) == 3  # an empty part is harmless
    cases = {
        "validation_split": ("validation[:10%", "Unrecognized split format: 'validation\\[:10%'"),
        "test_split": ("test[:500]", "Requested slice \\[:500\\] incompatible with 10 examples"),
        "train_split": ("train[abc]", "Unrecognized split format"),
    }
    for key, (split, reason) in cases.items():
        cfg = dataclasses.replace(data_cfg, cache_dir=str(tmp_path / key), **{key: split})
        with pytest.raises(
            DataError, match=rf"^data\.{key}: split '.*' of dataset 'multi30k' cannot be read: {reason}"
        ):
            split_sizes(cfg)
        with pytest.raises(DataError, match=rf"^data\.{key}: "):
            prepare(cfg, progress=False)
        # refused before the tokenizer was trained: nothing was written into the cache
        assert not (tmp_path / key).exists() or not any((tmp_path / key).rglob("*.model"))


def write_folder(folder, splits={"train": 20, "dev": 5}):  # noqa: B006 - read only
    folder.mkdir(parents=True, exist_ok=True)
    for index, (split, count) in enumerate(splits.items()):
        for lang in ("en", "fr"):
            (folder / f"{lang}.{split}.txt").write_text("\n".join(sentences(lang, count, index)) + "\n")
    return folder


def test_translate_folder(tmp_path):
    cfg = DataConfig(
        dataset="folder", folder=str(write_folder(tmp_path / "corpus")), source="fr", target="en"
    )
    assert split_sizes(cfg) == {"train": 20, "dev": 5}
    sources, targets = load_text_pairs(cfg, "dev")
    assert sources == sentences("fr", 5, 1) and targets == sentences("en", 5, 1)


def test_an_evaluation_reads_every_line_of_a_folder_split_as_the_evaluation_clis_read_files(tmp_path, caplog):
    """every_line: the lines sacreBLEU would score on the files, decoded as evaluate.py --source/--reference reads
    them (nmt.text_io, the reference); without it, the pairs preparation drops are left out."""
    from nmt.text_io import read_lines

    folder = write_folder(tmp_path / "corpus")
    (folder / "fr.dev.txt").write_bytes("un\r\n\ufeffdeux\n   \ntr\xe8s\n\n".encode() + b"caf\xe9 \x00x\n")
    (folder / "en.dev.txt").write_bytes(b"one\r\ntwo\nthree\n\n\nsix\n")
    cfg = DataConfig(dataset="folder", folder=str(folder), source="fr", target="en")
    sources, targets = load_text_pairs(cfg, "dev", every_line=True)
    for texts, name in ((sources, "fr.dev.txt"), (targets, "en.dev.txt")):
        with open(folder / name, "rb") as handle:
            assert texts == list(read_lines(handle)), name
    assert sources[5] == "caf\ufffd x" and len(sources) == 6
    assert "1 pair(s) with invalid UTF-8, replaced with U+FFFD" in caplog.text
    assert load_text_pairs(cfg, "dev") == (["un", "\ufeffdeux"], ["one", "two"])  # blank and invalid: dropped


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("README.md", "hi\n", r"README\.md: data\.folder must hold only files named <lang>\.<split>\.txt"),
        ("fr.train.txt", "a\n", r"en\.train\.txt has 20 lines but .*fr\.train\.txt has 1: .* line-aligned"),
        ("de.dev.txt", "a\n", None),  # a third language need not align: only source and target are read
    ],
)
def test_translate_folder_errors(tmp_path, name, content, message):
    folder = write_folder(tmp_path / "corpus")
    (folder / name).write_text(content)
    cfg = DataConfig(dataset="folder", folder=str(folder), source="fr", target="en")
    if message is None:
        assert split_sizes(cfg) == {"train": 20, "dev": 5}
        return
    with pytest.raises(DataError, match=message):
        split_sizes(cfg)


def test_a_misaligned_split_the_config_does_not_name_is_left_out_with_a_warning(tmp_path, caplog):
    """data.stats counts every split: one nothing trains or validates on does not stop it (data.prepare never
    reads it); the configured splits must still align."""
    folder = write_folder(tmp_path / "corpus", {"train": 20, "dev": 5, "extra": 3})
    (folder / "fr.extra.txt").write_text("a\n")
    cfg = DataConfig(dataset="folder", folder=str(folder), source="fr", target="en", validation_split="dev")
    assert split_sizes(cfg) == {"train": 20, "dev": 5}
    assert "en.extra.txt has 3 lines but" in caplog.text
    assert "split 'extra' must be line-aligned (left out: no data.*_split names it)" in caplog.text
    with pytest.raises(DataError, match="split 'extra' must be line-aligned"):
        split_sizes(dataclasses.replace(cfg, test_split="extra"))


NO_BOM = "starts with NUL bytes: UTF-16 or UTF-32 text without a byte-order mark,"


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        ("Hello.\r\n".encode("utf-16"), r"UTF-16 \(or UTF-32\) text \(byte-order mark FF FE\)"),
        (b"\xfe\xff" + "Hello.\n".encode("utf-16-be"), r"UTF-16 text \(byte-order mark FE FF\)"),
        (gzip.compress(b"Hello.\n", mtime=0), "gzip-compressed"),
        ("Hello.\n".encode("utf-16-le"), NO_BOM),
        ("Hello.\n".encode("utf-16-be"), NO_BOM),
        ("Hello.\n".encode("utf-32-le"), NO_BOM),
    ],
    ids=["utf-16-le", "utf-16-be", "gzip", "utf-16-le-no-bom", "utf-16-be-no-bom", "utf-32-le-no-bom"],
)
def test_a_folder_file_that_is_not_utf8_text_is_named_with_its_encoding(tmp_path, data, kind):
    """What Windows PowerShell's `>` writes (UTF-16 with CRLF), or a .gz renamed .txt: one error naming the file
    and what it is, not text full of NUL bytes or a misleading "truncated?"."""
    folder = write_folder(tmp_path / "corpus")
    (folder / "en.train.txt").write_bytes(data)
    cfg = DataConfig(dataset="folder", folder=str(folder), source="fr", target="en")
    message = rf"en\.train\.txt (is |){kind}.* not UTF-8 text: convert it"
    with pytest.raises(DataError, match=message):
        split_sizes(cfg)
    with pytest.raises(DataError, match=message):
        load_text_pairs(cfg, "train")


def test_an_unreadable_folder_file_is_a_data_error_naming_it(tmp_path):
    folder = write_folder(tmp_path / "corpus")
    (folder / "en.train.txt").unlink()
    (folder / "en.train.txt").mkdir()  # open() fails (IsADirectoryError) for root too, unlike chmod 000
    from data import folder as folder_corpus

    with pytest.raises(DataError, match=r"cannot read .*en\.train\.txt: .*Is a directory"):
        folder_corpus.count_lines(folder / "en.train.txt")
    with pytest.raises(DataError, match=r"cannot read .*en\.train\.txt: .*Is a directory"):
        list(folder_corpus._lines(folder / "en.train.txt"))


def test_a_line_over_the_limit_is_read_cut_not_whole(tmp_path, monkeypatch):
    """A file without newlines (a binary or minified file) must not be read into memory whole: its over-long line
    comes out cut just past the limit, and cleaning drops it as too long."""
    from data import cleaning
    from data import folder as folder_corpus

    monkeypatch.setattr(cleaning, "MAX_LINE_BYTES", 64)
    monkeypatch.setattr(folder_corpus, "MAX_LINE_BYTES", 64)
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "en.dev.txt").write_bytes(b"One.\n" + b"y" * 5000 + b"\n" + b"x" * 64 + b"\r\nTwo." + b"z" * 70)
    (folder / "fr.dev.txt").write_bytes(b"Un.\nLong.\nJuste.\nDeux.\n")
    assert [len(line) for line in folder_corpus._lines(folder / "en.dev.txt")] == [4, 66, 64, 66]
    cfg = DataConfig(dataset="folder", folder=str(folder), source="en", target="fr")
    assert load_text_pairs(cfg, "dev") == (["One.", "x" * 64], ["Un.", "Juste."])


def test_translate_folder_lines_split_on_newline_only_and_bad_pairs_dropped(tmp_path, caplog):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "en.dev.txt").write_bytes("\ufeffOne\u2028line\r\nTwo\n\n".encode() + b"\xff\n")
    (folder / "fr.dev.txt").write_bytes(b"Une ligne\nDeux\n\nTrois\n")
    cfg = DataConfig(dataset="folder", folder=str(folder), source="en", target="fr")
    assert split_sizes(cfg) == {"dev": 4}
    assert load_text_pairs(cfg, "dev") == (["One\u2028line", "Two"], ["Une ligne", "Deux"])
    assert "kept 2 of 4 pairs; dropped 1 empty, 1 invalid UTF-8" in caplog.text
    assert [ex["source"] for ex in load_split(cfg, "dev").as_numpy_iterator()] == [
        "One\u2028line".encode(), b"Two", b"", b"\xff",
    ]  # fmt: skip
    with pytest.raises(DataError, match=r"data.target='de': language not in data.folder"):
        load_split(dataclasses.replace(cfg, target="de"), "dev")
    with pytest.raises(DataError, match=r"en\.test\.txt: no such file for split 'test'"):
        load_split(cfg, "test")


def test_translate_folder_needs_a_folder(tmp_path):
    from common.config_tree import ConfigError
    from data.config import load_data_config

    with pytest.raises(ConfigError, match="data.dataset: folder needs data.folder"):  # a config error: exit 2
        load_data_config("base.yaml", ["data.dataset=folder"])
    with pytest.raises(
        ConfigError, match="data.folder is set .* but data.dataset is 'multi30k'"
    ):  # not ignored
        load_data_config("base.yaml", [f"data.folder={tmp_path}"])
    with pytest.raises(DataError, match="needs data.folder"):  # a DataConfig built in code
        load_split(DataConfig(dataset="folder"), "train")
    with pytest.raises(DataError, match="no such directory"):
        load_split(DataConfig(dataset="folder", folder=str(tmp_path / "absent")), "train")


def test_tfds_catalog_dataset_with_mock_data(tmp_path, monkeypatch):
    # mock_data prepares without downloading: the download host is taken as reachable (no network in tests)
    monkeypatch.setattr("data.corpus.check_host", lambda url, timeout=5.0: None)
    cfg = DataConfig(dataset="ted_hrlr_translate/pt_to_en", source="pt", target="en", data_dir=str(tmp_path))
    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        sources, targets = load_text_pairs(cfg, "validation")
        assert len(sources) == len(targets) == 6 and all(isinstance(s, str) for s in sources)
        with pytest.raises(
            DataError, match=r"data.target='de': language not in dataset .*\(it has: pt, en\)"
        ):
            load_split(dataclasses.replace(cfg, target="de"), "train")


def test_catalog_dataset_without_network_explains_the_way_out(tmp_path, monkeypatch):
    """A download that fails although its host answered (tests/data/test_catalog_offline.py: one that does not)."""

    class Answered:
        def close(self):
            pass

    def offline(self, **kwargs):
        raise ConnectionError("Failed to resolve 'github.com'")

    monkeypatch.setattr(socket, "create_connection", lambda *args, **kwargs: Answered())
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
    cfg = DataConfig(dataset="ted_hrlr_translate/pt_to_en", source="pt", target="en", data_dir=str(tmp_path))
    with pytest.raises(
        DataError, match=r"cannot prepare TFDS dataset .*ConnectionError.*data\.data_dir.*data\.manual_dir"
    ) as error:
        load_split(cfg, "train")
    assert "looked at None" not in str(error.value)


def test_a_language_a_catalog_dataset_lacks_is_named_before_any_download(tmp_path, monkeypatch):
    """The features are known without the data: a wrong data.source or data.target is refused before TFDS
    downloads and prepares the dataset (hours for WMT; before 2026-12-07 the language was checked afterwards). The
    download fails at once here (no network), so reaching it gives the network error instead."""
    downloads = []

    def offline(self, **kwargs):
        downloads.append(self.name)
        raise ConnectionError("Failed to resolve 'github.com'")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
    cfg = DataConfig(dataset="ted_hrlr_translate/pt_to_en", source="pt", target="en", data_dir=str(tmp_path))
    for key, wrong in (("source", "de"), ("target", "fr")):
        with pytest.raises(
            DataError, match=rf"^data.{key}='{wrong}': language not in dataset .*\(it has: pt, en\)$"
        ):
            split_sizes(dataclasses.replace(cfg, **{key: wrong}))
    assert downloads == []


def test_find_mirror_order(tmp_path, monkeypatch):
    explicit, from_env = tmp_path / "explicit", tmp_path / "env"
    explicit.mkdir()
    from_env.mkdir()
    monkeypatch.setattr(corpus, "REPO_ROOT", tmp_path / "repo")  # no ../shared/data/multi30k beside it
    monkeypatch.delenv(corpus.MIRROR_ENV, raising=False)
    assert find_mirror(DataConfig()) is None
    monkeypatch.setenv(corpus.MIRROR_ENV, str(from_env))
    assert find_mirror(DataConfig()) == from_env
    assert find_mirror(DataConfig(manual_dir=str(explicit))) == explicit
    with pytest.raises(DataError, match=r"data.manual_dir=.*absent: no such directory"):
        find_mirror(DataConfig(manual_dir=str(tmp_path / "absent")))
    default = tmp_path / "shared" / "data" / "multi30k"
    default.mkdir(parents=True)
    monkeypatch.delenv(corpus.MIRROR_ENV)
    assert find_mirror(DataConfig()) == default


def test_a_second_preparation_of_the_same_dataset_waits_for_the_first(data_cfg, mirror, tmp_path):
    """Two first trainings started together prepare one TFDS dataset: the second waits for the first's lock.

    The test holds the lock itself, starts a preparation in another process and checks it waits (it logs so and
    writes nothing) until the lock is released, then completes. Without the lock, TFDS let one process delete the
    other's files mid-write ("Failed to finalize writing of split").
    """
    import fcntl
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from data.multi30k import Multi30k

    root, timeout = Path(__file__).resolve().parents[2], 600  # the deadline only turns a hang into a failure
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")

    data_dir = tmp_path / "tfds"
    builder = Multi30k(config="en-de", data_dir=str(data_dir))
    lock = corpus.preparation_lock(builder)
    lock.parent.mkdir(parents=True)
    script = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        "from data.config import DataConfig; from data.corpus import tfds_builder\n"
        f"tfds_builder(DataConfig(manual_dir={str(mirror)!r}, data_dir={str(data_dir)!r}))\n"
        "print('prepared', file=sys.stderr)\n"
    )
    log_path = tmp_path / "prepare.log"
    with open(lock.with_name(lock.name + ".lock"), "a") as held, open(log_path, "wb") as log_file:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, env=env, stderr=log_file)
        try:
            deadline = time.monotonic() + timeout
            while "another process is preparing" not in log_path.read_text(errors="replace"):
                assert proc.poll() is None, f"it did not wait for the lock:\n{log_path.read_text()[-2000:]}"
                assert time.monotonic() < deadline, "hang: the preparation never reached the lock"
                time.sleep(0.2)
            assert not list(data_dir.glob("multi30k/en-de/*")), (
                "it wrote while another preparation held the lock"
            )
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
        code = proc.wait(timeout=timeout)
    assert code == 0, log_path.read_text()[-2000:]
    assert "prepared" in log_path.read_text()
    done = corpus.load_split(dataclasses.replace(data_cfg, data_dir=str(data_dir)), "train")
    assert len(list(done)) == SIZES["train"]
