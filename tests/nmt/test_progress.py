"""nmt.progress (common.progress_bars): a tqdm bar in a log file gives one line per redraw and no line of blanks; on a
terminal, tqdm's own, with the log records above it."""

import io
import logging
import sys

import pytest
from tqdm import tqdm

from nmt.progress import LOG_INTERVAL, LogLines, bar_file, bar_interval, bar_settings, logs_above_bars


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_in_a_log_writes_lines_and_no_erase():
    log = io.StringIO()
    file = bar_file(log)
    assert isinstance(file, LogLines) and bar_interval(log) == LOG_INTERVAL
    with tqdm(total=3, desc="translating", unit="batch", leave=False, file=file, mininterval=0) as bar:
        for _ in range(3):
            bar.update(1)
    lines = log.getvalue().split("\n")
    assert lines[-1] == ""  # every write ends its line
    lines = lines[:-1]
    assert lines[0].startswith("translating:   0%") and lines[-1].startswith("translating: 100%")
    assert len(lines) == 4 and all("\r" not in line and line.strip() for line in lines)
    assert [line.split("|")[-1].split()[0] for line in lines] == ["0/3", "1/3", "2/3", "3/3"]


def test_on_a_terminal_tqdm_draws_in_place():
    terminal = Terminal()
    assert bar_file(terminal) is terminal and bar_interval(terminal) == 0.1
    assert isinstance(bar_file(io.StringIO()), LogLines)  # isatty False


def test_the_training_bar_ends_at_the_step_limit_a_resume_raised():
    """A run planned for 6 steps (max_steps alone) resumed with max_steps 12: the bar's total is 12 (before
    2026-12-07c it stayed 6, reached 100% at step 6 and lost its total and ETA; found by a review). With a time
    budget, the plan is the end (the step limit once past it)."""
    from types import SimpleNamespace

    from nmt.progress import train_bar_total

    def train(max_steps, max_minutes):
        return SimpleNamespace(max_steps=max_steps, max_minutes=max_minutes)

    assert train_bar_total(train(12, 0), planned=6, step=3) == 12
    assert train_bar_total(train(0, 30.0), planned=900, step=3) == 900
    assert train_bar_total(train(2000, 30.0), planned=900, step=950) == 2000
    assert train_bar_total(train(0, 30.0), planned=0, step=3) is None  # the plan not made yet


def test_bar_settings_are_the_file_and_interval_of_the_stream():
    log, terminal = io.StringIO(), Terminal()
    settings = bar_settings(log)
    assert isinstance(settings["file"], LogLines) and settings["file"].stream is log
    assert settings["mininterval"] == LOG_INTERVAL
    assert bar_settings(terminal, terminal=2.0) == {"file": terminal, "mininterval": 2.0}


def _train_with_a_record(stream) -> str:
    """A bar on `stream` (as sys.stderr, the root logger's console handler on it) and a record logged during it,
    inside `logs_above_bars` as train.py runs the trainer: what `stream` got."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stderr", stream)
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        root = logging.getLogger()
        patch.setattr(root, "handlers", [console])
        patch.setattr(root, "level", logging.INFO)
        with logs_above_bars():
            # on a terminal the console records go through tqdm; in a log the handlers stay as they were
            assert (root.handlers == [console]) is not stream.isatty()
            with tqdm(total=3, desc="train", file=bar_file(), mininterval=0) as bar:
                bar.update(1)
                logging.getLogger("nmt.train").info("saved checkpoint ckpt-1")
                bar.update(2)
        assert root.handlers == [console]
    return stream.getvalue()


def test_on_a_terminal_log_records_go_above_the_bar_and_in_a_log_as_before():
    """train.py on a terminal: the trainer's log records start a line of their own, the bar erased before and drawn
    again after (before: "train:  33%|...| 1/3 [...]INFO: saved checkpoint", glued onto the bar; found by a review).
    In a log file the records and the bar's lines are whole lines, as before."""
    shown = _train_with_a_record(Terminal())
    (line,) = [line for line in shown.split("\n") if "saved checkpoint" in line]
    before, record = line.rsplit("\r", 1)
    assert record == "INFO: saved checkpoint ckpt-1" and before.split("\r")[-1].strip() == "", repr(shown)
    assert shown.split("\n")[-2].split("\r")[-1].startswith("train: 100%|"), repr(shown)
    logged = _train_with_a_record(io.StringIO()).split("\n")
    assert "\r" not in "".join(logged) and logged[-1] == "", logged
    assert [line.split(":")[0] for line in logged[:-1]] == ["train", "train", "INFO", "train", "train"], (
        logged
    )
    assert logged[2] == "INFO: saved checkpoint ckpt-1" and logged[-2].startswith("train: 100%|"), logged


def test_no_console_handler_no_redirect(monkeypatch):
    """Without a handler on stderr (pytest's own, a log file only) the context adds none: no record appears that
    did not before."""
    monkeypatch.setattr(sys, "stderr", Terminal())
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [logging.StreamHandler(io.StringIO())])
    before = list(root.handlers)
    with logs_above_bars():
        assert root.handlers == before
