"""Writing a directory whole (the exports): staged next to or inside `output`, then put in place by renames.

    staging = staging_directory(output, last="MARKER")   # not created: the writer makes it
    try:
        write_everything_into(staging)
        publish_directory(staging, output, last="MARKER")
    finally:
        shutil.rmtree(staging, ignore_errors=True)

An existing `output` directory (an older export, or empty) gets the staging directory inside it, so its entries
move in by rename even when `output` is a mount point or a symlink to another filesystem. The older export's
entries are set aside, not deleted, until every new entry is in; if a rename fails (or Ctrl-C comes) they are put
back. Staging left by a killed process (SIGKILL, the OOM killer) is removed by the next export to the same place,
and an export killed in the middle of the moves is undone by it first: the older export is put back whole.

The moves, and what the next export finds if the process is killed in each:

1. the old entries go into `.setting-aside-PID` (`last` first): `output` holds only old entries: they are put back;
2. `.setting-aside-PID` is renamed `.set-aside-PID`: all the old entries are aside;
3. the new entries come in (`last` last): what is in `output` without `last` is new (each moved out of the same
   process's staging directory, which no longer has it: checked) and removed, the old entries are put back (the
   set-aside directory renamed `.setting-aside-PID` first, so that a kill while they are put back is case 1; a
   move that fails is undone the same way, in the process);
4. `.set-aside-PID` is removed: `output` has `last`, the new export is whole: the rest of it is a leftover.

A set-aside directory holding `last` is never removed while `output` has no `last` of its own (it is the only whole
export there), even when the state cannot be undone (`.replaced-PID` of the code before 2026-12-06, whose old and
new entries cannot be told apart): then the caller refuses the directory and nothing is lost.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
from pathlib import Path

_STAGING = "partial"
_SETTING_ASIDE = "setting-aside"  # old entries being set aside (case 1 above)
_SET_ASIDE = "set-aside"  # every old entry aside (cases 2-4)
_LEGACY_SET_ASIDE = "replaced"  # the code before 2026-12-06: old entries went there, case 1 or 3 unknown


def staging_directory(output: Path, last: str) -> Path:
    """The path to write `output`'s new content to (absent; its writer creates it). Leftovers of processes that are
    gone are removed first: next to `output`, and inside it when it is an export (`last` there) or holds nothing
    else (a directory of something else is left as it is, for the caller to refuse)."""
    # No publish of this process is in flight: a folder named after its PID is a killed process's (a container
    # restarted gives its processes the same PIDs again)
    _undo_interrupted_publish(output, last)
    _remove_leftovers(output, last)
    name = f".{_STAGING}-{os.getpid()}"
    staging = output / name if output.is_dir() else output.with_name(f".{output.name}{name}")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def publish_directory(staging: Path, output: Path, last: str) -> None:
    """Puts the complete directory `staging` (from `staging_directory(output, last)`) at `output`: renamed there, or,
    inside an existing directory, moved in entry by entry, `last` (the file that marks it complete) last, after the
    old entries (their `last` first) are set aside. The directory itself stays: a shell standing in it
    (`export.py --output .`) is not left in a deleted directory."""
    if staging.parent != output:
        staging.rename(output)
        return
    set_aside = output / f".{_SETTING_ASIDE}-{os.getpid()}"
    set_aside.mkdir()
    old = [entry for entry in output.iterdir() if entry not in (staging, set_aside)]
    old.sort(key=lambda entry: entry.name != last)
    new = sorted(staging.iterdir(), key=lambda entry: entry.name == last)
    moved_old, moved_new = [], []
    try:
        for entry in old:
            entry.rename(set_aside / entry.name)
            moved_old.append(entry.name)
        set_aside = set_aside.rename(output / f".{_SET_ASIDE}-{os.getpid()}")
        for entry in new:
            entry.rename(output / entry.name)
            moved_new.append(entry.name)
    except BaseException:
        with _signals_held():  # a second Ctrl-C must not cut the undo short (the caller then removes staging)
            _put_back(staging, output, set_aside, moved_new, moved_old)
        raise
    staging.rmdir()
    shutil.rmtree(set_aside)


def _put_back(
    staging: Path, output: Path, set_aside: Path, moved_new: list[str], moved_old: list[str]
) -> None:
    """Undoes the moves of a `publish_directory` that failed: the new entries back into staging, then (the set-aside
    directory renamed `.setting-aside-PID` first: `output` holds no new entry again, case 1 if killed now) the old
    ones back into `output`, `last` last."""
    for name in reversed(moved_new):
        (output / name).rename(staging / name)
    if set_aside.name.startswith(f".{_SET_ASIDE}-"):
        set_aside = set_aside.rename(output / f".{_SETTING_ASIDE}-{os.getpid()}")
    for name in reversed(moved_old):
        (set_aside / name).rename(output / name)
    set_aside.rmdir()


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM noted, then raised again at the end of the block (handlers can only be set in the main
    thread: elsewhere nothing changes). Not the signal mask: another thread of the process (TensorFlow's) would take
    the signal and Python would still interrupt the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = {
        number: signal.signal(number, lambda signum, frame: received.append(signum))
        for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for number, handler in previous.items():  # None: a handler not set from Python (none is, here)
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        for number in received:
            signal.raise_signal(number)


def _undo_interrupted_publish(output: Path, last: str) -> None:
    """Puts back the older export that a killed `publish_directory` had set aside (see the module docstring)."""
    if not output.is_dir() or (output / last).exists():
        return
    pattern = re.compile(rf"\.({_SETTING_ASIDE}|{_SET_ASIDE}|{_LEGACY_SET_ASIDE})-(\d+)")
    matches = [(entry, pattern.fullmatch(entry.name)) for entry in output.iterdir()]
    aside = [
        (entry, match) for entry, match in matches if match and entry.is_dir() and not entry.is_symlink()
    ]
    if len(aside) != 1 or aside[0][1].group(1) == _LEGACY_SET_ASIDE:
        return  # none, or not one we know the state of: left as it is (kept by `_remove_leftovers`)
    set_aside, match = aside[0]
    if not _gone(int(match.group(2)), mine_too=True):
        return  # a live publish
    if not (set_aside / last).exists() and any(set_aside.iterdir()):
        return  # not one of an export (whose `last` was the first entry set aside), nor of an empty `output`
    if match.group(1) == _SET_ASIDE:  # new entries were coming in: they go, `output` then holds only old ones
        leftover = re.compile(rf"\.(?:{_STAGING}|{_SETTING_ASIDE}|{_SET_ASIDE}|{_LEGACY_SET_ASIDE})-\d+")
        arrived = [entry for entry in output.iterdir() if not leftover.fullmatch(entry.name)]
        staging = output / f".{_STAGING}-{match.group(2)}"
        if arrived and (not staging.is_dir() or any((staging / entry.name).exists() for entry in arrived)):
            return  # not entries moved out of that staging: left as it is (the caller refuses the directory)
        for entry in arrived:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        set_aside = set_aside.rename(output / f".{_SETTING_ASIDE}-{match.group(2)}")
    for entry in sorted(set_aside.iterdir(), key=lambda entry: entry.name == last):  # `last` back last
        entry.rename(output / entry.name)
    set_aside.rmdir()


def _remove_leftovers(output: Path, last: str) -> None:
    candidates = []
    if output.parent.is_dir():
        pattern = re.compile(rf"\.{re.escape(output.name)}\.{_STAGING}-(\d+)")
        candidates += [(entry, pattern.fullmatch(entry.name)) for entry in output.parent.iterdir()]
    if output.is_dir():
        complete = (output / last).is_file()
        pattern = re.compile(rf"\.(?:{_STAGING}|{_SETTING_ASIDE}|{_SET_ASIDE}|{_LEGACY_SET_ASIDE})-(\d+)")
        inside = [(entry, pattern.fullmatch(entry.name)) for entry in output.iterdir()]
        if complete or all(match for _, match in inside):
            # never an older export set aside while `output` has no complete one: it is all there is
            candidates += [  # a staging directory was never published: never the only whole export
                (entry, match)
                for entry, match in inside
                if complete or entry.name.startswith(f".{_STAGING}-") or not (entry / last).exists()
            ]
    for entry, match in candidates:
        if match and entry.is_dir() and not entry.is_symlink() and _gone(int(match.group(1)), mine_too=True):
            shutil.rmtree(entry, ignore_errors=True)


def _gone(pid: int, mine_too: bool = False) -> bool:
    """Whether process `pid` has ended; this process's own PID counts as ended with `mine_too` (at the start of a
    publish, when none of its own is in flight)."""
    if pid == os.getpid():
        return mine_too
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False
