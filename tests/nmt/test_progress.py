"""nmt.progress: a tqdm bar in a log file gives one line per redraw and no line of blanks; on a terminal, tqdm's own."""

import io

from tqdm import tqdm

from nmt.progress import LOG_INTERVAL, LogLines, bar_file, bar_interval


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
