"""Progress bars (tqdm) that read well in a log file too; generic, for every package (`data`, `nmt`).

On a terminal a bar redraws itself in place. Where stderr is a file or a pipe (a batch job's log, `nohup`), tqdm's
redraws are joined by carriage returns into one endless line, and its closing erase leaves a line of blanks:
`bar_file` there gives tqdm a file that turns each redraw into a line of its own and drops the erase, and
`bar_interval` spaces the redraws (a line every 30 s). On a terminal, `logs_above_bars` writes log records above
the bars instead of gluing them onto one.

    bar = tqdm(total=n, desc="preparing", file=bar_file(), mininterval=bar_interval())
"""

from __future__ import annotations

import contextlib
import logging
import sys

# seconds between two lines of a bar in a log
LOG_INTERVAL = 30.0


class LogLines:
    """A file for tqdm that writes each redraw as a line (tqdm starts each with a carriage return)."""

    def __init__(self, stream):
        self.stream = stream
        self.encoding = getattr(stream, "encoding", "utf-8")

    def write(self, text: str) -> None:
        for part in text.split("\r"):
            # the erase of a closing bar is blanks only
            if part.strip():
                self.stream.write(part.rstrip() + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _terminal(stream) -> bool:
    try:
        return stream.isatty()
    # no isatty, or closed
    except (AttributeError, ValueError):
        return False


def bar_file(stream=None):
    """`stream` (default: sys.stderr) on a terminal, else a `LogLines` over it."""
    stream = stream or sys.stderr
    return stream if _terminal(stream) else LogLines(stream)


def bar_interval(stream=None, terminal: float = 0.1) -> float:
    """tqdm's `mininterval`: `terminal` seconds on a terminal, `LOG_INTERVAL` in a log."""
    return terminal if _terminal(stream or sys.stderr) else LOG_INTERVAL


def logs_above_bars(stream=None):
    """A context in which, on a terminal, the root logger's console records go through `tqdm.write`, above the bars
    instead of glued onto one (`tqdm.contrib.logging.logging_redirect_tqdm`). In a log nothing changes (a bar there
    writes whole lines through `bar_file`), nor without a console handler (none is added)."""
    console = any(
        isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr)
        for handler in logging.getLogger().handlers
    )
    if not (console and _terminal(stream or sys.stderr)):
        return contextlib.nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()


def bar_settings(stream=None, terminal: float = 0.1) -> dict:
    """tqdm's `file` and `mininterval` for a bar on `stream` (default: sys.stderr): `tqdm(..., **bar_settings())`."""
    return {"file": bar_file(stream), "mininterval": bar_interval(stream, terminal)}
