"""A TFDS catalog dataset (not Multi30k) whose download host cannot be reached fails at once with a DataError
naming the host, the files to put in a mirror and where the mirror was looked for, never entering TFDS's retrying
downloader (before 2026-12-07: about 3.5 minutes of retries, then "looked at None").

Real TFDS builders; only the network is replaced: `socket.create_connection` fails, so the tests are the same on a
machine with or without network.
"""

from __future__ import annotations

import socket

import pytest
import tensorflow_datasets as tfds

from data import corpus
from data.config import DataConfig
from data.corpus import split_sizes
from data.errors import DataError

# the files TFDS 4.9.10 registers for each dataset, by host (its url_checksums)
TED = ("ted_hrlr_translate/pt_to_en", "pt", "en", {"www.phontron.com": ["qi18naacl-dataset.tar.gz"]})
WMT14 = (
    "wmt14_translate/de-en",
    "en",
    "de",
    {
        "data.statmt.org": ["dev.tgz"],
        "www.statmt.org": [
            "training-parallel-commoncrawl.tgz",
            "training-parallel-europarl-v7.tgz",
            "training-parallel-nc-v9.tgz",
            "wiki-titles.tgz",
        ],
    },
)


@pytest.fixture
def offline(monkeypatch, tmp_path) -> list:
    """No network (each connection fails at once, recorded), no mirror anywhere, and no TFDS preparation allowed."""
    attempts = []

    def unreachable(address, timeout=None, *args, **kwargs):
        attempts.append((address, timeout))
        raise OSError(101, "Network is unreachable (test)")

    def never(self, *args, **kwargs):
        pytest.fail(f"TFDS download_and_prepare was called for {self.name}: it retries for minutes offline")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", never)
    monkeypatch.delenv(corpus.MIRROR_ENV, raising=False)
    # no <repo>/../shared/data/<name> beside it
    monkeypatch.setattr(corpus, "REPO_ROOT", tmp_path / "elsewhere" / "repo")
    return attempts


@pytest.mark.parametrize("dataset, source, target, files", [TED, WMT14], ids=["ted", "wmt14"])
def test_an_unreachable_host_fails_at_once_naming_the_files_to_mirror(
    offline, tmp_path, dataset, source, target, files
):
    data_dir = tmp_path / "tfds"
    cfg = DataConfig(dataset=dataset, source=source, target=target, data_dir=str(data_dir))
    with pytest.raises(DataError) as error:
        split_sizes(cfg)
    message = str(error.value)
    assert message.startswith(f"cannot prepare TFDS dataset {dataset}: ")
    assert any(f" {host} is unreachable (" in message for host in files), message
    for name in (name for names in files.values() for name in names):
        assert name in message
    default = tmp_path / "elsewhere" / "shared" / "data" / dataset.split("/")[0]
    assert f"looked at data.manual_dir (unset), $NMT_DATA_MIRROR (unset), {default}, absent)" in message
    assert f"copy the prepared folder into data.data_dir ({data_dir})" in message
    assert "None" not in message and "\n" not in message
    # one short connection, with a timeout: the first unreachable host stops
    assert len(offline) == 1 and 0 < offline[0][1] <= 10, offline
    assert {address[0] for address, _ in offline} <= set(files)


def test_files_in_the_mirror_need_no_host_and_the_message_names_the_mirror(offline, tmp_path, monkeypatch):
    """Only the files the mirror lacks are named (and their hosts checked); with all of them there, TFDS prepares
    from the mirror without any connection, and its failure names the mirror, not "None"."""
    dataset, source, target, files = WMT14
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name in files["www.statmt.org"]:
        (mirror / name).write_bytes(b"")
    cfg = DataConfig(
        dataset=dataset, source=source, target=target, data_dir=str(tmp_path / "tfds"), manual_dir=str(mirror)
    )
    with pytest.raises(
        DataError, match=r"data.statmt.org is unreachable .*raw files dev.tgz \(http"
    ) as error:
        split_sizes(cfg)
    message = str(error.value)
    assert "www.statmt.org" not in message and f"looked at data.manual_dir={mirror})" in message
    assert [address[0] for address, _ in offline] == ["data.statmt.org"]

    (mirror / "dev.tgz").write_bytes(b"")
    prepared = []

    def from_the_mirror(self, download_config=None, **kwargs):
        prepared.append(download_config.manual_dir)
        raise RuntimeError("damaged archive (test)")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", from_the_mirror)
    monkeypatch.setenv(corpus.MIRROR_ENV, str(mirror))
    cfg = DataConfig(dataset=dataset, source=source, target=target, data_dir=str(tmp_path / "tfds"))
    with pytest.raises(
        DataError, match=rf"RuntimeError: damaged archive.*looked at \$NMT_DATA_MIRROR={mirror}\)\.$"
    ):
        split_sizes(cfg)
    assert prepared == [mirror] and [address[0] for address, _ in offline] == ["data.statmt.org"]
