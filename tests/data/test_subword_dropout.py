"""Subword dropout: random splits of training pieces into two vocabulary pieces. Checked against SentencePiece
itself (a resegmented row decodes to the text the tokenizer encoded), and as a pure function of (seed, epoch,
side, corpus row): batches, parts of batches and resumed iterators see the same pieces."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from common.config_tree import ConfigError
from common.special_ids import BOS_ID, EOS_ID, PAD_ID
from data.config import DataConfig, validate_data_config
from data.corpus import load_text_pairs
from data.pipeline import make_train_dataset, train_batches
from data.store import PreparedSplit
from data.subword_dropout import SplitTable


@pytest.fixture(scope="module")
def processor(tokenizer) -> spm.SentencePieceProcessor:
    model = spm.SentencePieceProcessor()
    model.LoadFromSerializedProto(tokenizer.models[0])
    return model


@pytest.fixture(scope="module")
def table(tokenizer) -> SplitTable:
    return SplitTable.from_model(tokenizer.models[0])


@pytest.fixture(scope="module")
def encoded(data_cfg, processor) -> list[list[int]]:
    sources, targets = load_text_pairs(data_cfg, "train")
    return [processor.EncodeAsIds(text) for text in sources + targets]


def flatten(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray([i for row in rows for i in row], np.int32), np.asarray([len(row) for row in rows])


def unflatten(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    return [row.tolist() for row in np.split(flat, np.cumsum(lengths)[:-1])]


def test_every_split_is_two_normal_pieces_that_spell_the_piece(processor, table):
    normal = [
        i
        for i in range(processor.GetPieceSize())
        if not (processor.IsControl(i) or processor.IsUnknown(i) or processor.IsByte(i))
    ]

    def piece_id(
        text: str,
    ) -> int | None:  # the normal piece spelt `text`, looked up by text (not the table's map)
        i = processor.PieceToId(text)
        return i if i in normal and processor.IdToPiece(i) == text else None

    splittable = 0
    for piece in range(processor.GetPieceSize()):
        start, end = table.offsets[piece], table.offsets[piece + 1]
        splittable += end > start
        if piece not in normal:
            assert start == end, f"special or byte piece {piece} splits"
            continue
        text = processor.IdToPiece(piece)  # every cut of it into two normal pieces, in order: all of them
        cuts = [(piece_id(text[:cut]), piece_id(text[cut:])) for cut in range(1, len(text))]
        expected = [(a, b) for a, b in cuts if a is not None and b is not None]
        assert list(zip(table.left[start:end].tolist(), table.right[start:end].tolist())) == expected, text
        assert table.counts[piece] == len(expected)
    assert splittable > 10, "the test needs splittable pieces"


def test_resegmented_rows_decode_to_the_same_text(processor, table, encoded):
    flat, lengths = flatten(encoded)
    out, out_lengths = table.resegment(
        flat, lengths, np.arange(len(encoded)), rate=0.5, seed=7, epoch=0, side=0, max_pieces=1000
    )
    rows = unflatten(out, out_lengths)
    assert [len(row) for row in rows] == out_lengths.tolist()
    assert [processor.DecodeIds(row) for row in rows] == [processor.DecodeIds(row) for row in encoded]
    changed = sum(row != original for row, original in zip(rows, encoded))
    assert changed > len(encoded) // 4
    assert np.all(out_lengths >= lengths)


def test_rate_zero_keeps_every_piece_and_rate_near_one_splits_every_splittable_one(table, encoded):
    flat, lengths = flatten(encoded)
    rows = np.arange(len(encoded))
    kept, kept_lengths = table.resegment(
        flat, lengths, rows, rate=0.0, seed=1, epoch=0, side=0, max_pieces=1000
    )
    np.testing.assert_array_equal(kept, flat)
    np.testing.assert_array_equal(kept_lengths, lengths)
    _, split_lengths = table.resegment(
        flat, lengths, rows, rate=1 - 1e-12, seed=1, epoch=0, side=0, max_pieces=1000
    )
    splittable = [sum(table.counts[i] > 0 for i in row) for row in encoded]
    assert split_lengths.tolist() == [len(row) + extra for row, extra in zip(encoded, splittable)]


def boundaries(processor, row: list[int]) -> set[int]:
    """Character offsets where the row's pieces end."""
    return set(np.cumsum([len(processor.IdToPiece(i)) for i in row]).tolist())


def test_a_row_without_room_for_every_split_makes_a_subset_of_them(processor, table, encoded):
    flat, lengths = flatten(encoded)
    rows = np.arange(len(encoded))
    args = dict(rate=0.8, seed=3, epoch=1, side=1)
    free = unflatten(*table.resegment(flat, lengths, rows, max_pieces=1000, **args))
    most = int(np.median(lengths)) + 3
    capped = unflatten(*table.resegment(flat, lengths, rows, max_pieces=most, **args))
    partial = 0
    for original, unbounded, row in zip(encoded, free, capped):
        assert len(row) == min(len(unbounded), max(len(original), most))
        if len(unbounded) <= most:
            assert row == unbounded
        else:  # the same splits, fewer of them: its piece ends lie between the original's and the free row's
            assert (
                boundaries(processor, original)
                <= boundaries(processor, row)
                <= boundaries(processor, unbounded)
            )
            partial += len(original) < len(row) < len(unbounded)
    assert partial > 3, "the test needs rows with room for some of their splits"


def test_draws_depend_on_the_row_epoch_and_side_only(table, encoded):
    flat, lengths = flatten(encoded)
    rows = np.arange(len(encoded)) + 1000
    args = dict(rate=0.5, seed=11, max_pieces=1000)
    whole = unflatten(*table.resegment(flat, lengths, rows, epoch=2, side=0, **args))
    order = np.random.default_rng(0).permutation(len(encoded))[: len(encoded) // 2]  # another batch, shuffled
    part = unflatten(
        *table.resegment(*flatten([encoded[i] for i in order]), rows[order], epoch=2, side=0, **args)
    )
    assert part == [whole[i] for i in order]
    assert whole != unflatten(*table.resegment(flat, lengths, rows, epoch=3, side=0, **args))
    assert whole != unflatten(*table.resegment(flat, lengths, rows, epoch=2, side=1, **args))
    assert whole != unflatten(*table.resegment(flat, lengths, rows, epoch=2, side=0, rate=0.5, seed=12,
                                               max_pieces=1000))  # fmt: skip


def unpadded(batch_list: list[dict], key: str) -> list[list[int]]:
    return [[int(t) for t in row if t != PAD_ID] for batch in batch_list for row in batch[key]]


def test_training_batches_keep_their_shapes_and_text_and_resume_exactly(
    data_cfg, tokenizer, processor, tmp_path
):
    cfg = dataclasses.replace(data_cfg, subword_dropout=0.5)
    plain = list(make_train_dataset(data_cfg, tokenizer, seed=4, repeat=False).as_numpy_iterator())
    dropped = list(make_train_dataset(cfg, tokenizer, seed=4, repeat=False).as_numpy_iterator())
    assert [b["source"].shape for b in dropped] == [b["source"].shape for b in plain]
    for key in ("source", "target_out"):
        assert [processor.DecodeIds(row) for row in unpadded(dropped, key)] == [
            processor.DecodeIds(row) for row in unpadded(plain, key)
        ]
        assert unpadded(dropped, key) != unpadded(plain, key)
    for batch in dropped:  # target_in is [BOS] + target_out's pieces
        pieces = (batch["target_out"][:, :-1] != PAD_ID) & (batch["target_out"][:, :-1] != EOS_ID)
        np.testing.assert_array_equal(batch["target_in"][:, 1:][pieces], batch["target_out"][:, :-1][pieces])
        assert np.all(batch["target_in"][:, 0] == BOS_ID)

    epoch = len(plain)
    iterator = iter(make_train_dataset(cfg, tokenizer, seed=4))
    for _ in range(epoch - 1):
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    expected = [next(iterator) for _ in range(3)]  # across the epoch end: a new segmentation
    fresh = iter(make_train_dataset(cfg, tokenizer, seed=4))
    tf.train.Checkpoint(iterator=fresh).read(path).assert_consumed()
    for want, got in zip(expected, [next(fresh) for _ in range(3)]):
        for key in want:
            np.testing.assert_array_equal(want[key].numpy(), got[key].numpy())


def test_the_parts_of_a_batch_are_resegmented_as_the_whole_batch(tokenizer, encoded):
    cfg = DataConfig(max_length=60, batch_tokens=480, bucket_boundaries=[20, 40], subword_dropout=0.5)
    half = len(encoded) // 2
    split = PreparedSplit.from_pieces(encoded[:half], encoded[half : 2 * half])
    table = SplitTable.from_model(tokenizer.models[0])
    whole = list(train_batches(cfg, split, seed=3, repeat=False, tables=(table, table)).as_numpy_iterator())
    halves = [
        list(train_batches(cfg, split, seed=3, repeat=False, part=(first, 1, 2), tables=(table, table)))
        for first in (0, 1)
    ]
    for index, batch in enumerate(whole):
        for key in ("source", "target_in", "target_out"):
            joined = np.concatenate([half[index][key].numpy() for half in halves])
            np.testing.assert_array_equal(joined, batch[key], err_msg=f"batch {index}, {key}")


def test_bad_settings_are_refused(data_cfg, tokenizer):
    for rate in (-0.1, 1.0):
        with pytest.raises(ConfigError, match="data.subword_dropout"):
            validate_data_config(DataConfig(subword_dropout=rate))
    split = PreparedSplit.from_pieces([[5, 6]], [[7]])
    with pytest.raises(ValueError, match="subword_dropout"):
        train_batches(dataclasses.replace(data_cfg, subword_dropout=0.1), split, seed=0)
