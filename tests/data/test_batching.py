"""The epoch plan of `data.batching` against a direct NumPy statement of it, and its memory per corpus row.

The reference below states the plan the direct way, bucket by bucket (a boolean mask per bucket, each bucket's
rows permuted by one call of TensorFlow's index shuffle on all of its positions): the plan, which evaluates the
permutation only at each batch's positions (a share of a batch included), must give the very same batches. The
properties that do not depend on TensorFlow's permutation (a permutation of the rows in play per epoch, batches
within their bucket, a new order per epoch and seed) are checked on their own.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import tensorflow as tf

import data.batching
from data.batching import CHUNK, GROUP_CHUNK, EpochPlan, bucket_of, bucketed_batches, rows_in_play
from data.store import PreparedSplit


def index_shuffle(size: int, key: list[int], rounds: int = EpochPlan.ROUNDS) -> np.ndarray:
    """pi(0), ..., pi(size - 1) of TensorFlow's keyed permutation of range(size)."""
    return tf.raw_ops.RandomIndexShuffle(
        index=tf.range(size, dtype=tf.int64),
        seed=tf.constant(key, tf.int64),
        max_index=tf.constant(size - 1, tf.int64),
        rounds=rounds,
    ).numpy()


def reference_plan(pairs, buckets, batch_sizes, seed, shuffle, epoch):
    """(pair indices in batch order, rows per batch, bucket per batch), the direct way."""
    buckets = np.asarray(buckets)
    batches, rows, bucket_of_batch = [], [], []
    for bucket, size in enumerate(batch_sizes):
        members = np.asarray(pairs)[buckets == bucket]  # corpus order
        if shuffle and len(members):
            members = members[index_shuffle(len(members), [seed, epoch, bucket])]
        for start in range(0, len(members), size):
            batches.append(members[start : start + size])
            rows.append(len(batches[-1]))
            bucket_of_batch.append(bucket)
    batch_order = np.arange(len(batches))
    if shuffle:
        batch_order = np.random.default_rng([seed, epoch]).permutation(batch_order)
    index = [batches[b] for b in batch_order]
    return (
        np.concatenate(index).astype(np.int64) if index else np.zeros(0, np.int64),
        np.asarray(rows, np.int64)[batch_order],
        np.asarray(bucket_of_batch, np.int32)[batch_order],
    )


@pytest.mark.parametrize("rows", [0, 1, 13, 5000])
@pytest.mark.parametrize("filtered", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_plan_gives_the_reference_batches(rows, filtered, shuffle):
    rng = np.random.default_rng(rows)
    batch_sizes = [7, 5, 1, 3, 64]
    buckets = rng.integers(0, len(batch_sizes), rows)
    pairs = np.sort(rng.choice(3 * rows + 1, rows, replace=False)) if filtered else np.arange(rows)
    plan = EpochPlan(
        pairs.astype(np.int32) if filtered else None,
        buckets.astype(np.uint8),
        batch_sizes,
        seed=11,
        shuffle=shuffle,
        index_size=3 * rows + 1,
    )
    for epoch in (0, 1, 7):
        got = plan(epoch)
        want = reference_plan(pairs, buckets, batch_sizes, 11, shuffle, epoch)
        assert got[0].dtype == np.int32  # 4 bytes per row
        for mine, theirs in zip(got, want, strict=True):
            np.testing.assert_array_equal(mine, theirs)
    assert len(plan) == len(want[1])


def test_each_epoch_is_a_permutation_within_buckets_new_per_epoch_and_seed():
    """Without the reference: every row in play once per epoch, each batch inside its bucket and at most its
    bucket's batch size, and another order in another epoch or with another seed (shuffle=False: corpus order)."""
    rng = np.random.default_rng(2)
    batch_sizes = [9, 4, 6]
    buckets = rng.integers(0, 3, 3000).astype(np.uint8)
    pairs = np.sort(rng.choice(4000, 3000, replace=False)).astype(np.int32)
    bucket_of_row = dict(zip(pairs.tolist(), buckets.tolist()))
    orders = {}
    for seed in (1, 2):
        plan = EpochPlan(pairs, buckets, batch_sizes, seed=seed, shuffle=True, index_size=4000)
        for epoch in (0, 1):
            index, counts, bucket_ids = plan(epoch)
            np.testing.assert_array_equal(np.sort(index), pairs)
            for batch, bucket in zip(np.split(index, np.cumsum(counts)[:-1]), bucket_ids):
                assert len(batch) <= batch_sizes[bucket]
                assert {bucket_of_row[row] for row in batch.tolist()} == {bucket}
            orders[seed, epoch] = index
    assert len({order.tobytes() for order in orders.values()}) == 4
    index, _, bucket_ids = EpochPlan(pairs, buckets, batch_sizes, seed=1, shuffle=False, index_size=4000)(0)
    assert (np.diff(bucket_ids) >= 0).all()
    np.testing.assert_array_equal(index, np.concatenate([pairs[buckets == b] for b in range(3)]))


def test_index_shuffle_rounds_leave_no_stride_in_consecutive_positions():
    """Why `EpochPlan.ROUNDS` is 8: in a 1M-row bucket, the steps between the positions of 20,000 consecutive
    indices are nearly all distinct, as for a uniform permutation (about 100 repeats expected); with
    TensorFlow's default of 4 rounds about 13% of them repeat (a batch would sample the bucket at a few strides)."""
    for key in ([5, 0, 1], [11, 3, 7]):
        steps = np.diff(index_shuffle(1_000_003, key)[:20_000])
        assert len(np.unique(steps)) > 19_500
        weak = np.diff(index_shuffle(1_000_003, key, rounds=4)[:20_000])
        assert len(np.unique(weak)) < 18_500


def test_batches_read_through_layout_and_rows_are_the_reference_in_any_epoch_order():
    """The input pipeline's view (each batch's start and size, then its rows, whole or in shares), epochs asked
    out of order."""
    rng = np.random.default_rng(1)
    batch_sizes = [5, 3, 8]
    buckets = rng.integers(0, 3, 500)
    plan = EpochPlan(None, buckets.astype(np.uint8), batch_sizes, seed=4, shuffle=True, index_size=500)
    for epoch in (0, 1, 2, 0, 2, 1):
        starts, counts, bucket_ids = plan.layout(epoch)
        index, want_counts, want_buckets = reference_plan(
            np.arange(500), buckets, batch_sizes, 4, True, epoch
        )
        got = np.concatenate([plan.rows(epoch, a, n) for a, n in zip(starts, counts)])
        np.testing.assert_array_equal(got, index)
        np.testing.assert_array_equal(counts, want_counts)
        np.testing.assert_array_equal(bucket_ids, want_buckets)
        if epoch == 2:  # row by row, as shares of a batch: (a slow loop of eager calls)
            shares = [plan.rows(epoch, a + i, 1) for a, n in zip(starts, counts) for i in range(n)]
            np.testing.assert_array_equal(np.concatenate(shares), index)


def test_plan_gives_the_reference_batches_across_chunks():
    """More rows than one chunk of the counting sort and of the row mapping (some rows left out)."""
    rng = np.random.default_rng(5)
    rows = CHUNK + 777
    batch_sizes = [64, 40, 33, 16]
    buckets = rng.integers(0, len(batch_sizes), rows)
    pairs = np.sort(rng.choice(rows + 5000, rows, replace=False))
    plan = EpochPlan(pairs.astype(np.int32), buckets.astype(np.uint8), batch_sizes, 2, True, rows + 5000)
    for mine, theirs in zip(plan(3), reference_plan(pairs, buckets, batch_sizes, 2, True, 3), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def masked_grouping(order: np.ndarray, buckets: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The grouping as first written (one mask pass per bucket and chunk): the reference of `_group_by_bucket`."""
    grouped = np.empty(len(order), order.dtype)
    cursor = (np.cumsum(counts) - counts).tolist()
    present = np.flatnonzero(counts).tolist()
    for start in range(0, len(order), CHUNK):
        part = order[start : start + CHUNK]
        keys = buckets[part]
        for bucket in present:
            rows = part[keys == bucket]
            grouped[cursor[bucket] : cursor[bucket] + len(rows)] = rows
            cursor[bucket] += len(rows)
    return grouped


@pytest.mark.parametrize("chunk", [1, 7, GROUP_CHUNK])
@pytest.mark.parametrize("num_buckets", [1, 5, 300])  # 300: int32 bucket ids
@pytest.mark.parametrize("rows", [0, 1, 2, 500])
def test_grouping_by_bucket_is_the_masked_one(rows, num_buckets, chunk, monkeypatch):
    """The stable sort by bucket gives the very same order as the mask passes it replaced, chunked or not, with
    empty buckets (first, last and between: only the odd buckets are used)."""
    monkeypatch.setattr(data.batching, "GROUP_CHUNK", chunk)  # many chunks on a small input
    rng = np.random.default_rng(rows + num_buckets)
    dtype = np.uint8 if num_buckets < 256 else np.int32
    used = np.arange(1, num_buckets, 2) if num_buckets > 1 else np.zeros(1, np.int64)
    buckets = rng.choice(used, rows).astype(dtype)
    plan = EpochPlan(None, buckets, [3] * num_buckets, seed=0, shuffle=True, index_size=rows)
    assert num_buckets == 1 or not plan.counts.all()  # some buckets are empty
    assert plan.grouped.dtype == np.int32
    order = np.arange(rows, dtype=np.int32)
    np.testing.assert_array_equal(plan.grouped, masked_grouping(order, buckets, plan.counts))


def test_grouping_by_bucket_is_the_masked_one_across_chunks():
    """Beyond one chunk of the sort (and of the old passes), 24 buckets of unequal sizes, one empty."""
    rng = np.random.default_rng(3)
    rows = CHUNK + GROUP_CHUNK + 11
    buckets = np.minimum(rng.geometric(0.15, rows), 23).astype(np.uint8)  # bucket 0 empty
    plan = EpochPlan(None, buckets, [1] * 24, seed=0, shuffle=True, index_size=rows)
    order = np.arange(rows, dtype=np.int32)
    np.testing.assert_array_equal(plan.grouped, masked_grouping(order, buckets, plan.counts))


def test_bucket_of_matches_numpy():
    lengths = np.random.default_rng(0).integers(0, 120, 5000).astype(np.uint16)
    edges = [8, 16, 30, 64, 121]
    buckets = bucket_of(lengths, edges, extra=1)
    assert buckets.dtype == np.uint8
    np.testing.assert_array_equal(buckets, np.searchsorted(edges, lengths.astype(np.int64) + 1, side="left"))
    with pytest.raises(ValueError, match="length 122 exceeds the last bucket edge 121"):
        bucket_of(np.append(lengths, 121), edges, extra=1)


def test_rows_in_play_match_numpy_across_chunks():
    split = _split(CHUNK + 4321)
    source, target = (np.asarray(split.source_lengths, np.int64), np.asarray(split.target_lengths, np.int64))
    longest = np.maximum(source, target)
    edges = [8, 16, 30, 64, 100, 140]

    pairs, buckets = rows_in_play(split, edges, extra=1, cap=99, truncate=False)  # leaves long rows out
    kept = np.flatnonzero((source <= 99) & (target <= 99))
    assert pairs.dtype == np.int32 and buckets.dtype == np.uint8 and 0 < len(kept) < len(split)
    np.testing.assert_array_equal(pairs, kept)
    np.testing.assert_array_equal(buckets, np.searchsorted(edges, longest[kept] + 1))

    pairs, buckets = rows_in_play(split, edges, extra=1, cap=99, truncate=True)  # cuts them
    assert pairs is None  # every row in play: no index array at all
    np.testing.assert_array_equal(buckets, np.searchsorted(edges, np.minimum(longest, 99) + 1))

    pairs, buckets = rows_in_play(split, edges, extra=0, cap=None, truncate=False)
    assert pairs is None
    np.testing.assert_array_equal(buckets, np.searchsorted(edges, longest))


def _split(rows: int, seed: int = 0) -> PreparedSplit:
    """A split of `rows` pairs with random lengths (the planning reads only the length index)."""
    lengths = np.random.default_rng(seed).integers(1, 140, (rows, 2)).astype(np.uint16)
    arrays = {"lengths": lengths}
    for side in ("source", "target"):
        arrays[f"{side}.values"] = np.zeros(0, np.uint16)
        arrays[f"{side}.offsets"] = np.zeros(rows + 1, np.int64)
    return PreparedSplit(arrays, {"pairs": rows})


def test_planning_memory_per_row_stays_small():
    """tracemalloc sees NumPy's buffers: the set-up and an epoch's start, in bytes per corpus row.

    The int64 formulation of the first plan peaked at about 32 bytes per row for the set-up and 36 per epoch
    (measured at 1M rows). Now the set-up holds the results (kept rows 4 bytes, buckets 1, then the grouped rows 4)
    plus one chunk's temporaries, and an epoch's start (its batch order) nothing of the corpus's size, a few int64
    per batch. (2M rows keep these arrays under
    data.batching.MAPPED_BYTES: larger ones are memory maps, which tracemalloc does not see.)
    """
    rows = 2 * CHUNK  # beyond one chunk: the chunked passes' temporaries are a fixed size
    split = _split(rows)
    edges = [8, 10, 12, 14, 16, 18, 20, 22, 26, 30, 34, 38, 42, 48, 54, 60, 66, 74, 82, 92, 100]
    sizes = [max(1, 2048 // edge) for edge in edges]
    tracemalloc.start()
    try:
        bucketed_batches(split, edges=edges, batch_sizes=sizes, max_pieces=99, seed=1)
        setup_peak = tracemalloc.get_traced_memory()[1]
        plan = EpochPlan(None, np.zeros(rows, np.uint8), [20], seed=1, shuffle=True, index_size=rows)
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        plan.layout(0)  # what the input pipeline asks for at an epoch's start (then `positions` per batch)
        plan_peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert setup_peak / rows < 12, setup_peak / rows
    assert plan_peak / len(plan) < 64, plan_peak / len(plan)  # bytes per batch (of 20 rows here)
