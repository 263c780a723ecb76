"""Multi30k without its data: no mirror where the config says, no network. A clear error, and a clean next run.

No test here ever waits on the network. The mirror checks fail before any download is tried when `data.manual_dir`
is set. Without any mirror, `data/multi30k.py` first checks that the download host is reachable (one connection
attempt with a timeout) and fails with the mirror hint if it is not, because the TFDS download manager's `requests`
session would retry 10 times with exponential backoff (about 200 s per file when DNS fails, as measured here). The
in-process test below makes "no network" instant and deterministic by failing name resolution, and asserts that
behaviour rather than a duration: one bounded connection attempt, and the TFDS downloader never called. (Its
`MAX_RETRIES` is set to 0 so that a regression fails fast instead of retrying for minutes.)
"""

from __future__ import annotations

import gzip
import socket
from pathlib import Path

import pytest

from tests.faults.helpers import fault_tree, write_config
from tests.run_fixture import tiny_corpus

STEMS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}


def write_fake_mirror(folder: Path) -> Path:
    """A flat Multi30k mirror (`train.en.gz`, `val.de.gz`, ...) holding the tiny templated corpus."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in tiny_corpus().items():
        for index, lang in enumerate(("en", "de")):
            text = "".join(pair[index] + "\n" for pair in pairs)
            (folder / f"{STEMS[split]}.{lang}.gz").write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    return folder


def half_prepared(data_dir: Path) -> list[Path]:
    """Anything TFDS would have to clean up: incomplete dataset folders, partial downloads, data files."""
    return [
        p
        for p in data_dir.rglob("*")
        if "incomplete" in p.name or ".tmp" in p.name or (p.is_file() and p.suffix not in (".json",))
    ]


def prepared(data_dir: Path) -> bool:
    return any(data_dir.glob("multi30k/en-de/*/dataset_info.json"))


def test_no_mirror_gives_clear_error_and_the_next_run_prepares(corpus, tmp_path, monkeypatch, capsys):
    """train.main in this process (exit code and stderr as train.py's; saves a process start)."""
    import train as train_cli
    from data.corpus import split_sizes
    from nmt.config import load_config
    from nmt.run_dir import RunDir
    from nmt.run_start import check_resume_compatible

    data_dir, missing, run_dir = tmp_path / "tfds", tmp_path / "no_such_mirror", tmp_path / "run"
    tree = fault_tree(corpus)
    tree["data"].update(dataset="multi30k", folder=None, manual_dir=str(missing), data_dir=str(data_dir))
    tree["train"].update(max_steps=2)
    config = write_config(tmp_path / "multi30k.yaml", tree)

    monkeypatch.delenv("NMT_DATA_MIRROR", raising=False)
    code = train_cli.main(["--config", str(config), "--model-dir", str(run_dir)])
    stderr = capsys.readouterr().err
    assert code == 1, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last == (
        f"train.py: data error: data.manual_dir={missing}: no such directory (it should hold the raw corpus files)"
    )
    assert not missing.exists()
    assert not prepared(data_dir)
    assert not data_dir.exists() or half_prepared(data_dir) == []
    assert not (run_dir / "tokenizer").exists() and not (run_dir / "checkpoints").exists()

    # The failed start was undone (nothing of it left to refuse the next command): the user points
    # data.manual_dir at a real mirror and reruns the same command on the same run directory, a new run there,
    # and the data prepares.
    assert not run_dir.exists()
    mirror = write_fake_mirror(tmp_path / "mirror")
    fixed = load_config(config, [f"data.manual_dir={mirror}"])
    assert not check_resume_compatible(RunDir(run_dir), fixed)  # a new run, no refusal
    assert split_sizes(fixed.data) == {"train": 200, "validation": 40, "test": 40}
    assert prepared(data_dir)


@pytest.fixture
def no_network_no_mirror(monkeypatch, tmp_path) -> dict[str, list]:
    """No mirror anywhere (config, $NMT_DATA_MIRROR, <repo>/../shared/data) and no network, failing instantly.

    Returns what was attempted: {"connect": [(address, timeout)], "lookup": [host], "download": [urls]}.
    """
    import tensorflow_datasets as tfds
    import tensorflow_datasets.core.download.downloader as downloader

    import data.corpus

    attempts = {"connect": [], "lookup": [], "download": []}
    create_connection, download = socket.create_connection, tfds.download.DownloadManager.download

    def no_dns(host, *args, **kwargs):
        attempts["lookup"].append(host)
        raise socket.gaierror(socket.EAI_NONAME, "no network (test)")

    def connect(address, timeout=None, *args, **kwargs):  # None: no timeout given, may block for minutes
        attempts["connect"].append((address, timeout))
        return create_connection(address, timeout, *args, **kwargs)

    def spied_download(self, url_or_urls):
        attempts["download"].append(url_or_urls)
        return download(self, url_or_urls)

    monkeypatch.delenv("NMT_DATA_MIRROR", raising=False)
    monkeypatch.setattr(data.corpus, "REPO_ROOT", tmp_path / "elsewhere" / "repo")  # no ../shared/data here
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(tfds.download.DownloadManager, "download", spied_download)
    monkeypatch.setattr(downloader, "MAX_RETRIES", 0)
    return attempts


def test_no_mirror_and_no_network_in_process(no_network_no_mirror, tmp_path):
    from data.corpus import split_sizes
    from data.errors import DataError
    from nmt.config import DataConfig

    data_dir = tmp_path / "tfds"
    cfg = DataConfig(dataset="multi30k", source="en", target="de", data_dir=str(data_dir))
    with pytest.raises(DataError) as error:
        split_sizes(cfg)
    # It gave up after one connection attempt that cannot hang (a timeout), before the retrying downloader.
    attempts = no_network_no_mirror
    assert len(attempts["connect"]) == 1 and attempts["lookup"], attempts
    (_, timeout) = attempts["connect"][0]
    assert timeout is not None and timeout > 0, "the reachability check could wait forever"
    assert attempts["download"] == [], (
        "the TFDS downloader was called: without network it retries for minutes"
    )
    message = str(error.value)
    assert message.startswith("cannot download Multi30k")
    for where in (
        "data.manual_dir",
        "$NMT_DATA_MIRROR",
        "<repo>/../shared/data/multi30k",
        "train/val/test_2016_flickr",
    ):
        assert where in message
    assert not prepared(data_dir)

    # Whatever the failed attempt left in data_dir does not stop a later prepare from a mirror.
    mirror = write_fake_mirror(tmp_path / "mirror")
    sizes = split_sizes(
        DataConfig(
            dataset="multi30k", source="en", target="de", data_dir=str(data_dir), manual_dir=str(mirror)
        )
    )
    assert sizes == {"train": 200, "validation": 40, "test": 40}
    assert prepared(data_dir)
