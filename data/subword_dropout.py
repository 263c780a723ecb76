"""Subword dropout: training pieces split at random into two pieces of the vocabulary (subword regularisation).

BPE-dropout (Provilkov et al., 2020) and SentencePiece sampling (Kudo, 2018) show the model other segmentations of
the same text, which regularises small corpora. Both need the raw text at batch time; the prepared cache holds
ids. This works on the ids instead, with the same effect on the segmentation BPE-dropout has (finer pieces, the
same text): each piece whose string splits into two pieces of the vocabulary is replaced, with probability
`rate`, by one of those splits, chosen uniformly. Lossless by construction: the two pieces' strings concatenate to
the piece's string, so the pair detokenizes to the same text. Control, unknown and byte pieces never split.

    table = SplitTable.from_model(tokenizer.models[0])
    flat, lengths = table.resegment(flat, lengths, rows, rate=0.1, seed=1234, epoch=3, side=0, max_pieces=47)

Each draw is a hash of (seed, epoch, side, corpus row, position in the row): the segmentation of a pair depends
on nothing else, not on the batch it lands in nor on which part of a batch a reader reads (multi-worker), so a
resumed run sees exactly the pieces the uninterrupted one saw, and every epoch a fresh segmentation. Batch shapes
never change: a row that would grow beyond `max_pieces` (what its batch's bucket edge holds) splits only as many of
its drawn pieces as it has room for, those with the lowest draws (a random subset, not the first ones).
"""

from __future__ import annotations

import numpy as np
import sentencepiece as spm

_KEYS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 (wrapping arithmetic): a bijection that scrambles every bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniforms(key: int, rows: np.ndarray, positions: np.ndarray, stream: int) -> np.ndarray:
    """Uniform [0, 1) float64 per (row, position): a hash of them, `key` and `stream`."""
    with np.errstate(over="ignore"):
        x = rows.astype(np.uint64) * np.uint64(_KEYS[0]) + positions.astype(np.uint64) * np.uint64(_KEYS[1])
        x = _mix(x ^ np.uint64(key) ^ (np.uint64(stream) * np.uint64(_KEYS[2])))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


class SplitTable:
    """For each piece id, the (left, right) pairs of vocabulary pieces its string splits into.

    `offsets` (vocab + 1,) int64, `left` and `right` (splits,) int32: the splits of piece i are
    `left[offsets[i]:offsets[i + 1]]`, `right[...]`, in order of the split point.
    """

    def __init__(self, offsets: np.ndarray, left: np.ndarray, right: np.ndarray):
        self.offsets, self.left, self.right = offsets, left, right
        self.counts = np.diff(offsets)

    @classmethod
    def from_model(cls, model: bytes) -> SplitTable:
        """The table of a serialized SentencePiece model: every split of every normal piece into two normal ones."""
        processor = spm.SentencePieceProcessor()
        processor.LoadFromSerializedProto(model)
        size = processor.GetPieceSize()

        def normal(i: int) -> bool:
            return not (processor.IsControl(i) or processor.IsUnknown(i) or processor.IsByte(i))

        ids = {processor.IdToPiece(i): i for i in range(size) if normal(i)}
        offsets, left, right = [0], [], []
        for i in range(size):
            piece = processor.IdToPiece(i) if normal(i) else ""
            for cut in range(1, len(piece)):
                a, b = ids.get(piece[:cut]), ids.get(piece[cut:])
                if a is not None and b is not None:
                    left.append(a)
                    right.append(b)
            offsets.append(len(left))
        return cls(np.asarray(offsets, np.int64), np.asarray(left, np.int32), np.asarray(right, np.int32))

    def resegment(
        self,
        flat: np.ndarray,
        lengths: np.ndarray,
        rows: np.ndarray,
        *,
        rate: float,
        seed: int,
        epoch: int,
        side: int,
        max_pieces: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Splits pieces of a batch's rows at random, each row to at most `max_pieces` pieces.

        Args:
          flat: int32 (N,), the rows' pieces one after the other; lengths: int (B,), pieces per row.
          rows: int (B,), each row's index in the corpus (with seed, epoch and side, the key of its draws).
          rate: probability that a splittable piece is split.
          side: 0 source, 1 target (independent draws for the two sides of a pair).
          max_pieces: the most pieces a row may have after splitting.
        Returns:
          (flat int32, lengths int64), the same rows.
        """
        flat = np.asarray(flat, np.int32)
        lengths = np.asarray(lengths, np.int64)
        if rate <= 0 or not flat.size:
            return flat, lengths
        row_of = np.repeat(np.arange(len(lengths)), lengths)  # (N,) row of each piece
        positions = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        with np.errstate(over="ignore"):
            key = _mix(np.uint64(seed) * np.uint64(_KEYS[3]) ^ _mix(np.uint64(epoch)) ^ np.uint64(side))
        corpus_rows = np.asarray(rows, np.int64)[row_of]
        known = (flat >= 0) & (flat < len(self.counts))
        counts = np.where(known, self.counts[np.where(known, flat, 0)], 0)
        draw = _uniforms(int(key), corpus_rows, positions, 0)
        split = (counts > 0) & (draw < rate)
        # a row with less room than draws (its bucket's edge) splits only its `room` lowest draws, wherever they are
        room = np.maximum(max_pieces - lengths, 0)
        candidates = np.flatnonzero(split)
        order = candidates[np.lexsort((draw[candidates], row_of[candidates]))]  # by row, then by draw
        per_row = np.bincount(row_of[order], minlength=len(lengths))
        rank = np.arange(len(order)) - np.repeat(np.cumsum(per_row) - per_row, per_row)  # within its row
        split[order[rank >= room[row_of[order]]]] = False
        chosen = np.flatnonzero(split)  # splittable, so ids inside the table
        if not chosen.size:
            return flat, lengths
        draw = _uniforms(int(key), corpus_rows[chosen], positions[chosen], 1)
        pick = self.offsets[flat[chosen]] + np.floor(draw * counts[chosen]).astype(np.int64)
        ends = np.cumsum(1 + split)  # each piece becomes one or two
        out = np.empty(int(ends[-1]), np.int32)
        out[ends - 1 - split] = flat
        out[ends[chosen] - 2] = self.left[pick]
        out[ends[chosen] - 1] = self.right[pick]
        return out, lengths + np.bincount(row_of[chosen], minlength=len(lengths))
