"""nmt.publish: a directory written whole, an older one kept until the new one is in, leftovers of killed runs."""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.publish import publish_directory, staging_directory


def write(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    (directory / "sub").mkdir(exist_ok=True)
    (directory / "sub" / "x").write_text(files["MARKER"])


def contents(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


OLD = {"MARKER": "old", "a.bin": "old a", "only_old": "1"}
NEW = {"MARKER": "new", "a.bin": "new a", "only_new": "2"}


def publish(output: Path, files: dict[str, str]) -> None:
    staging = staging_directory(output, "MARKER")
    try:
        write(staging, files)
        publish_directory(staging, output, last="MARKER")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_new_directory_is_renamed_into_place(tmp_path):
    output = tmp_path / "export"
    staging = staging_directory(output, "MARKER")
    assert staging.parent == tmp_path and not staging.exists()
    publish(output, NEW)
    assert contents(output) == contents_of(NEW) and sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def contents_of(files: dict[str, str]) -> dict[str, str]:
    return {**files, "sub/x": files["MARKER"]}


def test_an_existing_export_is_replaced_in_place_through_staging_inside_it(tmp_path):
    """Inside it: on its filesystem (a mount point, a symlink elsewhere), so every move is a rename."""
    output = tmp_path / "export"
    write(output, OLD)
    inode = output.stat().st_ino
    assert staging_directory(output, "MARKER").parent == output
    publish(output, NEW)
    assert contents(output) == contents_of(NEW)
    assert output.stat().st_ino == inode and sorted(p.name for p in tmp_path.iterdir()) == ["export"]


@pytest.mark.parametrize("failing_move", [0, 2, 3])
def test_a_failed_move_puts_the_old_export_back(tmp_path, monkeypatch, failing_move):
    """EXDEV (a staging directory on another filesystem) or Ctrl-C in the middle of the moves: the older export is
    whole again, nothing of the new one left in it."""
    output = tmp_path / "export"
    write(output, OLD)
    rename = Path.rename
    moves = []

    def flaky(self, target):
        if Path(self).parent.name.startswith(".partial-"):  # a move of a new entry into the export
            moves.append(self.name)
            if len(moves) > failing_move:
                raise OSError(errno.EXDEV, "Invalid cross-device link")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", flaky)
    with pytest.raises(OSError, match="cross-device"):
        publish(output, NEW)
    monkeypatch.undo()
    assert contents(output) == contents_of(OLD)
    assert sorted(p.name for p in output.iterdir()) == sorted([*OLD, "sub"])
    assert (moves[-1] == "MARKER") == (failing_move == 3)  # the marker moves last


def test_the_marker_leaves_first_and_arrives_last(tmp_path, monkeypatch):
    output = tmp_path / "export"
    write(output, OLD)
    rename = Path.rename
    moves = []

    def record(self, target):
        moves.append((Path(self).parent.name, Path(self).name))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", record)
    publish(output, NEW)
    assert moves[0] == ("export", "MARKER")  # the old export stops being complete before anything moves
    assert moves[-1][1] == "MARKER" and moves[-1][0].startswith(".partial-")
    assert len(moves) == 4 + 1 + 4  # four entries out, the set-aside directory renamed, four in
    assert moves[4][1].startswith(".setting-aside-")


def test_leftovers_of_killed_exports_are_removed_live_ones_kept(tmp_path):
    output = tmp_path / "export"
    write(output, OLD)
    gone, alive = dead_pid(), os.getppid()
    leftovers = [
        tmp_path / f".export.partial-{gone}",  # staging of an export to a new path, killed
        output / f".partial-{gone}",  # staging inside an older export, killed
        output / f".set-aside-{gone}",  # an older export's entries set aside, killed before removing them
        output / f".replaced-{gone}",  # the same, by the code before 2026-12-06
    ]
    kept = [
        tmp_path / f".export.partial-{alive}",
        output / f".partial-{alive}",
        tmp_path / f".other.partial-{gone}",
    ]
    for path in leftovers + kept:
        write(path, NEW)
    staging_directory(output, "MARKER")
    assert [p.exists() for p in leftovers] == [False] * 4
    assert [p.exists() for p in kept] == [True] * 3
    assert contents(output / "sub") == {"x": "old"} and (output / "MARKER").read_text() == "old"
    # A directory that is not an export (no marker, files of its own): nothing in it is touched, the caller refuses
    theirs = tmp_path / "theirs"
    write(theirs / f".partial-{gone}", NEW)
    (theirs / "notes.txt").write_text("mine")
    staging_directory(theirs, "MARKER")
    assert (theirs / f".partial-{gone}" / "MARKER").is_file()


KILLER = """
import os, shutil, signal, sys
from pathlib import Path

sys.path.insert(0, {root!r})
from tests.nmt.test_publish import NEW, publish
from nmt.publish import staging_directory

output, what, kill_at, fail_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
renames, rename, rmtree = [], Path.rename, shutil.rmtree


def killing_rename(self, target):  # SIGKILL instead of the rename number `kill_at` (from 0); EXDEV at `fail_at`
    if len(renames) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    renames.append(self.name)
    if len(renames) - 1 == fail_at:
        raise OSError(18, "Invalid cross-device link")
    return rename(self, target)


def killing_rmtree(path, *args, **kwargs):  # SIGKILL instead of removing the old export's set-aside entries
    if Path(path).name.startswith(".set-aside-") and kill_at == -1:
        os.kill(os.getpid(), signal.SIGKILL)
    return rmtree(path, *args, **kwargs)


Path.rename, shutil.rmtree = killing_rename, killing_rmtree
publish(output, NEW) if what == "publish" else staging_directory(output, "MARKER")
"""


def killed(output: Path, what: str, kill_at: int, fail_at: int = -1) -> None:
    """`publish(output, NEW)` or the next export's clean-up (`staging_directory`) in a process SIGKILLed at its
    rename number `kill_at` (-1: when it removes the set-aside old export, after every rename), its rename number
    `fail_at` failing first (EXDEV) if given."""
    script = KILLER.format(root=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run(
        [sys.executable, "-c", script, str(output), what, str(kill_at), str(fail_at)], capture_output=True
    )
    assert done.returncode == -9, done.stderr.decode()[-2000:]


@pytest.mark.parametrize("kill_at", [*range(9), -1])
def test_an_export_killed_during_its_moves_is_undone_by_the_next_one(tmp_path, kill_at):
    """Four old entries go aside (renames 0-3), the set-aside directory is renamed (4), four new entries come in
    (5-8): a SIGKILL before any of them leaves the older export aside in part; the next export puts it back whole
    before anything else (the readers' view: the old export, then the new one), then replaces it."""
    output = tmp_path / "export"
    write(output, OLD)
    killed(output, "publish", kill_at)
    # incomplete from the first move to the last
    assert not (output / "MARKER").exists() or kill_at in (0, -1)
    staging_directory(output, "MARKER")  # what the next export does first
    assert contents(output) == contents_of(NEW if kill_at == -1 else OLD)  # and nothing else (no leftovers)
    publish(output, NEW)
    assert contents(output) == contents_of(NEW)


@pytest.mark.parametrize("kill_at", [*range(5), -1])  # the set-aside directory's rename, 4 new entries
def test_an_export_killed_while_it_moves_into_an_empty_directory_is_undone_by_the_next_one(tmp_path, kill_at):
    """`mkdir x; export.py --output x`: nothing old to set aside, the new entries come in; a SIGKILL among them
    leaves part of the new export, which the next export removes (before 2026-12-06 it was kept, with its staging,
    and every later export refused the directory)."""
    output = tmp_path / "export"
    output.mkdir()
    killed(output, "publish", kill_at)
    staging_directory(output, "MARKER")  # what the next export does first
    assert contents(output) in ({}, contents_of(NEW))  # nothing half there, and no leftovers
    publish(output, NEW)
    assert contents(output) == contents_of(NEW)


@pytest.mark.parametrize("kill_at", range(5))
def test_putting_the_old_export_back_survives_a_kill_of_its_own(tmp_path, kill_at):
    """Killed after two new entries came in; the export that undoes it is killed too, at each of its renames
    (the set-aside directory's, then the four old entries'): the one after it still puts the old export back."""
    output = tmp_path / "export"
    write(output, OLD)
    killed(output, "publish", 7)
    killed(output, "undo", kill_at)
    staging_directory(output, "MARKER")
    assert contents(output) == contents_of(OLD)


@pytest.mark.parametrize("kill_at", range(8, 15))
def test_an_export_killed_while_it_undoes_a_failed_move_is_undone_by_the_next_one(tmp_path, kill_at):
    """The third new entry's move fails (rename 7: EXDEV, or Ctrl-C); the export puts the two new entries back
    into staging (8, 9), renames the set-aside directory back to `.setting-aside-PID` (10), puts the old entries back
    (11-14): a SIGKILL at any of these, then the next export puts the old export back whole (before the rename
    back, its clean-up took the old entries put back for new ones and removed them)."""
    output = tmp_path / "export"
    write(output, OLD)
    killed(output, "publish", kill_at, fail_at=7)
    staging_directory(output, "MARKER")
    assert contents(output) == contents_of(OLD)


def test_old_entries_beside_a_set_aside_directory_are_left_alone(tmp_path):
    """What the code before 2026-12-06 left when killed while setting old entries aside (`.replaced-PID`, its name
    from the start): old and new entries cannot be told apart, so nothing is removed, the old export's own folder
    least of all (the export then refuses the directory, as before)."""
    output = tmp_path / "export"
    write(output, OLD)
    gone = dead_pid()
    write(output / f".partial-{gone}", NEW)
    (output / f".replaced-{gone}").mkdir()
    for name in ("MARKER", "a.bin", "sub"):  # `last` first; `only_old` is not in the new export
        (output / name).rename(output / f".replaced-{gone}" / name)
    before = contents(output)
    staging_directory(output, "MARKER")
    assert contents(output) == before


def test_an_export_whose_undo_was_cut_short_and_whose_staging_went_is_still_put_back(tmp_path):
    """A second Ctrl-C (or SIGTERM, which export.py turns into one) inside the undo of a failed move: the set-aside
    directory is still `.set-aside-PID`, the caller's `finally` removed the staging directory. With no new entry in
    `output`, the next export puts the old one back (before: it removed the set-aside folder as a leftover, the
    whole old export)."""
    output = tmp_path / "export"
    write(output, OLD)
    gone = dead_pid()
    (output / f".set-aside-{gone}").mkdir()
    for name in ("MARKER", "a.bin", "only_old", "sub"):
        (output / name).rename(output / f".set-aside-{gone}" / name)
    staging_directory(output, "MARKER")
    assert contents(output) == contents_of(OLD)


def test_a_killed_export_with_the_pid_of_the_next_one_is_undone(tmp_path, monkeypatch):
    """A container started again gives its processes the same PIDs: the killed export's folders carry the PID of
    the export that finds them (before: skipped as its own, its staging folder removed, the old export stuck)."""
    output = tmp_path / "export"
    write(output, OLD)
    killed(output, "publish", 7)
    pid = int(next(output.glob(".set-aside-*")).name.rsplit("-", 1)[1])
    monkeypatch.setattr(os, "getpid", lambda: pid)
    staging_directory(output, "MARKER")
    assert contents(output) == contents_of(OLD)


def test_a_ctrl_c_during_the_undo_of_a_failed_move_waits_for_the_undo(tmp_path, monkeypatch):
    """The third new entry's move fails, and Ctrl-C comes while the old entries are put back: the signal is held
    until they all are (before, the KeyboardInterrupt cut the undo short, and the caller removed the staging
    directory the next export needed to tell new entries from old)."""
    import signal

    output = tmp_path / "export"
    write(output, OLD)
    rename = Path.rename
    moves = []

    def flaky(self, target):
        moves.append(Path(self).name)
        if len(moves) == 8:  # renames 0-3 old aside, 4 the set-aside directory, 5-6 new in, 7 fails
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        if len(moves) == 10:  # the first new entry back into staging: Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", flaky)
    with pytest.raises(KeyboardInterrupt):
        publish(output, NEW)
    monkeypatch.undo()
    assert contents(output) == contents_of(OLD) and len(moves) == 8 + 2 + 1 + 4
