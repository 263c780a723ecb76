"""Prepared (tokenized) splits on disk: flat token arrays with offsets and a length index, read at any position.

One directory per split:

    source.values   the source pieces of every pair, concatenated (uint16 if the vocabulary fits, else int32)
    source.offsets  int64 (N + 1,): pair i is values[offsets[i]:offsets[i + 1]]
    target.values, target.offsets   likewise
    lengths         uint16 (N, 2): pieces per (source, target), saturated at 65535 (the length index)
    manifest.json   pairs, dtypes, drop counts, key inputs; written last: the split is complete iff it exists

Written in chunks by `SplitWriter` (memory bounded by one chunk), read by `PreparedSplit`: small splits are loaded
into memory; larger ones keep the length index memory-mapped (read whole, once, to plan epochs) and read the pairs
of each batch from the token and offset files with `os.pread` (`ArrayFile`). Why not map those too: every page a
memory map touches stays in the process's resident set, and the kernel maps 64 KB around each fault, so random
batches over a mapped 700 MB cache grow RSS by up to 700 MB within a few hundred steps (reclaimable page cache, but
counted in RSS and in memory limits); with `pread` the pages stay in the page cache, outside the process, and RSS
does not grow with the corpus. Pieces carry no special tokens (no BOS, no EOS).
"""

from __future__ import annotations

import json
import mmap
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
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path} is unreadable ({err}): delete {directory} and prepare again") from err
    if problem := _manifest_problem(manifest):
        raise DataError(f"{path} is damaged ({problem}): delete {directory} and prepare again")
    return manifest


def _manifest_problem(manifest) -> str:
    """What is wrong with a manifest's shape (its counts and dtype are what the readers use), or ""."""
    if not isinstance(manifest, dict):
        return f"a {type(manifest).__name__}, not an object"

    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not count(manifest.get("pairs")):
        return f"pairs: {manifest.get('pairs')!r}"
    if manifest.get("dtype") not in (np.dtype(np.uint16).name, np.dtype(np.int32).name):
        return f"dtype: {manifest.get('dtype')!r}"
    pieces = manifest.get("pieces")
    if not isinstance(pieces, dict) or not all(count(pieces.get(side)) for side in SIDES):
        return f"pieces: {pieces!r}"
    return ""


class ArrayFile:
    """A flat array file read at any position with `os.pread` (positionless: safe from several threads).

    `read(starts, counts)`: the elements [start, start + count) of each (start, count), concatenated.
    """

    def __init__(self, path: Path, dtype: np.dtype, size: int):
        self.path, self.dtype, self.size = Path(path), np.dtype(dtype), size
        self._fd = os.open(self.path, os.O_RDONLY)
        if hasattr(os, "posix_fadvise"):  # random reads: no readahead of neighbouring data on a cold cache
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)

    def __len__(self) -> int:
        return self.size

    def read(self, starts, counts) -> np.ndarray:
        """(sum(counts),) elements; `counts` may be one number for every start."""
        starts = np.asarray(starts, np.int64).tolist()
        counts = [int(counts)] * len(starts) if np.isscalar(counts) else np.asarray(counts, np.int64).tolist()
        size, fd, pread = self.dtype.itemsize, self._fd, os.pread
        data = b"".join([pread(fd, count * size, start * size) for start, count in zip(starts, counts)])
        if len(data) != sum(counts) * size:
            raise DataError(
                f"{self.path} is shorter than its manifest says: delete {self.path.parent} and prepare again"
            )
        return np.frombuffer(data, self.dtype)

    def __getitem__(self, position: int):
        return self.read([position % self.size], 1)[0]

    def __del__(self):
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)


CHECK_CHUNK = 1 << 22  # elements per read when checking a split's files (32 MB of offsets)


def _chunks(array, start: int = 0, stop: int | None = None):
    """(position, elements) of `array[start:stop]` (numpy or `ArrayFile`), CHECK_CHUNK elements at a time."""
    stop = len(array) if stop is None else stop
    for position in range(start, stop, CHECK_CHUNK):
        count = min(CHECK_CHUNK, stop - position)
        if isinstance(array, ArrayFile):
            yield position, array.read([position], count)
        else:
            yield position, np.asarray(array[position : position + count])


def check_contents(
    directory: Path, arrays: dict, manifest: dict, vocab: dict[str, int] | None = None
) -> None:
    """Raises DataError naming the file unless the split's arrays are consistent: per side, offsets that start
    at 0, never decrease and end at the manifest's piece count, lengths in the length index equal to the offsets'
    differences (saturated), and (with `vocab`) piece ids in [0, vocab[side]).

    A file of the right size with other bytes in it (a disk fault, an edit) would otherwise reach the model as
    out-of-range ids (an error deep in TensorFlow on CPU, silently zero embeddings on a GPU) or negative lengths.
    Offsets and lengths (8 + 4 bytes a pair) are read once, in chunks. Piece ids are checked here when the split is
    in memory; read from their files (a large corpus: most of the cache's bytes), they are checked as each batch
    reads them (`PreparedSplit.gather`), so opening never reads the whole corpus.
    """

    def corrupt(name: str, what: str) -> DataError:
        return corrupt_file(directory / name, what)

    lengths = arrays["lengths"]
    for column, side in enumerate(SIDES):
        offsets, name = arrays[f"{side}.offsets"], f"{side}.offsets"
        if int(offsets[0]) != 0 or int(offsets[len(offsets) - 1]) != manifest["pieces"][side]:
            raise corrupt(name, f"it does not span {side}.values")
        previous = 0
        for position, chunk in _chunks(offsets, 1):
            steps = np.diff(chunk, prepend=previous)
            if np.any(steps < 0):
                raise corrupt(name, f"offset {position + int(np.argmax(steps < 0))} decreases")
            indexed = np.asarray(lengths[position - 1 : position - 1 + len(chunk), column])
            if not np.array_equal(np.minimum(steps, MAX_INDEXED_LENGTH), indexed):
                raise corrupt("lengths", f"{side} lengths disagree with {name}")
            previous = int(chunk[-1])
        values = arrays[f"{side}.values"]
        if vocab is None or manifest["pieces"][side] == 0 or isinstance(values, ArrayFile):
            continue
        for _, chunk in _chunks(values):
            check_ids(directory / f"{side}.values", chunk, vocab[side])


def check_ids(path: Path, ids: np.ndarray, vocab: int) -> None:
    """DataError naming `path` (and what to do) if a piece id is outside [0, vocab)."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = int(ids.max()) if int(ids.min()) >= 0 else int(ids.min())
        raise corrupt_file(path, f"piece id {bad} outside the vocabulary of {vocab}")


def corrupt_file(path: Path, what: str) -> DataError:
    """The error for a prepared file whose contents are wrong, saying what to do."""
    return DataError(f"{path} is corrupt ({what}): delete {path.parent} and prepare again")


class PreparedSplit:
    """A prepared split, read from its files (or in memory): lengths for planning, `gather` for batches.

    Attributes:
      source_lengths, target_lengths: (N,) pieces per pair (saturated at 65535).
      manifest: the split's manifest.
    """

    def __init__(
        self,
        arrays: dict,
        manifest: dict,
        origin: str = "memory",
        maps: dict[str, mmap.mmap] | None = None,
        vocab: dict[str, int] | None = None,
    ):
        self._arrays = arrays  # numpy arrays, or ArrayFile for the token and offset files read on demand
        self._vocab = vocab  # ids read from files are checked against it batch by batch (`check_contents`)
        self._maps = maps or {}  # the memory maps under some arrays (release_pages)
        self.manifest = manifest
        self.origin = origin
        lengths = arrays["lengths"]
        self.source_lengths, self.target_lengths = lengths[:, 0], lengths[:, 1]

    @classmethod
    def open(
        cls, directory: Path, in_memory: bool | None = None, vocab: dict[str, int] | None = None
    ) -> PreparedSplit:
        """Opens a complete split directory; checks every file's size against the manifest and its contents
        (`check_contents`), naming a bad file.

        Args:
          in_memory: load the arrays into memory (None: when the split is under IN_MEMORY_BYTES); else the
            length index is memory-mapped and the pairs are read from the files on demand (`ArrayFile`).
          vocab: {"source": size, "target": size} of the tokenizer the split was prepared with: every piece id
            must be below it (None: not checked).
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
        arrays, mapped = {}, {}
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
            elif name == "lengths":  # mapped: read whole once to plan; release_pages() unmaps what was read
                with open(path, "rb") as handle:
                    mapped[name] = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
                arrays[name] = np.frombuffer(mapped[name], dt).reshape(shape)
            else:
                arrays[name] = ArrayFile(path, dt, shape[0])
        check_contents(directory, arrays, manifest, vocab)
        return cls(arrays, manifest, origin="memory" if load else "from file", maps=mapped, vocab=vocab)

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

    def release_pages(self) -> None:
        """Drops the mapped length index's pages from this process's resident set (once epochs are planned).

        They stay in the page cache, and reading the lengths again maps them again: nothing changes but the RSS
        (4 bytes per pair: 20 MB at 5M pairs). No-op for splits in memory.
        """
        if not hasattr(mmap, "MADV_DONTNEED"):  # not Linux or macOS
            return
        for mapping in self._maps.values():
            mapping.madvise(mmap.MADV_DONTNEED)

    def _side(self, side: str, index: np.ndarray, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
        offsets, values = self._arrays[f"{side}.offsets"], self._arrays[f"{side}.values"]
        if isinstance(offsets, ArrayFile):
            bounds = offsets.read(index, 2).reshape(-1, 2)  # (B, 2): offsets[i], offsets[i + 1]
            starts, ends = bounds[:, 0], bounds[:, 1]
        else:
            starts, ends = offsets[index], offsets[index + 1]
        lengths = ends - starts
        if limit is not None:
            lengths = np.minimum(lengths, limit)
        if isinstance(values, ArrayFile):
            flat = values.read(starts, lengths)
            if self._vocab is not None:
                check_ids(values.path, flat, self._vocab[side])
        else:
            total = int(lengths.sum())
            # position of every gathered piece: its pair's start + its rank inside the pair
            first = np.cumsum(lengths) - lengths
            positions = np.repeat(starts - first, lengths) + np.arange(total, dtype=np.int64)
            flat = values[positions]
        return flat.astype(np.int32), lengths.astype(np.int64)

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
