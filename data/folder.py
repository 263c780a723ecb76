"""A `folder` corpus: `<lang>.<split>.txt` files, one sentence per line, line-aligned across languages.

Read here line by line, in bounded memory (TFDS's TranslateFolder would load every split of every language into
memory), split on "\\n" only (never on U+2028 or other Unicode breaks), "\\r\\n" and a leading BOM accepted.
Only the files of the configured source and target languages are read. Every problem is a `DataError` naming the
file: a file not named `<lang>.<split>.txt` (hidden files are ignored), a missing language or split, files of one split that are not
line-aligned (one ends before the other: truncated?), a file that cannot be read or is UTF-16/32 (with or without a byte-order mark) or gzip. A line over
MAX_LINE_BYTES is read cut (cleaning drops it), so a file without newlines stays in bounded memory too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

from data.cleaning import MAX_LINE_BYTES
from data.config import DataConfig
from data.errors import DataError

FILE_NAME = re.compile(r"^([^.]+)\.([^.]+)\.txt$")  # <lang>.<split>.txt
BOM = b"\xef\xbb\xbf"
log = logging.getLogger(__name__)


def listing(cfg: DataConfig) -> dict[str, dict[str, Path]]:
    """split -> language -> file, for every file of data.folder (names checked)."""
    if not cfg.folder:
        raise DataError("data.dataset: folder needs data.folder, a folder of <lang>.<split>.txt files")
    folder = Path(cfg.folder).expanduser().resolve()
    if not folder.is_dir():
        raise DataError(f"data.folder={folder}: no such directory")
    splits: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):  # hidden files (.DS_Store, markers) are not corpus files
            continue
        match = FILE_NAME.match(path.name)
        if not path.is_file() or not match:
            raise DataError(
                f"{path}: data.folder must hold only files named <lang>.<split>.txt (e.g. en.train.txt)"
            )
        lang, split = match.groups()
        splits.setdefault(split, {})[lang] = path
    if not splits:
        raise DataError(f"data.folder={folder} is empty: expected files named <lang>.<split>.txt")
    return splits


def split_files(cfg: DataConfig, split: str) -> tuple[Path, Path]:
    """The source and target files of `split`; `DataError` naming what is missing."""
    splits = listing(cfg)
    languages = sorted({lang for files in splits.values() for lang in files})
    for key, lang in (("data.source", cfg.source), ("data.target", cfg.target)):
        if lang not in languages:
            raise DataError(
                f"{key}={lang!r}: language not in data.folder={cfg.folder} (it has: {', '.join(languages)})"
            )
    folder = Path(cfg.folder).expanduser().resolve()
    files = splits.get(split, {})
    for lang in (cfg.source, cfg.target):
        if lang not in files:
            present = ", ".join(sorted(p.name for f in splits.values() for p in f.values()))
            raise DataError(
                f"{folder / f'{lang}.{split}.txt'}: no such file for split {split!r} (data.folder has: {present})"
            )
    return files[cfg.source], files[cfg.target]


# What a text file must not start with: its encoding or compression named in the error, with the command to fix it.
NOT_UTF8 = (
    (b"\xff\xfe", "UTF-16 (or UTF-32) text (byte-order mark FF FE)", "iconv -f UTF-16 -t UTF-8"),
    (b"\xfe\xff", "UTF-16 text (byte-order mark FE FF)", "iconv -f UTF-16 -t UTF-8"),
    (b"\x1f\x8b", "gzip-compressed", "gunzip"),
)


def _open(path: Path):
    """The file opened for reading bytes; `DataError` naming it if it cannot be read or is not UTF-8 text."""
    try:
        handle = open(path, "rb")
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from err
    try:
        head = handle.peek(4)[:4]
    except OSError as err:
        handle.close()
        raise DataError(f"cannot read {path}: {err}") from err
    for magic, kind, fix in NOT_UTF8:
        if head.startswith(magic):
            handle.close()
            raise DataError(
                f"{path} is {kind}, not UTF-8 text: convert it (e.g. {fix}) and give the .txt file"
            )
    if b"\x00" in head:  # no text has NUL bytes; UTF-16/32 without a byte-order mark has one in every 2 or 4
        handle.close()
        raise DataError(
            f"{path} starts with NUL bytes: UTF-16 or UTF-32 text without a byte-order mark, not UTF-8 text: "
            "convert it (e.g. iconv -f UTF-16LE -t UTF-8) and give the .txt file"
        )
    return handle


def _lines(path: Path) -> Iterator[bytes]:
    """Its lines without "\n" / "\r\n" (and the first without a BOM); a line over MAX_LINE_BYTES is cut just
    past the limit (cleaning drops it) and its rest skipped unread into memory: a file without newlines stays in
    bounded memory."""
    limit = MAX_LINE_BYTES + 2  # room for "\r\n": a line of the limit exactly is whole
    with _open(path) as handle:
        try:
            first = True
            while line := handle.readline(limit):
                if not line.endswith(b"\n") and len(line) == limit:  # over-long: skip to its end
                    while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
                        pass
                line = line.rstrip(b"\n").removesuffix(b"\r")
                yield line.removeprefix(BOM) if first else line
                first = False
        except OSError as err:
            raise DataError(f"cannot read {path}: {err}") from err


def stream(cfg: DataConfig, split: str, chunk: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """(sources, targets) lists of raw bytes, at most `chunk` pairs each, in file order."""
    source_path, target_path = split_files(cfg, split)
    sources, targets, line = [], [], 0
    source_lines, target_lines = _lines(source_path), _lines(target_path)
    while True:
        source, target = next(source_lines, None), next(target_lines, None)
        if source is None or target is None:
            if source is not None or target is not None:
                short, long = (target_path, source_path) if target is None else (source_path, target_path)
                raise DataError(
                    f"{short} ends after {line} lines but {long} goes on: the files of split {split!r} must be "
                    "line-aligned (is one of them truncated?)"
                )
            break
        line += 1
        sources.append(source)
        targets.append(target)
        if len(sources) == chunk:
            yield sources, targets
            sources, targets = [], []
    if sources:
        yield sources, targets


def count_lines(path: Path) -> int:
    """Lines of a file (a last line without "\\n" counts), fast."""
    count, last = 0, b"\n"
    with _open(path) as handle:
        try:
            while block := handle.read(1 << 24):
                count += block.count(b"\n")
                last = block[-1:]
        except OSError as err:
            raise DataError(f"cannot read {path}: {err}") from err
    return count + (last != b"\n")


def sizes(cfg: DataConfig) -> dict[str, int]:
    """split -> pairs, for every split with both languages; `DataError` if the two files of a split the config
    names (data.train_split, validation_split, test_split) differ in lines, a warning for any other split."""
    result = {}
    for split, files in listing(cfg).items():
        if cfg.source not in files or cfg.target not in files:
            continue
        source, target = count_lines(files[cfg.source]), count_lines(files[cfg.target])
        if source != target:
            message = (
                f"{files[cfg.target]} has {target} lines but {files[cfg.source]} has {source}: the files of split "
                f"{split!r} must be line-aligned"
            )
            if split in (cfg.train_split, cfg.validation_split, cfg.test_split):
                raise DataError(message)
            log.warning("%s (left out: no data.*_split names it)", message)
            continue
        result[split] = source
    if not result:
        split_files(cfg, cfg.train_split)  # raises, naming the missing language or file
    return result
