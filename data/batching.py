"""The seeded, checkpointable sampler of length-bucketed batches over a prepared split.

Why not `cache() -> shuffle(buffer) -> group_by_window`: an iterator checkpoint of `cache()` holds the whole cache
and one of `shuffle` its whole buffer (gigabytes on WMT), and a shuffle buffer is not a permutation. Here each
epoch is planned in NumPy from the split's length index and the epoch number alone:

    epoch e:  perm = permutation of the kept pairs, rng seeded by (seed, e)      # a full permutation, no buffer
              group perm by bucket (stable), cut each bucket into batches of its batch size
              shuffle the batch order with the same rng
              each batch: gather its pieces from the split (read from its files, or in memory)
                          -> {"source": (B, None), "target": (B, None), "edge": ()}

A reader can take only its `part` of every batch (one worker of a multi-worker run, for its replicas): the plan
stays global (every reader computes the same plan from the length index, a few bytes per pair), and the reader
gathers, reads and pads only its rows of each batch. Its iterator checkpoint is then symbolic (tf.data's
`experimental_symbolic_checkpoint`: positions only, no prefetched batches), so it holds the same integers for every
part and any part can resume from another part's checkpoint (the workers of a run restore the chief's).

Everything is a pure function of (seed, epoch), so the iterator state is a few integers (epoch, batch position,
prefetched batches): `tf.train.Checkpoint(iterator=it)` stays small, and restoring it into a fresh iterator of a
freshly built dataset resumes at the exact batch, re-reading or re-tokenizing nothing. The corpus never becomes a
graph constant: planning and gathering run in `tf.numpy_function`s (deterministic, so restoring re-plans the
same epoch); the input pipeline carries only (epoch, start, size, bucket) per batch, and the plan keeps an epoch's
grouped rows in NumPy (4 bytes per pair). The batch layout (sizes and buckets) is the same every epoch; only
which pairs go where changes.
Each bucket ends an epoch with at most one smaller batch: at most 2 x buckets distinct batch shapes.
"""

from __future__ import annotations

import mmap
import threading

import numpy as np
import tensorflow as tf

from data.store import MAX_INDEXED_LENGTH, PreparedSplit

CHUNK = 1 << 20  # rows per chunk of the passes over the length index and the plan: temporaries of a few MB
GROUP_CHUNK = 1 << 18  # rows per chunk of the grouping: its argsort's int64 temporaries stay at 2 MB
MAPPED_BYTES = 1 << 24  # arrays from this size on get their own memory map (_empty)


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

    uint8 when there are fewer than 256 edges (else int32), computed chunk by chunk: memory is one byte per row
    plus a fixed chunk, whatever the number of rows.
    """
    lengths = np.asarray(lengths)
    if lengths.size and int(lengths.max()) + extra > edges[-1]:
        raise ValueError(
            f"a sequence of length {int(lengths.max()) + extra} exceeds the last bucket edge {edges[-1]}"
        )
    buckets = np.empty(lengths.shape, np.uint8 if len(edges) < 256 else np.int32)
    edges_array = np.asarray(edges, np.int64)
    for start in range(0, lengths.size, CHUNK):
        chunk = lengths[start : start + CHUNK].astype(np.int64) + extra
        buckets[start : start + CHUNK] = np.searchsorted(edges_array, chunk, side="left")
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
    """Which pairs form which batch in each epoch: a pure function of (seed, epoch).

    The order of an epoch: a permutation of the rows in play (rng seeded by (seed, epoch)), grouped by bucket
    (stable), cut into each bucket's batches, and the batches shuffled with the same rng. `rng.shuffle` of an
    arange draws the same permutation as `rng.permutation(n)` for any integer dtype (tests/data/test_batching.py).

    Args:
      pairs: the split rows in play (an index array), or None for all `len(buckets)` rows.
      buckets: bucket of each row in play (small integers).
      batch_sizes: pairs per batch of each bucket.
      index_size: rows of the split (the dtype of row indices: `index_dtype`).

    Memory: one byte (the bucket) per row in play, plus `pairs` when some rows are left out, plus the grouped rows
    of the last two epochs asked for (4 bytes per row each: `layout` and `rows` read them, the input pipeline holds
    only each batch's (epoch, start, size)). Computing an epoch takes two such arrays and one chunk's temporaries.
    Safe to call from several threads.
    """

    KEEP_EPOCHS = 2  # an epoch's last batches may still be gathered while the next one starts

    def __init__(
        self,
        pairs: np.ndarray | None,
        buckets: np.ndarray,
        batch_sizes: list[int],
        seed: int,
        shuffle: bool,
        index_size: int | None = None,
    ):
        self.pairs, self.buckets, self.seed, self.shuffle = pairs, buckets, seed, shuffle
        self.counts = np.bincount(buckets, minlength=len(batch_sizes))
        row_lengths, batch_bucket = [], []  # the batch layout, in bucket order
        for bucket, (count, size) in enumerate(zip(self.counts, batch_sizes)):
            full, rest = divmod(int(count), int(size))
            row_lengths += [size] * full + ([rest] if rest else [])
            batch_bucket += [bucket] * (full + bool(rest))
        self.row_lengths = np.asarray(row_lengths, np.int64)
        self.row_starts = np.cumsum(self.row_lengths) - self.row_lengths  # of each batch, in `grouped`
        self.batch_bucket = np.asarray(batch_bucket, np.int32)
        self.dtype = index_dtype(max(len(buckets), index_size or 0))
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # epoch -> (grouped rows, batch order)
        self._computing = threading.Lock()

    def __len__(self) -> int:
        return len(self.row_lengths)

    def layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The epoch's batches in order: (start in `rows`, pairs, bucket), each (num_batches,)."""
        batch_order = self._epoch(int(epoch))[1]
        return self.row_starts[batch_order], self.row_lengths[batch_order], self.batch_bucket[batch_order]

    def rows(self, epoch: int, start: int, count: int) -> np.ndarray:
        """Split rows of one batch of the epoch (a `layout` entry)."""
        return self._epoch(int(epoch))[0][int(start) : int(start) + int(count)]

    def __call__(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(split rows in batch order (N,) `self.dtype`, pairs per batch (num_batches,) int64, bucket per batch)."""
        starts, counts, buckets = self.layout(epoch)
        grouped = self._epoch(int(epoch))[0]
        index = np.zeros(0, self.dtype)
        if len(starts):
            index = np.concatenate([grouped[a : a + n] for a, n in zip(starts.tolist(), counts.tolist())])
        return index, counts, buckets

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        cached = self._epochs.get(epoch)
        if cached is not None:
            return cached
        with self._computing:  # once per epoch, even when several threads ask at once
            cached = self._epochs.get(epoch)
            if cached is None:
                cached = self._epochs[epoch] = self._compute(epoch)
                while len(self._epochs) > self.KEEP_EPOCHS:
                    del self._epochs[min(e for e in self._epochs if e != epoch)]
            return cached

    def _compute(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        order = _empty(len(self.buckets), self.dtype)
        for start in range(0, len(order), CHUNK):
            order[start : start + CHUNK] = np.arange(start, min(start + CHUNK, len(order)), dtype=self.dtype)
        batch_order = np.arange(len(self.row_lengths))
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            rng.shuffle(order)
            batch_order = rng.permutation(batch_order)
        grouped = self._group_by_bucket(order)
        del order
        if self.pairs is not None:  # rows in play -> split rows, chunk by chunk
            for start in range(0, len(grouped), CHUNK):
                grouped[start : start + CHUNK] = self.pairs[grouped[start : start + CHUNK]]
        return grouped, batch_order

    def _group_by_bucket(self, order: np.ndarray) -> np.ndarray:
        """`order` bucket by bucket, in `order` within each: a stable sort by bucket, chunk by chunk (each chunk's
        rows sorted by a stable argsort of their buckets, a radix sort for uint8, then each bucket's run copied to
        its place; temporaries of one chunk, not of the corpus, gone when it returns)."""
        grouped = _empty(len(order), order.dtype)
        cursor = (np.cumsum(self.counts) - self.counts).tolist()  # where each bucket's next rows go
        for start in range(0, len(order), GROUP_CHUNK):
            part = order[start : start + GROUP_CHUNK]
            keys = self.buckets[part]
            counts = np.bincount(keys, minlength=len(self.counts)).tolist()
            part = part[np.argsort(keys, kind="stable")]
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
    split.release_pages()  # the plan keeps what it needs of the length index (the buckets)
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

    def gather_numpy(epoch: np.ndarray, start: np.ndarray, rows: np.ndarray):
        if part is None:
            return split.gather(plan.rows(epoch, start, rows), limit)
        first, end = part_rows(int(rows), part[0], part[0] + part[1], part[2])
        return split.gather(plan.rows(epoch, int(start) + first, end - first), limit)

    @tf.autograph.experimental.do_not_convert
    def gather(batch: dict) -> dict:
        source, source_len, target, target_len = tf.numpy_function(
            gather_numpy,
            [batch["epoch"], batch["start"], batch["rows"]],
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
