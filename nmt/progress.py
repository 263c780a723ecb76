"""Progress bars (tqdm) that read well in a log file too.

On a terminal a bar redraws itself in place. Where stderr is a file or a pipe (a batch job's log, `nohup`), tqdm's
redraws are joined by carriage returns into one endless line, and its closing erase leaves a line of blanks:
`bar_file` there gives tqdm a file that turns each redraw into a line of its own and drops the erase, and
`bar_interval` spaces the redraws (a line every 30 s).
"""

from __future__ import annotations

import sys

LOG_INTERVAL = 30.0  # seconds between two lines of a bar in a log


class LogLines:
    """A file for tqdm that writes each redraw as a line (tqdm starts each with a carriage return)."""

    def __init__(self, stream):
        self.stream = stream
        self.encoding = getattr(stream, "encoding", "utf-8")

    def write(self, text: str) -> None:
        for part in text.split("\r"):
            if part.strip():  # the erase of a closing bar is blanks only
                self.stream.write(part.rstrip() + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def bar_file(stream=None):
    """`stream` (default: sys.stderr) on a terminal, else a `LogLines` over it."""
    stream = stream or sys.stderr
    return stream if _terminal(stream) else LogLines(stream)


def bar_interval(stream=None, terminal: float = 0.1) -> float:
    """tqdm's `mininterval`: `terminal` seconds on a terminal, `LOG_INTERVAL` in a log."""
    return terminal if _terminal(stream or sys.stderr) else LOG_INTERVAL


def train_bar_total(train, planned: int, step: int) -> int | None:
    """The training progress bar's last step: train.max_steps without a time budget (a resume may raise it past the
    plan, which stays the checkpoint's), else the time budget's plan (the step limit once past it)."""
    if train.max_steps and not train.max_minutes:
        return train.max_steps
    return (max(planned, train.max_steps) if step >= planned else planned) or None
