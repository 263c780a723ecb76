"""The seeded, checkpointable sampler of length-bucketed batches over a prepared split.

Why not `cache() -> shuffle(buffer) -> group_by_window`: an iterator checkpoint of `cache()` holds the whole cache
and one of `shuffle` its whole buffer (gigabytes on WMT), and a shuffle buffer is not a permutation. Here each
epoch is planned in NumPy from the split's length index and the epoch number alone:

    epoch e:  perm = permutation of the kept pairs, rng seeded by (seed, e)      # a full permutation, no buffer
              group perm by bucket (stable), cut each bucket into batches of its batch size
              shuffle the batch order with the same rng
              each batch: gather its pieces from the (memory-mapped) arrays
                          -> {"source": (B, None), "target": (B, None), "edge": ()}

Everything is a pure function of (seed, epoch), so the iterator state is a few integers (epoch, batch position,
prefetched batches): `tf.train.Checkpoint(iterator=it)` stays small, and restoring it into a fresh iterator of a
freshly built dataset resumes at the exact batch, re-reading or re-tokenizing nothing. The corpus never becomes a
graph constant: planning and gathering run in `tf.numpy_function`s (deterministic, so restoring re-plans the
same epoch). The batch layout (sizes and buckets) is the same every epoch; only which pairs go where changes.
Each bucket ends an epoch with at most one smaller batch: at most 2 x buckets distinct batch shapes.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from data.store import PreparedSplit


def bucket_of(lengths: np.ndarray, edges: list[int]) -> np.ndarray:
    """Index of the smallest edge >= each length; ValueError if a length exceeds the last edge."""
    buckets = np.searchsorted(np.asarray(edges), lengths, side="left")
    if buckets.size and buckets.max() >= len(edges):
        raise ValueError(
            f"a sequence of length {int(np.max(lengths))} exceeds the last bucket edge {edges[-1]}"
        )
    return buckets


class EpochPlan:
    """Which pairs form which batch in each epoch: a pure function of (seed, epoch)."""

    def __init__(
        self, pairs: np.ndarray, buckets: np.ndarray, batch_sizes: list[int], seed: int, shuffle: bool
    ):
        self.pairs, self.buckets, self.seed, self.shuffle = pairs, buckets, seed, shuffle
        counts = np.bincount(buckets, minlength=len(batch_sizes))
        row_lengths, batch_bucket = [], []  # the batch layout, in bucket order
        for bucket, (count, size) in enumerate(zip(counts, batch_sizes)):
            full, rest = divmod(int(count), int(size))
            row_lengths += [size] * full + ([rest] if rest else [])
            batch_bucket += [bucket] * (full + bool(rest))
        self.row_lengths = np.asarray(row_lengths, np.int64)
        self.batch_bucket = np.asarray(batch_bucket, np.int32)

    def __len__(self) -> int:
        return len(self.row_lengths)

    def __call__(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pair indices in batch order (N,), pairs per batch (num_batches,), bucket per batch)."""
        order = np.arange(len(self.pairs))
        batch_order = np.arange(len(self.row_lengths))
        if self.shuffle:
            rng = np.random.default_rng([self.seed, int(epoch)])
            order = rng.permutation(order)
            batch_order = rng.permutation(batch_order)
        grouped = order[np.argsort(self.buckets[order], kind="stable")]  # bucket by bucket, shuffled within
        starts = np.cumsum(self.row_lengths) - self.row_lengths
        # batches concatenated in `batch_order`
        rows = self.row_lengths[batch_order]
        positions = np.repeat(starts[batch_order] - (np.cumsum(rows) - rows), rows) + np.arange(
            int(rows.sum())
        )
        return self.pairs[grouped[positions]].astype(np.int64), rows, self.batch_bucket[batch_order]


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
) -> tf.data.Dataset:
    """Batches of pairs of similar length, as ragged piece ids plus the bucket edge to pad them to.

    Args:
      split: the pairs (memory-mapped or in memory).
      edges: increasing bucket edges (padded lengths); a pair goes to the first edge >= its length.
      batch_sizes: pairs per batch for each bucket.
      max_pieces: pairs with a longer side are left out (or cut to it, with `truncate`); None keeps all.
      truncate: cut sides to `max_pieces` instead of leaving pairs out (evaluation).
      extra_tokens: special tokens the caller adds to each side later (EOS; BOS or EOS), counted in the length;
        every kept `max(len(source), len(target)) + extra_tokens` must be <= edges[-1].
      seed: with the epoch number, fixes the order of pairs and batches (independent of TF's global seed).
      shuffle: False keeps corpus order within each bucket and the buckets in order (evaluation).
      repeat: epochs without end (a fresh order each epoch); else one epoch.
    Returns:
      A dataset of `{"source": int32 ragged (B, None), "target": int32 ragged (B, None), "edge": int32 ()}`.
    """
    if len(edges) != len(batch_sizes):
        raise ValueError(f"{len(edges)} bucket edges but {len(batch_sizes)} batch sizes")
    source_len = np.asarray(split.source_lengths, np.int64)
    target_len = np.asarray(split.target_lengths, np.int64)
    if max_pieces is not None and truncate:
        source_len, target_len = np.minimum(source_len, max_pieces), np.minimum(target_len, max_pieces)
        pairs = np.arange(len(split))
    elif max_pieces is not None:
        pairs = np.flatnonzero((source_len <= max_pieces) & (target_len <= max_pieces))
    else:
        pairs = np.arange(len(split))
    buckets = bucket_of(np.maximum(source_len[pairs], target_len[pairs]) + extra_tokens, edges)
    index_type = np.int32 if len(split) < 2**31 else np.int64  # host memory: 4 bytes per pair, twice
    plan = EpochPlan(pairs.astype(index_type), buckets.astype(np.int32), batch_sizes, seed, shuffle)
    if repeat and not len(plan):
        raise ValueError("cannot repeat an empty corpus")
    limit = max_pieces if truncate else None
    edges_t = tf.constant(edges, tf.int32)

    @tf.autograph.experimental.do_not_convert
    def plan_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        index, rows, bucket = tf.numpy_function(plan, [epoch], (tf.int64, tf.int64, tf.int32), stateful=False)
        index.set_shape([None])
        rows.set_shape([None])
        bucket.set_shape([None])
        batches = tf.RaggedTensor.from_row_lengths(index, rows, validate=False)  # (num_batches, None)
        return tf.data.Dataset.from_tensor_slices({"index": batches, "bucket": bucket})

    def gather_numpy(index: np.ndarray):
        return split.gather(index, limit)

    @tf.autograph.experimental.do_not_convert
    def gather(batch: dict) -> dict:
        source, source_len, target, target_len = tf.numpy_function(
            gather_numpy, [batch["index"]], (tf.int32, tf.int64, tf.int32, tf.int64), stateful=False
        )
        for tensor in (source, source_len, target, target_len):
            tensor.set_shape([None])
        return {
            "source": tf.RaggedTensor.from_row_lengths(source, source_len, validate=False),  # (B, None)
            "target": tf.RaggedTensor.from_row_lengths(target, target_len, validate=False),  # (B, None)
            "edge": tf.gather(edges_t, batch["bucket"]),  # ()
        }

    epochs = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    dataset = epochs.flat_map(plan_epoch).map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    # the NumPy functions are pure: restoring an iterator re-runs them on the same inputs
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return dataset.with_options(options)
