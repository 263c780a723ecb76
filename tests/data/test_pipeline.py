"""Training and evaluation batches from prepared splits: special tokens, padding, buckets, length limits at read
time, determinism, resumption. The reference tokens come from the in-graph tokenizer on the raw text."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from common.special_ids import BOS_ID, EOS_ID, PAD_ID
from data.batching import bucketed_batches
from data.config import DataConfig
from data.corpus import load_text_pairs
from data.pipeline import (
    batch_sizes,
    bucket_edges,
    make_eval_dataset,
    make_train_dataset,
    pad_with_special_tokens,
)
from data.store import PreparedSplit


def batches(ds, count=None) -> list[dict]:
    ds = ds if count is None else ds.take(count)
    return list(ds.as_numpy_iterator())


def rows(batch_list: list[dict], key: str) -> Counter:
    """Multiset of the unpadded rows of `key` over batches."""
    return Counter(tuple(int(t) for t in row if t != PAD_ID) for b in batch_list for row in b[key])


def reference_pieces(cfg, tokenizer, split) -> tuple[list, list]:
    """The split's raw text tokenized in-graph (TF Text), independently of data.prepare (SentencePiece in Python)."""
    sources, targets = load_text_pairs(cfg, split)
    return (
        tokenizer.tokenize_source(tf.constant(sources)).to_list(),
        tokenizer.tokenize_target(tf.constant(targets)).to_list(),
    )


def test_bucket_edges_and_batch_sizes():
    assert bucket_edges(DataConfig(max_length=100)) == [
        8, 10, 12, 14, 16, 18, 20, 22, 26, 30, 34, 38, 42, 48, 54, 60, 66, 74, 82, 92, 100,
    ]  # fmt: skip
    assert bucket_edges(DataConfig(max_length=6)) == [6]
    assert bucket_edges(DataConfig(max_length=40, bucket_boundaries=[32, 16, 64, 16])) == [16, 32, 40]
    assert batch_sizes([8, 10, 100, 600, 5000], 4096) == [512, 408, 40, 6, 1]


def test_special_tokens_and_padding_match_a_hand_built_batch():
    source = [[5, 6, 7, 14], [15], [8]]
    target = [[9], [16, 17], [10, 11, 12, 13]]
    ds = bucketed_batches(
        PreparedSplit.from_pieces(source, target), edges=[4, 6], batch_sizes=[8, 8], shuffle=False
    )
    short, long = batches(ds.apply(pad_with_special_tokens()))
    # max(len) + 1: 5, 3, 5 -> edges 6, 4, 6; without shuffling, buckets in order and corpus order inside
    np.testing.assert_array_equal(short["source"], [[15, EOS_ID, PAD_ID, PAD_ID]])
    np.testing.assert_array_equal(short["target_in"], [[BOS_ID, 16, 17, PAD_ID]])
    np.testing.assert_array_equal(short["target_out"], [[16, 17, EOS_ID, PAD_ID]])
    np.testing.assert_array_equal(long["source"], [[5, 6, 7, 14, EOS_ID, PAD_ID], [8, EOS_ID, 0, 0, 0, 0]])
    np.testing.assert_array_equal(long["target_in"], [[BOS_ID, 9, 0, 0, 0, 0], [BOS_ID, 10, 11, 12, 13, 0]])
    np.testing.assert_array_equal(long["target_out"], [[9, EOS_ID, 0, 0, 0, 0], [10, 11, 12, 13, EOS_ID, 0]])
    assert long["source"].dtype == np.int32 and set(long) == {"source", "target_in", "target_out"}


def test_train_epoch_covers_every_short_pair_once_in_bucket_shapes(data_cfg, tokenizer, caplog):
    cfg = dataclasses.replace(data_cfg, max_length=16)
    caplog.set_level("INFO", logger="data.pipeline")
    epoch = batches(make_train_dataset(cfg, tokenizer, seed=1, repeat=False))
    edges, sizes = bucket_edges(cfg), batch_sizes(bucket_edges(cfg), cfg.batch_tokens)

    sources, targets = reference_pieces(cfg, tokenizer, "train")
    expected = Counter(
        tuple(s) + (EOS_ID,)
        for s, t in zip(sources, targets)
        if len(s) < cfg.max_length and len(t) < cfg.max_length
    )
    dropped = len(sources) - sum(expected.values())
    assert 0 < dropped < len(sources), "the test needs some pairs over max_length"
    assert rows(epoch, "source") == expected
    assert caplog.text.count(f"dropped {dropped} of {len(sources)} training pairs") == 1

    for batch in epoch:
        size, edge = batch["source"].shape
        assert edge in edges and batch["target_in"].shape == batch["target_out"].shape == (size, edge)
        assert size <= sizes[edges.index(edge)] and size * edge <= cfg.batch_tokens
        assert ((batch["source"] != PAD_ID).sum(axis=1) <= cfg.max_length).all()
        np.testing.assert_array_equal(batch["target_in"][:, 0], BOS_ID)
        target_lengths = (batch["target_out"] != PAD_ID).sum(axis=1)
        np.testing.assert_array_equal(batch["target_out"][np.arange(size), target_lengths - 1], EOS_ID)
        np.testing.assert_array_equal(
            batch["target_in"][:, 1:][batch["target_out"][:, :-1] != EOS_ID],
            batch["target_out"][:, :-1][batch["target_out"][:, :-1] != EOS_ID],
        )
    shapes = {b["source"].shape for b in epoch}
    assert len(shapes) <= 2 * len(edges)


@pytest.fixture(scope="module")
def per_epoch(data_cfg, tokenizer) -> int:
    """Batches in one training epoch of data_cfg (the same for every seed)."""
    return len(batches(make_train_dataset(data_cfg, tokenizer, seed=0, repeat=False)))


def test_order_is_deterministic_per_seed_and_reshuffled_each_epoch(data_cfg, tokenizer, per_epoch):
    def first_rows(seed, count):
        return [
            b["source"].tolist() for b in batches(make_train_dataset(data_cfg, tokenizer, seed=seed), count)
        ]

    run = first_rows(1, 2 * per_epoch)
    assert run == first_rows(1, 2 * per_epoch)
    assert run[:per_epoch] != first_rows(2, per_epoch)
    assert run[:per_epoch] != run[per_epoch:]


def test_iterator_checkpoint_resumes_at_the_exact_batch(data_cfg, tokenizer, per_epoch, tmp_path):
    k, m = per_epoch - 1, per_epoch + 2  # the resumed part crosses an epoch boundary
    iterator = iter(make_train_dataset(data_cfg, tokenizer, seed=3))
    for _ in range(k):
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    expected = [next(iterator) for _ in range(m)]

    fresh = iter(make_train_dataset(data_cfg, tokenizer, seed=3))
    tf.train.Checkpoint(iterator=fresh).read(path).assert_consumed()
    for want, got in zip(expected, [next(fresh) for _ in range(m)]):
        for key in want:
            np.testing.assert_array_equal(want[key].numpy(), got[key].numpy())


def test_eval_keeps_every_pair_truncated_with_final_eos(data_cfg, tokenizer):
    cfg = dataclasses.replace(data_cfg, max_length=10)
    _, targets = reference_pieces(cfg, tokenizer, "validation")
    evaluation = batches(make_eval_dataset(cfg, tokenizer, "validation"))
    again = batches(make_eval_dataset(cfg, tokenizer, "validation"))
    assert [{k: v.tolist() for k, v in b.items()} for b in evaluation] == [
        {k: v.tolist() for k, v in b.items()} for b in again
    ]
    expected = Counter(tuple(t[: cfg.max_length - 1]) + (EOS_ID,) for t in targets)
    assert rows(evaluation, "target_out") == expected
    assert any(len(t) >= cfg.max_length for t in targets), "the test needs over-long pairs"
    for batch in evaluation:
        assert batch["source"].shape[1] <= cfg.max_length
        assert batch["source"].shape[0] * batch["source"].shape[1] <= cfg.eval_batch_tokens


def test_empty_training_set_after_filtering_is_an_error(data_cfg, tokenizer):
    with pytest.raises(ValueError, match="no training pairs of at most data.max_length=2"):
        make_train_dataset(dataclasses.replace(data_cfg, max_length=2), tokenizer, seed=0)
