"""The seeded, checkpointable sampler of length-bucketed batches over a prepared split.

Why not `cache() -> shuffle(buffer) -> group_by_window`: an iterator checkpoint of `cache()` holds the whole cache
and one of `shuffle` its whole buffer (gigabytes on WMT), and a shuffle buffer is not a permutation. Here the
batches are planned from the split's length index, the seed and the epoch number alone (`EpochPlan`):

    once:     group the kept pairs by bucket (stable), cut each bucket into batches of its batch size
    epoch e:  shuffle the batch order, rng seeded by (seed, e)
              each batch (bucket b, positions j .. j + B - 1 of the bucket):
                  its pairs: the bucket's pairs at pi(j), ..., pi(j + B - 1), pi a keyed permutation of the
                  bucket (tf.random_index_shuffle, key (seed, e, b))      # a full permutation, no buffer
                  gather their pieces from the split (read from its files, or in memory)
                  -> {"source": (B, None), "target": (B, None), "edge": ()}

The permutation is evaluated at a batch's positions only, so an epoch starts (and training starts) without any
pass over the corpus, whatever its size.

A reader can take only its `part` of every batch (one worker of a multi-worker run, for its replicas): the plan
stays global (every reader computes the same plan from the length index, a few bytes per pair), and the reader
gathers, reads and pads only its rows of each batch. Its iterator checkpoint is then symbolic (tf.data's
`experimental_symbolic_checkpoint`: positions only, no prefetched batches), so it holds the same integers for every
part and any part can resume from another part's checkpoint (the workers of a run restore the chief's).

Everything is a pure function of (seed, epoch), so the iterator state is a few integers (epoch, batch position,
prefetched batches): `tf.train.Checkpoint(iterator=it)` stays small, and restoring it into a fresh iterator of a
freshly built dataset resumes at the exact batch, re-reading or re-tokenizing nothing. The corpus never becomes a
graph constant: the batch order and the gathering run in `tf.numpy_function`s (deterministic, so restoring
re-plans the same epoch); the input pipeline carries only (epoch, start, size, bucket) per batch, and the plan keeps
the bucket-grouped rows in NumPy (4 bytes per pair), computed once. The batch layout (sizes and buckets) is the
same every epoch; only which pairs go where changes. (A run checkpointed before this plan replaced the one that
permuted the whole corpus per epoch resumes at the same batch of the same layout, with other pairs in it.)
Each bucket ends an epoch with at most one smaller batch: at most 2 x buckets distinct batch shapes.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from data.store import MAX_INDEXED_LENGTH, PreparedSplit

CHUNK = 1 << 20  # rows per chunk of the passes over the length index and the plan: temporaries of a few MB
GROUP_CHUNK = 1 << 18  # rows per chunk of the grouping: its argsort's int64 temporaries stay at 2 MB
MAPPED_BYTES = 1 << 24  # arrays from this size on get their own memory map (_empty)
# (flat, lengths, rows, epoch, side, max_pieces) -> (flat, lengths): see bucketed_batches
Resegment = Callable[[np.ndarray, np.ndarray, np.ndarray, int, int, int], tuple[np.ndarray, np.ndarray]]


def _empty(size: int, dtype) -> np.ndarray:
    """np.empty, backed by its own anonymous memory map when large: its pages go back to the system as soon as it
    is freed (a large malloc'd block may stay in the allocator's heap and in the RSS), and it is page-aligned."""
    dtype = np.dtype(dtype)
    if size * dtype.itemsize < MAPPED_BYTES or not hasattr(mmap, "MAP_PRIVATE"):  # small, or not POSIX
        return np.empty(size, dtype)
    return np.frombuffer(mmap.mmap(-1, size * dtype.itemsize, flags=mmap.MAP_PRIVATE), dtype)  # anonymous


def index_dtype(size: int) -> np.dtype:
    """The dtype of row indices into `size` rows: int32 while it fits (half the memory of int64)."""
    return np.dtype(np.int32 if size < 2**31 else np.int64)


def bucket_of(lengths: np.ndarray, edges: list[int], extra: int = 0) -> np.ndarray:
    """Index of the smallest edge >= each `length + extra`; ValueError if one exceeds the last edge.

    uint8 when there are fewer than 256 edges (else int32), computed chunk by chunk through a lookup table (one
    entry per possible length): memory is one byte per row plus a fixed chunk, whatever the number of rows.
    """
    lengths = np.asarray(lengths)
    if lengths.size and int(lengths.max()) + extra > edges[-1]:
        raise ValueError(
            f"a sequence of length {int(lengths.max()) + extra} exceeds the last bucket edge {edges[-1]}"
        )
    if lengths.size and lengths.dtype.kind == "i" and int(lengths.min()) < 0:
        raise ValueError(f"negative length {int(lengths.min())}")
    dtype = np.uint8 if len(edges) < 256 else np.int32
    table = np.searchsorted(np.asarray(edges, np.int64), np.arange(max(edges[-1] - extra + 1, 1)) + extra)
    table = table.astype(dtype)  # table[n]: the bucket of length n
    buckets = np.empty(lengths.shape, dtype)
    for start in range(0, lengths.size, CHUNK):
        np.take(table, lengths[start : start + CHUNK], out=buckets[start : start + CHUNK])
    return buckets


def rows_in_play(
    split: PreparedSplit, edges: list[int], extra: int, cap: int | None, truncate: bool
) -> tuple[np.ndarray | None, np.ndarray]:
    """(rows kept, or None for all of them; their buckets) from the split's length index, chunk by chunk.

    A row's length is max(source, target) pieces + `extra`, cut to `cap` + `extra` with `truncate`; without it,
    rows longer than `cap` are left out. Two passes (count, then fill), so the only arrays of the corpus's size
    are the results: 1 byte per row for the buckets, plus 4 per kept row when some are left out.
    """
    size = len(split)

    def longest(start: int) -> np.ndarray:  # uint16, saturated like the length index
        chunk = np.maximum(
            split.source_lengths[start : start + CHUNK], split.target_lengths[start : start + CHUNK]
        )
        return np.minimum(chunk, cap) if cap is not None and truncate else chunk

    starts = range(0, size, CHUNK)
    if cap is None or truncate:
        kept = size
    else:
        kept = sum(int((longest(start) <= cap).sum()) for start in starts)
    buckets = np.empty(kept, np.uint8 if len(edges) < 256 else np.int32)
    if kept == size:
        for start in starts:
            buckets[start : start + CHUNK] = bucket_of(longest(start), edges, extra)
        return None, buckets
    pairs, filled = np.empty(kept, index_dtype(size)), 0
    for start in starts:
        chunk = longest(start)
        keep = chunk <= cap
        count = int(keep.sum())
        pairs[filled : filled + count] = np.flatnonzero(keep) + start
        buckets[filled : filled + count] = bucket_of(chunk[keep], edges, extra)
        filled += count
    return pairs, buckets


class EpochPlan:
    """Which pairs form which batch in each epoch: a pure function of (seed, epoch), computed batch by batch.

    Once per plan (not per epoch), the rows in play are grouped by bucket (a stable counting sort, chunk by chunk)
    and each bucket is cut into batches of its batch size: the batch layout, the same every epoch. Epoch e then
    permutes the rows of each bucket b with the keyed bijection `tf.random_index_shuffle` (seed `(seed, e, b)`),
    so batch k of bucket b holds the bucket's rows at positions `pi(k * size), ..., pi(k * size + size - 1)`,
    and it shuffles the batch order with a NumPy rng seeded by (seed, e). Nothing of the corpus's size is computed
    per epoch: the first batch of an epoch costs the same at 30k pairs and at 100M (the permutation is evaluated
    only at a batch's positions), and the plan keeps the grouped rows (4 bytes per row in play; the buckets and
    `pairs` it was built from can go). With `shuffle=False` the rows stay in corpus order within each bucket and
    the batches in bucket order.

    `ROUNDS` rounds of the index shuffle's block cipher: with TensorFlow's default of 4, consecutive indices of a
    1M-row bucket land at positions close to an arithmetic progression (27350, 97223, 157910, ...: a batch would
    sample the bucket at a nearly regular stride); with 8 they show no such structure (tests/data/test_batching.py).

    Args:
      pairs: the split rows in play (an index array), or None for all `len(buckets)` rows.
      buckets: bucket of each row in play (small integers).
      batch_sizes: pairs per batch of each bucket.
      index_size: rows of the split (the dtype of row indices: `index_dtype`).
    """

    ROUNDS = 8

    def __init__(
        self,
        pairs: np.ndarray | None,
        buckets: np.ndarray,
        batch_sizes: list[int],
        seed: int,
        shuffle: bool,
        index_size: int | None = None,
    ):
        self.seed, self.shuffle = int(seed), shuffle
        self.counts = np.bincount(buckets, minlength=len(batch_sizes))
        self.bucket_starts = np.cumsum(self.counts) - self.counts  # of each bucket's rows, in `grouped`
        row_lengths, batch_bucket = [], []  # the batch layout, in bucket order
        for bucket, (count, size) in enumerate(zip(self.counts.tolist(), batch_sizes)):
            full, rest = divmod(count, int(size))
            row_lengths += [int(size)] * full + ([rest] if rest else [])
            batch_bucket += [bucket] * (full + bool(rest))
        self.row_lengths = np.asarray(row_lengths, np.int64)
        self.row_starts = np.cumsum(self.row_lengths) - self.row_lengths  # of each batch, in `grouped`
        self.batch_bucket = np.asarray(batch_bucket, np.int32)
        self.dtype = index_dtype(max(len(buckets), index_size or 0))
        self.grouped = self._group_by_bucket(buckets)
        if pairs is not None:  # rows in play -> split rows, chunk by chunk
            for start in range(0, len(self.grouped), CHUNK):
                self.grouped[start : start + CHUNK] = pairs[self.grouped[start : start + CHUNK]]
        self._bucket_starts_t = tf.constant(self.bucket_starts, tf.int64)
        self._counts_t = tf.constant(self.counts, tf.int64)

    def __len__(self) -> int:
        return len(self.row_lengths)

    def layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The epoch's batches in order: (start in the bucket-grouped rows, pairs, bucket), each (num_batches,)."""
        order = np.arange(len(self.row_lengths))
        if self.shuffle:
            order = np.random.default_rng([self.seed, int(epoch)]).permutation(order)
        return self.row_starts[order], self.row_lengths[order], self.batch_bucket[order]

    def positions(self, epoch, bucket, start, count) -> tf.Tensor:
        """Positions in `grouped` of the `count` rows from `start` (a position of `layout`, in `bucket`) of the
        epoch: int64 (count,). TensorFlow ops (the input pipeline runs them in its graph); any integer scalars."""
        epoch, bucket, start, count = (tf.cast(x, tf.int64) for x in (epoch, bucket, start, count))
        offset = tf.gather(self._bucket_starts_t, bucket)
        first = start - offset  # within the bucket
        if not self.shuffle:
            return offset + tf.range(first, first + count, dtype=tf.int64)
        # the op refuses an empty index: a share without rows shuffles one index, then drops it
        last = tf.gather(self._counts_t, bucket) - 1
        padded = tf.minimum(tf.range(first, first + tf.maximum(count, 1), dtype=tf.int64), last)
        seed = tf.stack([tf.constant(self.seed, tf.int64), epoch, bucket])
        shuffled = tf.raw_ops.RandomIndexShuffle(index=padded, seed=seed, max_index=last, rounds=self.ROUNDS)
        return offset + shuffled[:count]

    def rows(self, epoch: int, start: int, count: int) -> np.ndarray:
        """Split rows of one batch of the epoch (a `layout` entry, or a share of one), eagerly."""
        bucket = int(np.searchsorted(self.bucket_starts + self.counts, int(start), side="right"))
        return self.grouped[self.positions(epoch, bucket, start, count).numpy()]

    def __call__(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(split rows in batch order (N,) `self.dtype`, pairs per batch (num_batches,) int64, bucket per batch):
        the whole epoch at once (statistics, tests), the permutation evaluated bucket by bucket."""
        starts, counts, buckets = self.layout(epoch)
        epoch_rows = np.empty_like(self.grouped)  # in layout positions
        for bucket, (offset, size) in enumerate(zip(self.bucket_starts.tolist(), self.counts.tolist())):
            if size:
                epoch_rows[offset : offset + size] = self.grouped[
                    self.positions(epoch, bucket, offset, size).numpy()
                ]
        index = np.zeros(0, self.dtype)
        if len(starts):
            index = np.concatenate([epoch_rows[a : a + n] for a, n in zip(starts.tolist(), counts.tolist())])
        return index, counts, buckets

    def _group_by_bucket(self, buckets: np.ndarray) -> np.ndarray:
        """The rows `0 .. len(buckets) - 1` bucket by bucket, in row order within each: a stable sort by bucket,
        chunk by chunk (each chunk's rows sorted by a stable argsort of their buckets, a radix sort for uint8,
        then each bucket's run copied to its place; temporaries of one chunk, not of the corpus)."""
        grouped = _empty(len(buckets), self.dtype)
        cursor = self.bucket_starts.tolist()  # where each bucket's next rows go
        for start in range(0, len(buckets), GROUP_CHUNK):
            keys = buckets[start : start + GROUP_CHUNK]
            counts = np.bincount(keys, minlength=len(self.counts)).tolist()
            part = np.argsort(keys, kind="stable").astype(self.dtype) + self.dtype.type(start)
            done = 0  # rows of this chunk placed
            for bucket, count in enumerate(counts):
                if count:
                    grouped[cursor[bucket] : cursor[bucket] + count] = part[done : done + count]
                    cursor[bucket] += count
                    done += count
        return grouped


def part_rows(rows, first: int, end: int, total: int):
    """Rows `[start, stop)` of shares `first .. end - 1` of a batch of `rows` cut into `total` near-equal shares
    (share i: rows `[rows * i // total, rows * (i + 1) // total)`). Python ints or integer tensors."""
    return rows * first // total, rows * end // total


def bucketed_batches(
    split: PreparedSplit,
    *,
    edges: list[int],
    batch_sizes: list[int],
    max_pieces: int | None = None,
    truncate: bool = False,
    extra_tokens: int = 1,
    seed: int = 0,
    shuffle: bool = True,
    repeat: bool = False,
    part: tuple[int, int, int] | None = None,
    resegment: Resegment | None = None,
) -> tf.data.Dataset:
    """Batches of pairs of similar length, as ragged piece ids plus the bucket edge to pad them to.

    Args:
      split: the pairs (read from its files, or in memory).
      edges: increasing bucket edges (padded lengths); a pair goes to the first edge >= its length.
      batch_sizes: pairs per batch for each bucket.
      max_pieces: pairs with a longer side are left out (or cut to it, with `truncate`); None keeps all.
      truncate: cut sides to `max_pieces` instead of leaving pairs out (evaluation).
      extra_tokens: special tokens the caller adds to each side later (EOS; BOS or EOS), counted in the length;
        every kept `max(len(source), len(target)) + extra_tokens` must be <= edges[-1].
      seed: with the epoch number, fixes the order of pairs and batches (independent of TF's global seed).
      shuffle: False keeps corpus order within each bucket and the buckets in order (evaluation).
      repeat: epochs without end (a fresh order each epoch); else one epoch.
      part: `(first, count, total)`: read only this share of every batch, rows
        `[B * first // total, B * (first + count) // total)` of a batch of B pairs (the whole batch's order and
        size are the same for every part; `part_rows` gives the rows of each share; the iterator checkpoint is
        symbolic, see above); None reads whole batches.
      resegment: `(flat, lengths, rows, epoch, side, max_pieces) -> (flat, lengths)`, applied to each side of
        every batch (side 0 source, 1 target; `rows` the pairs' split rows; `max_pieces` what the batch's edge
        holds): a pure function of its arguments, so resuming stays exact (`data.subword_dropout`).
    Returns:
      A dataset of `{"source": int32 ragged (B, None), "target": int32 ragged (B, None), "edge": int32 ()}`; with
      a `part`, B is the part's rows and `"batch_rows": int64 ()` is the whole batch's.
    """
    if len(edges) != len(batch_sizes):
        raise ValueError(f"{len(edges)} bucket edges but {len(batch_sizes)} batch sizes")
    if part is not None:
        first, count, total = part
        if not (total >= 1 and count >= 1 and 0 <= first and first + count <= total):
            raise ValueError(
                f"part (first, count, total) needs 0 <= first, 1 <= count, first + count <= total: {part}"
            )
    # the length index saturates at MAX_INDEXED_LENGTH: a larger limit changes nothing
    cap = None if max_pieces is None else min(max_pieces, MAX_INDEXED_LENGTH)
    pairs, buckets = rows_in_play(split, edges, extra_tokens, cap, truncate)
    split.release_pages()  # the plan keeps what it needs of the length index (the bucket-grouped rows)
    plan = EpochPlan(pairs, buckets, batch_sizes, seed, shuffle, index_size=len(split))
    if repeat and not len(plan):
        raise ValueError("cannot repeat an empty corpus")
    limit = max_pieces if truncate else None
    edges_t = tf.constant(edges, tf.int32)

    @tf.autograph.experimental.do_not_convert
    def plan_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        start, rows, bucket = tf.numpy_function(
            plan.layout, [epoch], (tf.int64, tf.int64, tf.int32), stateful=False
        )
        for tensor in (start, rows, bucket):
            tensor.set_shape([None])
        epoch = tf.fill(tf.shape(start), epoch)
        return tf.data.Dataset.from_tensor_slices(
            {"epoch": epoch, "start": start, "rows": rows, "bucket": bucket}
        )

    def gather_numpy(positions: np.ndarray, epoch: np.ndarray, bucket: np.ndarray):
        rows = plan.grouped[positions]
        source, source_len, target, target_len = split.gather(rows, limit)
        if resegment is not None:
            most = edges[int(bucket)] - extra_tokens
            source, source_len = resegment(source, source_len, rows, int(epoch), 0, most)
            target, target_len = resegment(target, target_len, rows, int(epoch), 1, most)
        return source, source_len, target, target_len

    @tf.autograph.experimental.do_not_convert
    def gather(batch: dict) -> dict:
        start, count = batch["start"], batch["rows"]
        if part is not None:
            first, end = part_rows(count, part[0], part[0] + part[1], part[2])
            start, count = start + first, end - first
        positions = plan.positions(batch["epoch"], batch["bucket"], start, count)
        source, source_len, target, target_len = tf.numpy_function(
            gather_numpy,
            [positions, batch["epoch"], batch["bucket"]],
            (tf.int32, tf.int64, tf.int32, tf.int64),
            stateful=False,
        )
        for tensor in (source, source_len, target, target_len):
            tensor.set_shape([None])
        batch_rows = {} if part is None else {"batch_rows": batch["rows"]}  # the whole batch's, int64 ()
        return {
            "source": tf.RaggedTensor.from_row_lengths(source, source_len, validate=False),  # (B, None)
            "target": tf.RaggedTensor.from_row_lengths(target, target_len, validate=False),  # (B, None)
            "edge": tf.gather(edges_t, batch["bucket"]),  # ()
            **batch_rows,
        }

    epochs = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    dataset = epochs.flat_map(plan_epoch).map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    # the NumPy functions are pure: restoring an iterator re-runs them on the same inputs
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    if part is not None:  # positions only, no batches of this part (the whole batches' checkpoint: unchanged)
        options.experimental_symbolic_checkpoint = True
    return dataset.with_options(options)
