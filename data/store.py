"""Prepared (tokenized) splits on disk: flat token arrays with offsets and a length index, read at any position.

One directory per split:

    source.values   the source pieces of every pair, concatenated (uint16 if the vocabulary fits, else int32)
    source.offsets  int64 (N + 1,): pair i is values[offsets[i]:offsets[i + 1]]
    target.values, target.offsets   likewise
    lengths         uint16 (N, 2): pieces per (source, target), saturated at 65535 (the length index)
    manifest.json   pairs, dtypes, drop counts, key inputs; written last: the split is complete iff it exists

Written in chunks by `SplitWriter` (memory bounded by one chunk), read by `PreparedSplit` through `np.memmap`
(or loaded into memory when small: the same code path). Pieces carry no special tokens (no BOS, no EOS).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from data.errors import DataError

MANIFEST = "manifest.json"
FORMAT = 1
LENGTH_DTYPE = np.uint16
MAX_INDEXED_LENGTH = np.iinfo(LENGTH_DTYPE).max
IN_MEMORY_BYTES = 64 << 20  # splits smaller than this are read into memory
SIDES = ("source", "target")


def values_dtype(vocab_size: int) -> np.dtype:
    """The most compact dtype for piece ids below `vocab_size`."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


class SplitWriter:
    """Appends tokenized pairs to a split directory; `finish` writes the manifest (the completion marker)."""

    def __init__(self, directory: Path, dtype: np.dtype):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.dtype = np.dtype(dtype)
        self.pairs = 0
        self._ends = dict.fromkeys(SIDES, 0)
        self._files = {}
        for side in SIDES:
            self._files[f"{side}.values"] = open(self.directory / f"{side}.values", "wb")  # noqa: SIM115
            offsets = open(self.directory / f"{side}.offsets", "wb")  # noqa: SIM115
            offsets.write(np.zeros(1, np.int64).tobytes())
            self._files[f"{side}.offsets"] = offsets
        self._files["lengths"] = open(self.directory / "lengths", "wb")  # noqa: SIM115

    def append(self, sources: list[list[int]], targets: list[list[int]]) -> None:
        """Adds pairs given as lists of piece ids."""
        lengths = []
        for side, pieces in zip(SIDES, (sources, targets)):
            length = np.fromiter(map(len, pieces), np.int64, count=len(pieces))
            flat = np.fromiter((i for ids in pieces for i in ids), self.dtype, count=int(length.sum()))
            self._files[f"{side}.values"].write(flat.tobytes())
            self._files[f"{side}.offsets"].write((self._ends[side] + np.cumsum(length)).tobytes())
            self._ends[side] += int(length.sum())
            lengths.append(np.minimum(length, MAX_INDEXED_LENGTH).astype(LENGTH_DTYPE))
        self._files["lengths"].write(np.stack(lengths, axis=1).tobytes())
        self.pairs += len(sources)

    def finish(self, info: dict) -> None:
        """Flushes everything to disk, then writes the manifest (with `info`) last."""
        for handle in self._files.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        manifest = {
            "format": FORMAT,
            "pairs": self.pairs,
            "dtype": self.dtype.name,
            "pieces": self._ends,
            **info,
        }
        partial = self.directory / (MANIFEST + ".partial")
        partial.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(partial, self.directory / MANIFEST)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()


def read_manifest(directory: Path) -> dict | None:
    """The manifest of a complete split directory, else None."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path} is unreadable ({err}): delete {directory} and prepare again") from err


class PreparedSplit:
    """A prepared split, memory-mapped (or in memory): lengths for planning, `gather` for batches.

    Attributes:
      source_lengths, target_lengths: (N,) pieces per pair (saturated at 65535).
      manifest: the split's manifest.
    """

    def __init__(self, arrays: dict[str, np.ndarray], manifest: dict, origin: str = "memory"):
        self._arrays = arrays
        self.manifest = manifest
        self.origin = origin
        lengths = arrays["lengths"]
        self.source_lengths, self.target_lengths = lengths[:, 0], lengths[:, 1]

    @classmethod
    def open(cls, directory: Path, in_memory: bool | None = None) -> PreparedSplit:
        """Opens a complete split directory; checks every file's size against the manifest (names a bad one).

        Args:
          in_memory: load the arrays into memory (None: when the split is under IN_MEMORY_BYTES).
        """
        directory = Path(directory)
        manifest = read_manifest(directory)
        if manifest is None:
            raise DataError(f"{directory} is not a complete prepared split (no {MANIFEST})")
        pairs, dtype = manifest["pairs"], np.dtype(manifest["dtype"])
        shapes = {"lengths": ((pairs, 2), np.dtype(LENGTH_DTYPE))}
        for side in SIDES:
            shapes[f"{side}.values"] = ((manifest["pieces"][side],), dtype)
            shapes[f"{side}.offsets"] = ((pairs + 1,), np.dtype(np.int64))
        total = sum(int(np.prod(shape)) * dt.itemsize for shape, dt in shapes.values())
        load = total < IN_MEMORY_BYTES if in_memory is None else in_memory
        arrays = {}
        for name, (shape, dt) in shapes.items():
            path = directory / name
            expected = int(np.prod(shape)) * dt.itemsize
            size = path.stat().st_size if path.is_file() else -1
            if size != expected:
                raise DataError(
                    f"{path} is truncated or corrupt ({size} bytes, the manifest implies {expected}): "
                    f"delete {directory} and prepare again"
                )
            if expected == 0:
                arrays[name] = np.zeros(shape, dt)
            elif load:
                arrays[name] = np.fromfile(path, dt).reshape(shape)
            else:
                arrays[name] = np.memmap(path, dt, mode="r", shape=shape)
        for side in SIDES:  # cheap consistency checks (two values each), not a checksum of the contents
            offsets = arrays[f"{side}.offsets"]
            if int(offsets[0]) != 0 or int(offsets[-1]) != manifest["pieces"][side]:
                raise DataError(
                    f"{directory / f'{side}.offsets'} is corrupt (it does not span {side}.values): "
                    f"delete {directory} and prepare again"
                )
        return cls(arrays, manifest, origin="memory" if load else "memory-mapped")

    @classmethod
    def from_pieces(cls, sources: list[list[int]], targets: list[list[int]]) -> PreparedSplit:
        """An in-memory split from lists of piece ids (tests, small tools)."""
        arrays = {}
        lengths = []
        for side, pieces in zip(SIDES, (sources, targets)):
            length = np.array([len(p) for p in pieces], np.int64)
            arrays[f"{side}.values"] = np.array([i for p in pieces for i in p], np.int32)
            arrays[f"{side}.offsets"] = np.concatenate([[0], np.cumsum(length)]).astype(np.int64)
            lengths.append(np.minimum(length, MAX_INDEXED_LENGTH).astype(LENGTH_DTYPE))
        arrays["lengths"] = np.stack(lengths, axis=1).reshape(len(sources), 2)
        return cls(arrays, {"pairs": len(sources)})

    def __len__(self) -> int:
        return len(self.source_lengths)

    def _side(self, side: str, index: np.ndarray, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
        offsets, values = self._arrays[f"{side}.offsets"], self._arrays[f"{side}.values"]
        starts, ends = offsets[index], offsets[index + 1]
        lengths = ends - starts
        if limit is not None:
            lengths = np.minimum(lengths, limit)
        total = int(lengths.sum())
        # position of every gathered piece: its pair's start + its rank inside the pair
        first = np.cumsum(lengths) - lengths
        positions = np.repeat(starts - first, lengths) + np.arange(total, dtype=np.int64)
        return values[positions].astype(np.int32), lengths.astype(np.int64)

    def gather(self, index: np.ndarray, limit: int | None = None) -> tuple[np.ndarray, ...]:
        """Pairs `index` (B,) -> (source flat int32, source lengths int64 (B,), target flat, target lengths).

        `limit` cuts each side to at most that many pieces.
        """
        index = np.asarray(index, np.int64)
        return (*self._side("source", index, limit), *self._side("target", index, limit))

    def pieces(self, side: str, limit: int | None = None) -> list[list[int]]:
        """Every pair's pieces of one side, as lists (tests and small corpora only)."""
        flat, lengths = self._side(side, np.arange(len(self)), limit)
        return [row.tolist() for row in np.split(flat, np.cumsum(lengths)[:-1])] if len(self) else []
