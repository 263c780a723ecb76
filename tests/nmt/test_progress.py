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
