"""The prepared-split cache under faults: a disk that fills while a split is written leaves nothing behind (the
disk gets its space back), and a manifest of the wrong shape is a data error naming it, not a traceback."""

import errno
import json
import shutil

import pytest

from data.errors import DataError
from data.pipeline import open_split
from data.prepare import prepare
from data.store import MANIFEST, SplitWriter
from tests.data.test_prepare import folder_cfg


def test_a_full_disk_while_a_split_is_written_leaves_no_partial_directory(tmp_path, monkeypatch):
    cfg = folder_cfg(tmp_path)
    append, calls = SplitWriter.append, []

    def fills_the_disk(self, sources, targets):
        calls.append(len(sources))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        append(self, sources, targets)

    monkeypatch.setattr(SplitWriter, "append", fills_the_disk)
    with pytest.raises(
        DataError, match=r"cannot write the prepared split '\w+' into .*\.partial: .*No space left"
    ):
        prepare(cfg, progress=False)
    assert len(calls) == 2  # it had written part of the split
    left = sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock"))
    # before: the half-written split stayed
    assert not [name for name in left if name.endswith(".partial")], left
    monkeypatch.undo()
    tokenizer, splits = prepare(cfg, progress=False)  # the next run prepares it whole
    assert len(open_split(cfg, tokenizer, "train")) > 0 and set(splits) == {"train", "dev"}


@pytest.mark.parametrize(
    "manifest, problem",
    [
        ({}, "pairs: None"),
        ([], "a list, not an object"),
        ({"pairs": "200", "dtype": "uint16", "pieces": {"source": 1, "target": 1}}, "pairs: '200'"),
        ({"pairs": 200, "dtype": "float99", "pieces": {"source": 1, "target": 1}}, "dtype: 'float99'"),
        ({"pairs": 200, "dtype": "uint16", "pieces": {"source": -1, "target": 1}}, "pieces: "),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_a_data_error_naming_it(tmp_path, manifest, problem):
    cfg = folder_cfg(tmp_path)
    tokenizer, splits = prepare(cfg, progress=False)
    (splits["train"] / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=rf"{MANIFEST} is damaged \({problem}.*delete .* and prepare again"):
        open_split(cfg, tokenizer, "train")
    # train.py and data.prepare alike (before: a traceback)
    with pytest.raises(DataError, match="is damaged"):
        prepare(cfg, progress=False)


@pytest.mark.parametrize("where", ["split", "split.partial", "tokenizer.partial"])
def test_a_file_where_a_cache_directory_goes_is_removed_and_the_item_made_again(tmp_path, where):
    """A stray file in the cache's own namespace (an entry or its staging) is a leftover, removed as a damaged entry
    is (before: a NotADirectoryError traceback from shutil.rmtree)."""
    cfg = folder_cfg(tmp_path)
    _, splits = prepare(cfg, progress=False)
    (tokenizer,) = (tmp_path / "cache").glob("tokenizer-*[0-9a-f]")
    item = tokenizer if where.startswith("tokenizer") else splits["train"]
    pristine = {path.name: path.read_bytes() for path in item.iterdir() if path.name != MANIFEST}
    shutil.rmtree(item)
    stray = item.with_name(item.name + ".partial") if where.endswith(".partial") else item
    stray.write_text("junk\n")
    _, again = prepare(cfg, progress=False)
    assert again["train"] == splits["train"] and not stray.with_name(item.name + ".partial").exists()
    assert {path.name: path.read_bytes() for path in item.iterdir() if path.name != MANIFEST} == pristine
