"""Line streaming for the CLIs: bytes in, clean text lines out, one output line per input line.

Input is read as bytes and split on b"\\n" only (never on the other characters `str.splitlines` treats as line
breaks), so the line count is the one `wc -l` sees. Each line is decoded as UTF-8 with errors="replace"; NUL bytes
are dropped, and so is a UTF-8 byte order mark at the start of the input (utf-8-sig). Problems are reported through a `warn(line_number, kind, message)` callback, never silently.
Output lines are made single-line (`one_line`) so that a translation can never add or remove a line.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO, TypeVar

from common.os_errors import named

T = TypeVar("T")

# Everything str.splitlines() (and so most line readers) would treat as a line break.
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")

Warn = Callable[[int, str, str], None]  # (1-based line number, kind, message)


def decode_line(raw: bytes, line_number: int = 0, warn: Warn | None = None) -> str:
    """One raw input line (with or without its newline) -> text without the line ending.

    Invalid UTF-8 becomes U+FFFD and NUL bytes are removed, each with a warning naming the line (1-based).
    """
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if b"\x00" in raw:
        count = raw.count(b"\x00")
        raw = raw.replace(b"\x00", b"")
        if warn is not None:
            warn(line_number, "nul", f"removed {count} NUL byte(s)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        if warn is not None:
            warn(
                line_number, "utf8", f"invalid UTF-8 at byte {err.start} ({err.reason}); replaced with U+FFFD"
            )
        return raw.decode("utf-8", errors="replace")


def read_lines(stream: BinaryIO, warn: Warn | None = None) -> Iterator[str]:
    """Yields the decoded lines of a binary stream, lazily (memory bounded by the longest line).

    The stream is read once (a pipe works); a UTF-8 byte order mark at its start is dropped.
    """
    for number, raw in enumerate(iter(stream.readline, b""), start=1):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        yield decode_line(raw, number, warn)


def one_line(text: str) -> str:
    """A translation made safe for line-oriented output: no line breaks, no surrounding whitespace."""
    return _LINE_BREAKS.sub(" ", text).strip()


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Groups an iterable into lists of at most `size` items (the last one may be shorter)."""
    if size < 1:
        raise ValueError(f"chunk size must be positive, got {size}")
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def count_lines(path: str | os.PathLike) -> int:
    """Number of lines in a file as `read_lines` yields them (a last line without newline counts), in O(1) memory.

    It reads the file: only for regular files (`count_lines_if_file`), never a pipe that is to be read afterwards.
    """
    count = 0
    last = b"\n"
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def count_lines_if_file(path: str | os.PathLike | None) -> int | None:
    """`count_lines(path)` for a regular file; None for stdin ("-", None) or a pipe, FIFO or device (read only once)."""
    if path is None or str(path) == "-" or not os.path.isfile(path):
        return None
    return count_lines(path)


def open_input(path: str | os.PathLike | None) -> BinaryIO:
    """A binary handle on an input path; None or "-" is stdin (closing it leaves stdin open)."""
    if path is None or str(path) == "-":
        return open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115
    return open(path, "rb")  # noqa: SIM115


# A descriptor's own link, whatever the descriptor is open on (a regular file too): /proc/<pid|self>/fd/N (also a
# thread's, under task/<tid>), /dev/fd/N, /dev/stdin, /dev/stdout, /dev/stderr; the folders' links resolved first.
_DESCRIPTOR_LINK = re.compile(
    r"/proc/(\d+|self|thread-self)(/task/\d+)?/fd/[^/]+|/dev/fd/[^/]+|/dev/std(in|out|err)"
)


def _descriptor_link(path: str) -> str | None:
    """The descriptor's link `path` is or links through (as `_DESCRIPTOR_LINK` spells it), else None."""
    link = os.path.abspath(path)
    # the kernel's own limit on a chain of links
    for _ in range(40):
        # the folder as the kernel sees it: /dev/fd/1 is /proc/<pid>/fd/1
        link = os.path.join(os.path.realpath(os.path.dirname(link)), os.path.basename(link))
        if _DESCRIPTOR_LINK.fullmatch(link):
            return link
        if not os.path.islink(link):
            break
        link = os.path.join(os.path.dirname(link), os.readlink(link))
    return None


def written_in_place(path: str) -> bool:
    """Whether `path` must be opened and written as it is, not replaced through a temporary file: it is, or links
    through, a descriptor's link (`/dev/stdout`, `/dev/fd/3`, `/proc/self/fd/1`: a rename would replace the link, not
    write the file the descriptor is open on), or it exists and is not a regular file (a FIFO, a terminal,
    /dev/null). A regular file anywhere, /dev/shm too, is replaced whole."""
    if _descriptor_link(path) is not None:
        return True
    return os.path.exists(path) and not os.path.isfile(path)


def own_descriptor(path: str) -> int | None:
    """The number of this process's open descriptor `path` names (`/dev/fd/3`, `/proc/self/fd/3`, `/dev/stdout`),
    else None: written through that descriptor, its file position shared (`3>>file` keeps what was written before,
    and what is written after follows), not through a second opening of its file."""
    link = _descriptor_link(path)
    if link is None:
        return None
    if standard := re.fullmatch(r"/dev/std(in|out|err)", link):
        number = ("in", "out", "err").index(standard[1])
    else:
        found = re.fullmatch(r"/proc/(\d+|self|thread-self)(/task/\d+)?/fd/(\d+)", link)
        if found is None or found[1] not in ("self", "thread-self", str(os.getpid())):
            return None
        number = int(found[3])
    try:
        os.fstat(number)
    except OSError:
        return None
    return number


def standard_stream(path: str):
    """sys.stdout or sys.stderr if `path` is the file that stream's descriptor is open on (`/dev/stdout`, or a
    terminal both are on), else None. Written through the stream itself, at its position and with its mode (a file
    `>>` appends to), not through a second opening of the file that would truncate it or be overwritten by it."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    for stream in (sys.stdout, sys.stderr):
        try:
            if os.path.samestat(info, os.fstat(stream.fileno())):
                return stream
        # closed (None), or not on a descriptor (a test's capture)
        except (AttributeError, OSError, ValueError):
            continue
    return None


class LineWriter:
    """Writes one line per item to a path (through a temporary file renamed at `close`) or to stdout.

    A file is only replaced once everything has been written: an interrupted run, or a failed rename, leaves no
    half-written output under the final name and no temporary file. A symbolic link to a file stays a link: the file
    it names is replaced. Paths written in place (`written_in_place`: `/dev/stdout`, a FIFO, a device) are appended
    to, and the file of stdout or stderr (`standard_stream`) is written through that stream, never closed.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = None if path is None or str(path) == "-" else os.fspath(path)
        self._tmp: str | None = None
        # a standard stream's buffer: flushed at close, left open
        self._borrowed = False
        if self.path is None:
            self._borrow(sys.stdout)
        elif written_in_place(self.path):
            stream = standard_stream(self.path)
            if stream is not None:
                self._borrow(stream)
            elif (number := own_descriptor(self.path)) is not None:
                # the descriptor itself (its position moves with the lines), left open at close
                self._handle = open(number, "wb", closefd=False)  # noqa: SIM115
            else:
                self._handle = open(self.path, "ab")  # noqa: SIM115
        else:
            # the file a link names (a dangling link: the name it gives)
            self.path = os.path.realpath(self.path)
            directory = os.path.dirname(self.path)
            # the name cut: a legal 255-byte output name must not make an illegal temporary one
            name = (
                os.path.basename(self.path).encode("utf-8", "surrogateescape")[:128].decode("utf-8", "ignore")
            )
            self._tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
            self._handle = open(self._tmp, "wb")  # noqa: SIM115
            # a file replaced keeps its permissions (e.g. 600); best effort (a new file, a filesystem without modes)
            with contextlib.suppress(OSError):
                os.chmod(self._tmp, stat.S_IMODE(os.stat(self.path).st_mode))

    def _borrow(self, stream) -> None:
        # what the stream's text layer holds goes first
        stream.flush()
        self._handle = stream.buffer
        self._borrowed = True

    def write(self, line: str) -> None:
        self._write(one_line(line).encode("utf-8") + b"\n")

    def write_fields(self, fields: Iterable[str]) -> None:
        """One line of tab-separated fields, each made single-line without tabs; empty fields keep their place."""
        self._write("\t".join(one_line(field).replace("\t", " ") for field in fields).encode("utf-8") + b"\n")

    def _write(self, data: bytes) -> None:
        try:
            self._handle.write(data)
        except OSError as err:
            self._raise_named(err)
            raise

    def flush(self) -> None:
        try:
            self._handle.flush()
        except OSError as err:
            self._raise_named(err)
            raise

    def _raise_named(self, err: OSError) -> None:
        """A failed write (a full disk) raised again naming the output, which the OS error of a write does not."""
        if self.path is not None and (error := named(err, self.path)) is not err:
            raise error from err

    def close(self, success: bool = True) -> None:
        if self._borrowed:
            self._handle.flush()
            return
        tmp, self._tmp = self._tmp, None
        try:
            try:
                self._handle.close()
            except OSError as err:
                self._raise_named(err)
                raise
            if success and tmp is not None:
                os.replace(tmp, self.path)
                tmp = None
        finally:
            # not renamed (a failure, a full disk at the last write, a rename refused): removed, the error kept
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def __enter__(self) -> LineWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(success=exc_type is None)
