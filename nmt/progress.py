"""Progress bars (tqdm) that read well in a log file too, and the training bar's total.

`bar_file`, `bar_interval`, `bar_settings` and `logs_above_bars` live in `common.progress_bars` (generic: the `data`
package may use them too) and are re-exported here. On a terminal a bar redraws itself in place; in a file or a pipe
each redraw is a line of its own, every `LOG_INTERVAL` seconds, without tqdm's carriage returns or closing blanks.
"""

from __future__ import annotations

from common.progress_bars import LOG_INTERVAL, LogLines, bar_file, bar_interval, bar_settings, logs_above_bars

__all__ = [
    "LOG_INTERVAL",
    "LogLines",
    "bar_file",
    "bar_interval",
    "bar_settings",
    "logs_above_bars",
    "train_bar_total",
]


def train_bar_total(train, planned: int, step: int) -> int | None:
    """The training progress bar's last step: train.max_steps without a time budget (a resume may raise it past the
    plan, which stays the checkpoint's), else the time budget's plan (the step limit once past it)."""
    if train.max_steps and not train.max_minutes:
        return train.max_steps
    return (max(planned, train.max_steps) if step >= planned else planned) or None
