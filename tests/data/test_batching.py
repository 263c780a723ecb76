"""The epoch plan of `data.batching` against a direct NumPy statement of it, and its memory per corpus row.

The reference below is the plan as first written (int64 throughout: `rng.permutation`, a stable argsort by bucket,
an int64 position array): the compact plan must give the very same batches, so that runs checkpointed before it
resume on the same batch sequence, and must not need int64 arrays of the corpus's size to get there.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import data.batching
from data.batching import CHUNK, GROUP_CHUNK, EpochPlan, bucket_of, bucketed_batches, rows_in_play
from data.store import PreparedSplit


def reference_plan(pairs, buckets, batch_sizes, seed, shuffle, epoch):
    """(pair indices in batch order, rows per batch, bucket per batch), the direct way."""
    counts = np.bincount(buckets, minlength=len(batch_sizes))
    rows, bucket_of_batch = [], []
    for bucket, (count, size) in enumerate(zip(counts, batch_sizes)):
        full, rest = divmod(int(count), size)
        rows += [size] * full + ([rest] if rest else [])
        bucket_of_batch += [bucket] * (full + bool(rest))
    order, batch_order = np.arange(len(pairs)), np.arange(len(rows))
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(order)
        batch_order = rng.permutation(batch_order)
    grouped = order[np.argsort(np.asarray(buckets)[order], kind="stable")]
    starts = np.cumsum(rows) - np.asarray(rows, np.int64)
    index = [pairs[grouped[starts[b] : starts[b] + rows[b]]] for b in batch_order]
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
        assert got[0].dtype == np.int32  # 4 bytes per row (the reference's int64 indices: 8)
        for mine, theirs in zip(got, want, strict=True):
            np.testing.assert_array_equal(mine, theirs)
    assert len(plan) == len(want[1])


def test_batches_read_through_layout_and_rows_are_the_reference_in_any_epoch_order():
    """The input pipeline's view (each batch's start and size, then its rows), epochs asked out of order: the
    plan keeps two epochs and recomputes the others, identically."""
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
    for _ in range(3):
        order = rng.permutation(rows).astype(np.int32)
        got = plan._group_by_bucket(order)
        assert got.dtype == order.dtype
        np.testing.assert_array_equal(got, masked_grouping(order, buckets, plan.counts))


def test_grouping_by_bucket_is_the_masked_one_across_chunks():
    """Beyond one chunk of the sort (and of the old passes), 24 buckets of unequal sizes, one empty."""
    rng = np.random.default_rng(3)
    rows = CHUNK + GROUP_CHUNK + 11
    buckets = np.minimum(rng.geometric(0.15, rows), 23).astype(np.uint8)  # bucket 0 empty
    plan = EpochPlan(None, buckets, [1] * 24, seed=0, shuffle=True, index_size=rows)
    order = rng.permutation(rows).astype(np.int32)
    np.testing.assert_array_equal(plan._group_by_bucket(order), masked_grouping(order, buckets, plan.counts))


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
    """tracemalloc sees NumPy's buffers: the set-up and one epoch's plan, in bytes per corpus row.

    The int64 formulation (the reference above) peaked at about 32 bytes per row for the set-up and 36 for an
    epoch (measured at 1M rows); the compact one at about 9 and 13 at 2M rows: the results (kept rows 4 bytes,
    buckets 1; then the permutation and the grouped rows, 4 bytes each) plus one chunk's temporaries. (2M rows keep
    these arrays under data.batching.MAPPED_BYTES: larger ones are memory maps, which tracemalloc does not see.)
    """
    rows = 2 * CHUNK  # beyond one chunk: the chunked passes' temporaries are a fixed size
    split = _split(rows)
    edges = [8, 10, 12, 14, 16, 18, 20, 22, 26, 30, 34, 38, 42, 48, 54, 60, 66, 74, 82, 92, 100]
    sizes = [max(1, 2048 // edge) for edge in edges]
    tracemalloc.start()
    try:
        bucketed_batches(split, edges=edges, batch_sizes=sizes, max_pieces=99, seed=1)
        setup_peak = tracemalloc.get_traced_memory()[1]
        plan = EpochPlan(None, np.zeros(rows, np.uint8), sizes, seed=1, shuffle=True, index_size=rows)
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        plan.layout(0)  # what the input pipeline asks for (then `rows` slices of the cached epoch)
        plan_peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert setup_peak / rows < 12, setup_peak / rows
    assert plan_peak / rows < 15, plan_peak / rows
