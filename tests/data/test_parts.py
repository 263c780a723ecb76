"""A reader's `part` of every batch (one worker of a multi-worker run): the parts of a batch, concatenated in
order, are exactly the whole batch (the plan stays global), a part gathers only its own rows from the split, and a
part's iterator resumes exactly from its checkpoint. The reference is the whole batch read without a part."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from data.batching import bucketed_batches, part_rows
from data.config import DataConfig
from data.pipeline import train_batches
from data.store import PreparedSplit

EDGES, SIZES = [8, 16, 20], [13, 7, 1]  # odd sizes: uneven shares; size 1: parts without rows
# consecutive shares that cover [0, total): one worker per share (count = its replicas)
PARTITIONS = [
    [(0, 1, 1)],
    [(0, 1, 2), (1, 1, 2)],
    [(0, 1, 3), (1, 1, 3), (2, 1, 3)],
    [(0, 2, 4), (2, 2, 4)],
    [(0, 1, 5), (1, 3, 5), (4, 1, 5)],
]


class CountingSplit(PreparedSplit):
    """A real in-memory split that records how many rows each `gather` call reads."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gathered: list[int] = []

    def gather(self, index, limit=None):
        self.gathered.append(len(index))  # list.append is atomic: gathers run on tf.data threads
        return super().gather(index, limit)


def corpus(pairs: int = 120, seed: int = 0) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    sides = [
        [rng.integers(3, 50, rng.integers(1, 19)).tolist() for _ in range(pairs)] for _ in range(2)
    ]  # up to 18 pieces: some pairs are longer than max_pieces=16 and left out
    return sides[0], sides[1]


def sampler(split, part=None, repeat=True, seed=7) -> tf.data.Dataset:
    return bucketed_batches(
        split, edges=EDGES, batch_sizes=SIZES, max_pieces=16, seed=seed, repeat=repeat, part=part
    )


def as_numpy(batch: dict) -> dict:
    out = {key: value.numpy() for key, value in batch.items() if not isinstance(value, tf.RaggedTensor)}
    for key in ("source", "target"):
        out[key] = batch[key].flat_values.numpy()
        out[f"{key}_lengths"] = batch[key].row_lengths().numpy()
    return out


def take(dataset: tf.data.Dataset, count: int) -> list[dict]:
    return [as_numpy(batch) for batch in dataset.take(count)]


def batches_per_epoch(split) -> int:
    return sum(1 for _ in sampler(split, repeat=False))


@pytest.mark.parametrize("partition", PARTITIONS, ids=lambda p: "+".join(f"{c}/{t}" for _, c, t in p))
def test_parts_of_every_batch_concatenate_to_the_whole_batch(partition):
    split = PreparedSplit.from_pieces(*corpus())
    count = 2 * batches_per_epoch(split) + 3  # two epochs and the start of a third
    whole = take(sampler(split), count)
    parts = [take(sampler(split, part), count) for part in partition]
    empty_parts = 0
    for index, batch in enumerate(whole):
        rows = len(batch["source_lengths"])
        assert "batch_rows" not in batch
        for (first, share, total), part in zip(partition, parts):
            mine = part[index]
            start, stop = part_rows(rows, first, first + share, total)
            assert int(mine["batch_rows"]) == rows and int(mine["edge"]) == int(batch["edge"])
            assert len(mine["source_lengths"]) == len(mine["target_lengths"]) == stop - start
            empty_parts += stop == start
        for key in ("source", "target", "source_lengths", "target_lengths"):
            joined = np.concatenate([part[index][key] for part in parts])
            np.testing.assert_array_equal(joined, batch[key], err_msg=f"batch {index}, {key}")
    if partition[0][2] > 1:
        assert empty_parts > 0  # the one-pair batches of the last bucket leave some parts empty: covered


@pytest.mark.parametrize("partition", PARTITIONS[1:4], ids=["halves", "thirds", "two-of-four"])
def test_a_part_reads_only_its_rows_from_the_split(partition):
    sources, targets = corpus()
    whole = CountingSplit.from_pieces(sources, targets)
    epoch = [len(batch["source_lengths"]) for batch in take(sampler(whole, repeat=False), 10_000)]
    assert Counter(whole.gathered) == Counter(epoch) and sum(epoch) < len(sources)  # some left out
    for first, share, total in partition:
        split = CountingSplit.from_pieces(sources, targets)
        read = take(sampler(split, (first, share, total), repeat=False), 10_000)
        expected = [np.diff(part_rows(rows, first, first + share, total))[0] for rows in epoch]
        assert [len(batch["source_lengths"]) for batch in read] == expected
        assert Counter(split.gathered) == Counter(expected)  # one gather per batch, of this part's rows only
        assert sum(split.gathered) < sum(epoch)


def data_config() -> DataConfig:
    return DataConfig(max_length=17, batch_tokens=104, bucket_boundaries=[8, 16])  # batches of 8, 6, 6 pairs


def test_training_batches_of_the_parts_are_the_padded_rows_of_the_whole_batch():
    split = PreparedSplit.from_pieces(*corpus(seed=1))
    whole = list(train_batches(data_config(), split, seed=3, repeat=False).as_numpy_iterator())
    halves = [
        list(
            train_batches(data_config(), split, seed=3, repeat=False, part=(first, 1, 2)).as_numpy_iterator()
        )
        for first in (0, 1)
    ]
    assert len(halves[0]) == len(halves[1]) == len(whole) > 5
    for index, batch in enumerate(whole):
        assert set(batch) == {"source", "target_in", "target_out"}
        for half in halves:
            assert int(half[index]["batch_rows"]) == len(batch["source"])
        for key in batch:
            joined = np.concatenate(
                [half[index][key] for half in halves]
            )  # same padded width (the bucket edge)
            np.testing.assert_array_equal(joined, batch[key], err_msg=f"batch {index}, {key}")


def test_a_part_resumes_exactly_from_its_own_and_from_another_parts_checkpoint(tmp_path):
    """The workers of a run all restore the chief's checkpoint: it holds positions only (no prefetched batches of
    the chief's part), so each part continues with its own rows, as if never interrupted (across an epoch end)."""
    split = PreparedSplit.from_pieces(*corpus(seed=2))
    epoch = sum(1 for _ in train_batches(data_config(), split, seed=5, repeat=False))
    position = epoch - 2

    def iterator(part, skip):
        batches = iter(train_batches(data_config(), split, seed=5, part=part))
        for _ in range(skip):
            next(batches)
        return batches

    def upcoming(batches, count=5):  # into the next epoch
        return [{key: value.numpy() for key, value in next(batches).items()} for _ in range(count)]

    path = tf.train.Checkpoint(iterator=iterator((0, 2, 4), position)).write(str(tmp_path / "ckpt"))
    for part in [(0, 2, 4), (2, 2, 4)]:
        resumed = iterator(part, 0)
        tf.train.Checkpoint(iterator=resumed).read(path).assert_consumed()
        got, want = upcoming(resumed), upcoming(iterator(part, position))
        for got_batch, want_batch in zip(got, want, strict=True):
            assert got_batch.keys() == want_batch.keys()
            for key in want_batch:
                np.testing.assert_array_equal(got_batch[key], want_batch[key], err_msg=f"part {part}, {key}")
    assert not np.array_equal(upcoming(iterator((0, 2, 4), position))[0]["source"], want[0]["source"])


@pytest.mark.parametrize("part", [(0, 0, 2), (1, 2, 2), (-1, 1, 2), (0, 1, 0)])
def test_a_part_outside_the_batch_is_refused(part):
    with pytest.raises(ValueError, match="part"):
        sampler(PreparedSplit.from_pieces(*corpus(20)), part)
