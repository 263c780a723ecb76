"""nmt.trainer_data: what a run trains on is kept in DIR/train_data.json, and a resume on another corpus says so.

Before 2026-12-07c a run resumed after its training files were cut to 100 lines trained on them without a word,
its checkpointed data order applied to another epoch plan (found by a data review). Real preparation of a folder
corpus (SentencePiece, the token cache); the record is compared by counts, so a corpus moved elsewhere is the same.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

from data.prepare import prepare
from nmt.run_dir import RunDir
from nmt.trainer_data import keep_train_split_record, train_split_record
from tests.data.test_prepare import folder_cfg


def test_a_resume_on_a_changed_corpus_warns_and_a_moved_one_does_not(tmp_path, caplog):
    cfg = folder_cfg(tmp_path)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    tokenizer, splits = prepare(cfg, progress=False)
    keep_train_split_record(run, train_split_record("train", splits["train"]), resumed=False)
    first = json.loads(run.train_data_path.read_text(encoding="utf-8"))
    assert first["split"] == "train" and first["pairs"] > 40 and set(first["pieces"]) == {"source", "target"}

    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "corpus", moved)  # other paths and times: prepared again, the same pairs
    cfg = dataclasses.replace(cfg, folder=str(moved))
    _, splits = prepare(cfg, tokenizer=tokenizer, progress=False)
    assert splits["train"].name != run.train_data_path.parent.name
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        keep_train_split_record(run, train_split_record("train", splits["train"]), resumed=True)
    assert not caplog.records
    assert json.loads(run.train_data_path.read_text(encoding="utf-8")) == first

    for side in ("en", "fr"):  # cut to 40 pairs
        path = moved / f"{side}.train.txt"
        path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:40]))
    _, splits = prepare(cfg, tokenizer=tokenizer, progress=False)
    caplog.clear()
    record = train_split_record("train", splits["train"])
    with caplog.at_level(logging.WARNING):
        keep_train_split_record(run, record, resumed=False)  # a new run's start there: nothing to compare
    assert not caplog.records
    run.train_data_path.write_text(json.dumps(first), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        keep_train_split_record(run, record, resumed=True)
    (warning,) = [r.getMessage() for r in caplog.records]
    now = json.loads(run.train_data_path.read_text(encoding="utf-8"))
    assert now["pairs"] < first["pairs"]
    assert warning.startswith(
        f"the train split is not the one this run trained on so far ({first['pairs']} pairs, "
        f"{first['pieces']['source']} + {first['pieces']['target']} pieces before, {now['pairs']} pairs, "
    )
    assert warning.endswith("restore the original corpus for an exact resume")


def test_a_checkpoint_of_another_kind_of_data_iterator_is_refused_or_its_position_dropped(tmp_path):
    """A mirrored run resumed as a two-worker run (same replicas and global batch, so the plan let it through)
    restored TensorFlow's whole-iterator state into a part's symbolic one: positions silently wrong (batches
    skipped); the other way failed as a "corrupt" checkpoint (before 2026-12-07c; found by a review). Real
    checkpoints; one written before the record restores as before."""
    import pytest
    import tensorflow as tf

    from nmt.budget import BatchChanged
    from nmt.trainer_data import iterator_kind, restorable_iterator

    whole = tf.train.Checkpoint(iterator_kind=iterator_kind(None), x=tf.Variable(1.0)).save(
        str(tmp_path / "w" / "c")
    )
    older = tf.train.Checkpoint(x=tf.Variable(1.0)).save(str(tmp_path / "o" / "c"))
    parts = {"iterator": object(), "iterator_kind": iterator_kind((0, 1, 2)), "x": tf.Variable(0.0)}
    assert restorable_iterator(whole, parts, symbolic=False, allow_change=False) == parts
    with pytest.raises(
        BatchChanged, match=r"holds the data position of whole batches .*; this run reads a multi"
    ):
        restorable_iterator(whole, parts, symbolic=True, allow_change=False)
    assert set(restorable_iterator(whole, parts, symbolic=True, allow_change=True)) == {"x"}
    assert set(restorable_iterator(older, parts, symbolic=True, allow_change=False)) == {"iterator", "x"}
    # what a resume restores: the saved kind, and only that (assert_existing_objects_matched passes)
    kind = iterator_kind(None)
    tf.train.Checkpoint(iterator_kind=kind).restore(whole).assert_existing_objects_matched()
    assert int(kind.symbolic.numpy()) == 0
