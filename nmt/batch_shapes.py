"""Decoding batches of `nmt.translator.Translator`: which sentences share a batch, and the sizes they are padded to.

Sentences are sorted by length (longest first) and batched under a token budget: at most `batch_size` sentences
and `budget` padded source tokens per batch (`plan_batches`), so batches of long sentences are smaller. Under XLA,
which compiles one program per shape, source lengths and batch sizes are rounded up (`round_up`) to a few edges
(`padding_edges`); without it a batch is padded to its longest source only (the module docstring of
`nmt.translator`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

__all__ = ["DEFAULT_BATCH_TOKENS_PER_SENTENCE", "padding_edges", "plan_batches", "round_up"]

# Sentences of up to 31 subwords fill `batch_size` sentences per batch; longer ones make smaller batches.
DEFAULT_BATCH_TOKENS_PER_SENTENCE = 32


def padding_edges(smallest: int, largest: int, factor: int) -> list[int]:
    """The sizes a dimension is padded to: `smallest`, times `factor` while below `largest`, then `largest`."""
    edges, value = [], smallest
    while value < largest:
        edges.append(value)
        value *= factor
    return [*edges, largest]


def round_up(value: int, edges: Sequence[int]) -> int:
    """The first of `edges` at least `value` (the last one for a larger value)."""
    return edges[min(bisect.bisect_left(edges, value), len(edges) - 1)]


def plan_batches(
    lengths: Sequence[int], batch_size: int, budget: int, padded_length: Callable[[int], int]
) -> list[list[int]]:
    """Groups sentences of these source lengths (subwords, EOS excluded) into batches: lists of indices.

    Longest first (memory problems show early); a batch takes the next sentence while it holds fewer than
    `batch_size` sentences and the padded batch stays within `budget` tokens. `padded_length(length)`: the padded
    source length of a batch whose longest sentence has `length` subwords.
    """
    batches: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if batches:
            batch = batches[-1]
            width = padded_length(lengths[batch[0]])  # the first sentence is the longest
            if len(batch) < batch_size and (len(batch) + 1) * width <= budget:
                batch.append(index)
                continue
        batches.append([index])
    return batches
